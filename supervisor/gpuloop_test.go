package supervisor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/supervisor/publish"
)

// A GPU with a recent Xid is marked faulted; when the kernel log cannot be
// read the next time, the mark stays (a read error must not make a
// faulting GPU placeable again), and it clears only on a reading without
// the fault.
func TestDriverFaultMarksSurviveAReadError(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	var reading host.DriverFaults
	var readErr error
	g := &gpuLoop{log: slog.New(slog.NewTextHandler(io.Discard, nil)), clock: clock.NewFake(now),
		driverFaults: func(context.Context) (host.DriverFaults, error) { return reading, readErr }}
	fresh := func() []placement.GPU {
		return []placement.GPU{
			{Index: 0, UUID: "GPU-a", PCIBusID: "00000000:18:00.0"},
			{Index: 1, UUID: "GPU-b", PCIBusID: "00000000:2A:00.0"},
		}
	}
	faulted := func(gpus []placement.GPU) []bool {
		out := make([]bool, len(gpus))
		for i, g := range gpus {
			out[i] = g.Faulted
		}
		return out
	}
	xid := host.DriverFault{Time: now.Add(-time.Minute), Message: "NVRM: Xid (PCI:0000:2a:00): 79, GPU has fallen off the bus", Xid: 79, PCI: "0000:2a:00", Fault: true}
	banner := host.DriverFault{Time: now.Add(-time.Second), Message: "NVRM: Persistence mode is deprecated and will be removed in a future release."}
	reading = host.DriverFaults{Window: time.Hour, FaultRecent: 1, FaultTotal: 1, XidRecent: 1, XidTotal: 1, Newest: &banner, NewestFault: &xid, NewestXid: &xid, Faults: []host.DriverFault{xid, banner}}

	gpus, probes := g.withFaults(context.Background(), fresh(), nil, gossip.ProbeSummary{})
	if got := faulted(gpus); got[0] || !got[1] {
		t.Fatalf("after an Xid on GPU 1: faulted = %v, want [false true]", got)
	}
	if probes.DriverFaultsRecent != 1 || probes.XidRecent != 1 || probes.LastDriverFault != xid.Message || !probes.LastDriverFaultAt.Equal(xid.Time) {
		t.Fatalf("probe summary = %+v", probes)
	}

	readErr = errors.New("dmesg: read kernel buffer failed: operation not permitted")
	gpus2, probes2 := g.withFaults(context.Background(), fresh(), gpus, probes)
	if got := faulted(gpus2); got[0] || !got[1] {
		t.Fatalf("after a failed read: faulted = %v, want the last marks [false true]", got)
	}
	if probes2 != probes {
		t.Fatalf("a failed read changed the probe summary: %+v", probes2)
	}

	readErr, reading = nil, host.DriverFaults{Window: time.Hour}
	gpus3, _ := g.withFaults(context.Background(), fresh(), gpus2, probes2)
	if got := faulted(gpus3); got[0] || got[1] {
		t.Fatalf("after a clean reading: faulted = %v, want none", got)
	}
}

// An NVRM error that names no GPU (the seed's NV_ERR_NO_MEMORY) counts
// beside Xids and marks every GPU of the node, simulated ones included:
// they have no PCI address to match, and such a fault may be any GPU's.
func TestNVRMFaultMarksTheWholeNode(t *testing.T) {
	now := time.Date(2026, 8, 27, 22, 40, 0, 0, time.UTC)
	text := "[Thu Aug 27 22:13:26 2026] NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051) returned from _memdescAllocInternal(pMemDesc) @ mem_desc.c:1359\n" +
		"[Thu Aug 27 22:20:02 2026] NVRM: Persistence mode is deprecated and will be removed in a future release.\n"
	g := &gpuLoop{log: slog.New(slog.NewTextHandler(io.Discard, nil)), clock: clock.NewFake(now), simulated: true,
		driverFaults: func(context.Context) (host.DriverFaults, error) {
			return host.ParseDriverFaults(text, now, 30*time.Minute, time.UTC, time.Time{}), nil
		}}
	gpus, probes := g.withFaults(context.Background(), []placement.GPU{{Index: 0, UUID: "GPU-sim-0"}, {Index: 1, UUID: "GPU-sim-1"}}, nil, gossip.ProbeSummary{GPUsSimulated: true})
	for _, g := range gpus {
		if !g.Faulted {
			t.Errorf("GPU %d not marked faulted", g.Index)
		}
	}
	if probes.DriverFaultsRecent != 1 || probes.DriverFaultsBoot != 1 || probes.XidRecent != 0 ||
		!strings.Contains(probes.LastDriverFault, "NV_ERR_NO_MEMORY") || len(probes.LastDriverFault) > gossip.MaxFaultLine {
		t.Errorf("probe summary = %+v", probes)
	}
}

// telemetryGPUs is a GPU probe that also reads telemetry, counting reads.
type telemetryGPUs struct {
	gpu.Simulated
	reads   int
	reading []gpu.Telemetry
}

