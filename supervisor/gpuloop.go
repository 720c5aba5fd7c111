package supervisor

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/supervisor/publish"
)

// gpuLoop reads the GPUs, the kernel's driver faults and telemetry every
// tick, and puts what changed in the node's record (publish.Hardware
// decides what did). It keeps the last GPU reading for the MCP gpu tool.
type gpuLoop struct {
	probe     gpu.Probe
	simulated bool
	every     time.Duration
	// driverFaults and interconnect are Config's (nil: not read).
	driverFaults func(ctx context.Context) (host.DriverFaults, error)
	interconnect func(ctx context.Context) (host.Interconnect, error)
	// runner's engines' memory is this node's, not foreign; with
	// simulated GPUs, their claims are the GPUs' used memory.
	runner interface {
		Shards() []gossip.ShardRecord
		OwnPIDs() []int
	}
	clock clock.Clock
	log   *slog.Logger

	mu   sync.Mutex
	snap gpu.Snapshot // the last reading, under mu
}

// run reads every tick until ctx ends, publishing into rec.
func (g *gpuLoop) run(ctx context.Context, rec publish.Record) {
	hw := publish.NewHardware(rec)
	tick := g.clock.NewTicker(g.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.Chan():
		}
		snap, err := g.probe.Discover(ctx)
		if err != nil {
			g.log.Warn("GPU re-read failed; keeping the last reading", "err", err)
			continue
		}
		local := rec.Local()
		gpus, probes := g.reading(ctx, snap, local.GPUs, local.Probes)
		g.mu.Lock()
		g.snap = snap
		g.mu.Unlock()
		var tel *gossip.Telemetry
		if t, changed := g.telemetry(ctx, hw, local.Telemetry); changed {
			tel = &t
		}
		hw.Publish(local, gpus, probes, tel)
	}
}

// snapshot is the last GPU reading.
func (g *gpuLoop) snapshot() gpu.Snapshot {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.snap
}

// reading is what the record says of the GPUs of snap: memory that is not
// this node's engines' counted as foreign, driver faults marked (prev are
// the GPUs the record holds, probes its summary), and with simulated GPUs
// the engines' claims as used memory.
func (g *gpuLoop) reading(ctx context.Context, snap gpu.Snapshot, prev []placement.GPU, probes gossip.ProbeSummary) ([]placement.GPU, gossip.ProbeSummary) {
	gpus, probes := g.withFaults(ctx, g.foreignAdjusted(snap), prev, probes)
	return g.simulatedClaims(gpus), probes
}

// withFaults marks the GPUs with recent driver faults (all of them for a
// fault that names no GPU) and updates the fault counts in probes. When
// the kernel log cannot be read this time, the marks of the last reading
// (prev) stay: a read error must not make a faulting GPU placeable again.
func (g *gpuLoop) withFaults(ctx context.Context, gpus, prev []placement.GPU, probes gossip.ProbeSummary) ([]placement.GPU, gossip.ProbeSummary) {
	if g.driverFaults == nil {
		return gpus, probes
	}
	f, err := g.driverFaults(ctx)
	if err != nil {
		g.log.Warn("reading driver faults failed; keeping the last fault marks", "err", err)
		for i := range gpus {
			for _, p := range prev {
				if p.UUID == gpus[i].UUID && p.Faulted {
					gpus[i].Faulted = true
				}
			}
		}
		return gpus, probes
	}
	gpus = host.MarkFaulted(gpus, f, g.clock.Now())
	probes.DriverFaultsRecent, probes.DriverFaultsBoot, probes.XidRecent = f.FaultRecent, f.FaultTotal, f.XidRecent
	probes.LastDriverFault, probes.LastDriverFaultAt = "", time.Time{}
	if f.NewestFault != nil {
		probes.LastDriverFault, probes.LastDriverFaultAt = publish.FaultLine(f.NewestFault.Message), f.NewestFault.Time
	}
	return gpus, probes
}

// simulatedClaims fills simulated GPUs' used memory with what this node's
// shards claimed, so nodes, the page and top read like a real cluster's.
// Real GPUs report their own.
func (g *gpuLoop) simulatedClaims(gpus []placement.GPU) []placement.GPU {
	if !g.simulated {
		return gpus
	}
	var claims []gpu.Claim
	for _, s := range g.runner.Shards() {
		for _, i := range s.GPUs {
			claims = append(claims, gpu.Claim{Index: i, Bytes: s.MemoryPerGPU})
		}
	}
	return gpu.WithClaims(gpus, claims)
}

func (g *gpuLoop) foreignAdjusted(s gpu.Snapshot) []placement.GPU {
	own := map[int]bool{}
	for _, p := range g.runner.OwnPIDs() {
		own[p] = true
	}
	return gpu.ForeignMemory(s, own)
}

// telemetry reads GPU activity (when the probe is a gpu.TelemetryReader)
// and interconnect rates when hw says a reading is due, and says whether
// the rounded result differs from what the record holds (cur); see
// publish.Hardware.TelemetryDue for why so seldom.
func (g *gpuLoop) telemetry(ctx context.Context, hw *publish.Hardware, cur gossip.Telemetry) (gossip.Telemetry, bool) {
	now := g.clock.Now()
	if !hw.TelemetryDue(now) {
		return cur, false
	}
	var ts []gpu.Telemetry
	if r, ok := g.probe.(gpu.TelemetryReader); ok {
		var err error
		if ts, err = r.Telemetry(ctx); err != nil {
			g.log.Debug("GPU telemetry read failed", "err", err)
		}
	}
	var links []host.LinkRate
	if g.interconnect != nil {
		ic, err := g.interconnect(ctx)
		if err != nil {
			g.log.Debug("interconnect read failed", "err", err)
		}
		links = ic.Links
	}
	return publish.Telemetry(now, ts, links, cur)
}
