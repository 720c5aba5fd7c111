package overview

import (
	"context"
	"slices"
	"time"

	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/probes/host"
)

// Telemetry reads what NVML says of each GPU's work: utilisation,
// temperature, power and MIG instances (FromNVML adapts probes/gpu's
// reader, which gives no MIG instances). Without one, those columns show
// a dash.
type Telemetry interface {
	Telemetry(ctx context.Context) ([]GPUReading, error)
}

// GPUReading is one GPU's telemetry. A negative figure is one the driver
// did not report.
type GPUReading struct {
	Index        int
	UtilPercent  float64
	TempC        float64
	PowerW       float64
	MIGInstances []string
}

// GPUsReader reads the GPUs from NVML directly (probes/gpu), not through
// the agent.
type GPUsReader struct {
	GPUs      gpu.Discoverer
	Telemetry Telemetry
}

// GPUsSection is what the GPUs section shows.
type GPUsSection struct {
	GPUs      []GPURow
	Driver    string
	Simulated bool
	// FaultWindow is how far back RecentXids count (0: the kernel log was
	// not read).
	FaultWindow time.Duration
	// Note replaces the table (no GPU here, NVML does not answer) or
	// follows it (warnings, telemetry that failed).
	Note string
}

// GPURow is one GPU.
type GPURow struct {
	Index             int
	Name              string
	PCIBusID          string
	MemUsed, MemTotal uint64
	MIG               bool
	// Lost: NVML reports the GPU lost (fallen off the bus).
	Lost bool
	// Reading is nil without a telemetry reader.
	Reading *GPUReading
	// RecentXids counts the kernel's Xid reports for this GPU in the
	// fault window.
	RecentXids int
	// Models are those whose engines hold this GPU, from the shard state
	// files.
	Models []string
}

// Read reads the GPUs section. An agent started with --simulate-gpus
// says so in its stamp; the section then shows the same simulated GPUs,
// marked as such, since NVML has none to show.
func (r GPUsReader) Read(ctx context.Context, st stamp) GPUsSection {
	var s GPUsSection
	if spec := st.alive.SimulatedGPUs; spec != "" {
		sim, err := gpu.NewSimulated(spec, st.alive.Name)
		if err != nil {
			s.Note = "the agent's --simulate-gpus: " + err.Error()
			return s
		}
		// Simulated GPUs have no activity to read.
		r.GPUs, r.Telemetry = sim, nil
	}
	if r.GPUs == nil {
		s.Note = "no GPU reader"
		return s
	}
	snap, err := r.GPUs.Discover(ctx)
	switch {
	case err != nil:
		s.Note = "NVML: " + err.Error()
		return s
	case !snap.Available && len(snap.GPUs) == 0:
		s.Note = "no GPU on this machine (no NVIDIA driver library)"
		if len(snap.Warnings) > 0 {
			s.Note = "no GPU read: " + snap.Warnings[0]
		}
		return s
	}
	s.Driver, s.Simulated = snap.Driver, snap.Simulated
	for _, g := range snap.GPUs {
		s.GPUs = append(s.GPUs, GPURow{Index: g.Index, Name: g.Name, PCIBusID: g.PCIBusID, MemUsed: g.MemoryUsed, MemTotal: g.MemoryTotal, MIG: g.MIG, Lost: g.Faulted})
	}
	if len(snap.Warnings) > 0 {
		s.Note = snap.Warnings[0]
	}
	if r.Telemetry != nil {
		readings, err := r.Telemetry.Telemetry(ctx)
		if err != nil {
			s.Note = "telemetry: " + err.Error()
		}
		for _, rd := range readings {
			for i := range s.GPUs {
				if s.GPUs[i].Index == rd.Index {
					rd := rd
					s.GPUs[i].Reading = &rd
				}
			}
		}
	}
	return s
}

// addEngines names, on each GPU, the models whose engines hold it. On
// simulated GPUs, which report no memory of their own, the memory used is
// what the running engines were placed with, as the agent reports it to
// the cluster (gpu.WithClaims): otherwise this screen said 0 GiB where
// `llmgw nodes` says 80.
func (s *GPUsSection) addEngines(engines []Engine) {
	if s.Simulated {
		gpus := make([]placement.GPU, len(s.GPUs))
		for i, g := range s.GPUs {
			gpus[i] = placement.GPU{Index: g.Index, MemoryTotal: g.MemTotal}
		}
		var claims []gpu.Claim
		for _, e := range engines {
			if !e.PIDAlive {
				continue
			}
			for _, g := range e.GPUs {
				claims = append(claims, gpu.Claim{Index: g, Bytes: e.MemoryPerGPU})
			}
		}
		for i, g := range gpu.WithClaims(gpus, claims) {
			s.GPUs[i].MemUsed = g.MemoryUsed
		}
	}
	for i := range s.GPUs {
		g := &s.GPUs[i]
		for _, e := range engines {
			if slices.Contains(e.GPUs, g.Index) && !slices.Contains(g.Models, e.Model) {
				g.Models = append(g.Models, e.Model)
			}
		}
	}
}

// addFaults counts each GPU's recent Xids, matched by PCI address as the
// agent matches them to mark a GPU faulted.
func (s *GPUsSection) addFaults(f faultReading, now time.Time) {
	s.FaultWindow = f.faults.Window
	for i := range s.GPUs {
		g := &s.GPUs[i]
		for _, x := range f.faults.Faults {
			if x.Xid != 0 && host.SamePCIDevice(x.PCI, g.PCIBusID) && recentFault(x.Time, now, f.faults.Window) {
				g.RecentXids++
			}
		}
	}
}

func recentFault(t, now time.Time, window time.Duration) bool {
	return !t.IsZero() && now.Sub(t) <= window && !t.After(now.Add(time.Minute))
}