func (g *telemetryGPUs) Telemetry(context.Context) ([]gpu.Telemetry, error) {
	g.reads++
	return slices.Clone(g.reading), nil
}

// Telemetry is read at most every publish.LoadInterval, rounded, and
// republished only when the rounded values change.
func TestTelemetryIsRoundedAndThrottled(t *testing.T) {
	now := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	gpus := &telemetryGPUs{reading: []gpu.Telemetry{
		{Index: 0, UtilPct: 98, TempC: 58, PowerW: 691.422, HasUtil: true, HasTemp: true, HasPower: true},
		{Index: 1, UtilPct: 2, TempC: 31, HasUtil: true, HasTemp: true},
	}}
	links := []host.LinkRate{{Device: "mlx5_0", Port: 1, Up: true, TxMBps: 1234.5678, RxMBps: 0.04}}
	icReads := 0
	clk := clock.NewFake(now)
	g := &gpuLoop{log: slog.New(slog.NewTextHandler(io.Discard, nil)), clock: clk, probe: gpus,
		interconnect: func(context.Context) (host.Interconnect, error) {
			icReads++
			return host.Interconnect{Links: slices.Clone(links)}, nil
		}}
	hw := publish.NewHardware(nil)
	tel, changed := g.telemetry(context.Background(), hw, gossip.Telemetry{})
	want := gossip.Telemetry{
		GPUs:   []gossip.GPUTelemetry{{Index: 0, UtilPct: 100, TempC: 58, PowerW: 690}, {Index: 1, UtilPct: 0, TempC: 31, NoPower: true}},
		Links:  []gossip.LinkRate{{Device: "mlx5_0", Port: 1, Up: true, TxMBps: 1234.6, RxMBps: 0}},
		ReadAt: now,
	}
	if !changed || !slices.Equal(tel.GPUs, want.GPUs) || !slices.Equal(tel.Links, want.Links) || !tel.ReadAt.Equal(now) {
		t.Fatalf("first reading: changed %v\n got %+v\nwant %+v", changed, tel, want)
	}
	// Within the interval nothing is read, whatever the GPUs do.
	clk.Advance(publish.LoadInterval - time.Second)
	gpus.reading[0].UtilPct = 40
	if _, changed := g.telemetry(context.Background(), hw, tel); changed || gpus.reads != 1 || icReads != 1 {
		t.Fatalf("within the interval: changed %v, %d GPU reads, %d link reads", changed, gpus.reads, icReads)
	}
	// Past it, a change the rounding hides is not republished.
	clk.Advance(time.Second)
	gpus.reading[0].UtilPct, gpus.reading[0].PowerW = 101, 688
	links[0].TxMBps = 1234.61
	if got, changed := g.telemetry(context.Background(), hw, tel); changed || gpus.reads != 2 || !got.ReadAt.Equal(tel.ReadAt) {
		t.Fatalf("rounded alike: changed %v, %d reads, read at %v", changed, gpus.reads, got.ReadAt)
	}
	// A real change is.
	clk.Advance(publish.LoadInterval)
	now = clk.Now()
	gpus.reading[1].UtilPct = 73
	got, changed := g.telemetry(context.Background(), hw, tel)
	if !changed || got.GPUs[1].UtilPct != 75 || !got.ReadAt.Equal(now) {
		t.Fatalf("after a change: changed %v, %+v", changed, got)
	}
}

// gpuRunnerStub is the runner as the GPU loop sees it: shards with their
// claims, and engine PIDs.
type gpuRunnerStub struct {
	shards []gossip.ShardRecord
	pids   []int
}

func (r gpuRunnerStub) Shards() []gossip.ShardRecord { return r.shards }
func (r gpuRunnerStub) OwnPIDs() []int               { return r.pids }

// The record's foreign memory holds the driver's reservation, simulated
// GPUs included (their engines' claims are used memory, never foreign):
// placement then keeps vLLM's start rule on every node's figures.
func TestGPUReadingCountsReservedAsForeign(t *testing.T) {
	probe, err := gpu.NewSimulated("2xH100-80GB", "n1")
	if err != nil {
		t.Fatal(err)
	}
	g := &gpuLoop{probe: probe, simulated: true, log: slog.New(slog.NewTextHandler(io.Discard, nil)), clock: clock.NewFake(time.Now()),
		runner: gpuRunnerStub{shards: []gossip.ShardRecord{{GPUs: []int{0}, MemoryPerGPU: 40 << 30}}}}
	snap, err := probe.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	gpus, _ := g.reading(context.Background(), snap, nil, gossip.ProbeSummary{})
	reserved := gpu.SimulatedReserved(80 << 30)
	for i, want := range []uint64{40 << 30, 0} {
		if gpus[i].MemoryForeign != reserved || gpus[i].MemoryUsed != want {
			t.Errorf("GPU %d: foreign %d used %d, want the reserved %d foreign and %d used", i, gpus[i].MemoryForeign, gpus[i].MemoryUsed, reserved, want)
		}
	}
}
