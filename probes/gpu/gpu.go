// Package gpu discovers a node's GPUs and who uses their memory.
//
// Three Discoverers: NVML (the real one, over go-nvml's nvml.Interface so
// tests can hand it a mock), Simulated (GPUs described by a spec string, only
// when the operator asks for them) and whatever a test writes. NVML needs cgo;
// without cgo, System returns a Discoverer that reports no GPUs.
package gpu

import (
	"context"
	"errors"
	"slices"

	"github.com/llmgw/llmgw/placement"
)

// ErrClosed is returned by Discover after Close.
var ErrClosed = errors.New("gpu: discoverer closed")

// Snapshot is one reading of a node's GPUs.
type Snapshot struct {
	// GPUs are sorted by index. MemoryForeign is left zero: only the caller
	// knows which processes are its own (see ForeignMemory).
	GPUs []placement.GPU `json:"gpus"`
	// Reserved is each GPU's driver-reserved memory by GPU index (NVML v2
	// reports it apart from used; 616 MiB on the H200 fixture), absent
	// where unknown (v1 drivers count it in used). Simulated GPUs get
	// SimulatedReserved.
	Reserved map[int]uint64 `json:"reserved_bytes,omitempty"`
	// Processes are the compute processes NVML reports, per GPU.
	Processes []GPUProcess `json:"processes,omitempty"`
	// Driver is the NVIDIA driver version, e.g. "580.159.04".
	Driver string `json:"driver,omitempty"`
	// Available is false when this host has no NVML library: no NVIDIA
	// driver, so no GPUs. That is a normal state for a CPU node, not an
	// error.
	Available bool `json:"available"`
	// Simulated marks GPUs that came from a spec string, not hardware.
	Simulated bool `json:"simulated,omitempty"`
	// Warnings name what could not be read (one device's NVLink state, a
	// process list) while the rest of the snapshot is good.
	Warnings []string `json:"warnings,omitempty"`
}

// GPUProcess is one process holding memory on one GPU. A process on two
// GPUs appears twice.
type GPUProcess struct {
	// PID is as NVML reports it: the host PID namespace's number. An
	// observer inside a container with its own PID namespace cannot match
	// it against its own /proc.
	PID       int    `json:"pid"`
	GPUIndex  int    `json:"gpu_index"`
	GPUUUID   string `json:"gpu_uuid"`
	UsedBytes uint64 `json:"used_bytes"`
}

// Discoverer reads the node's GPUs. Implementations are safe for concurrent
// use; a call may block for as long as the driver takes (NVML calls cannot
// be cancelled, so ctx is checked only between devices).
type Discoverer interface {
	Discover(ctx context.Context) (Snapshot, error)
}

// Telemetry is one GPU's activity at one reading: what changes at every
// sample, apart from the memory and identity in Snapshot (which placement
// reads). Every consumer reads it through a TelemetryReader: the node's
// record, the cluster page, MCP and the node's own screen.
type Telemetry struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	// UtilPct is the share of the driver's last sample period (1/6 s to
	// 1 s, by GPU) in which a kernel ran, 0-100; MemUtilPct the share in
	// which device memory was read or written.
	UtilPct    int `json:"util_pct"`
	MemUtilPct int `json:"mem_util_pct"`
	// TempC is the GPU core temperature in °C.
	TempC int `json:"temp_c"`
	// PowerW is the board's power draw and PowerLimitW the limit the
	// driver enforces, in watts.
	PowerW      float64 `json:"power_w"`
	PowerLimitW float64 `json:"power_limit_w,omitempty"`
	// HasUtil, HasTemp and HasPower say which readings the driver gave: a
	// GPU that cannot report power (some boards in VMs) is not at 0 W.
	HasUtil  bool `json:"has_util"`
	HasTemp  bool `json:"has_temp"`
	HasPower bool `json:"has_power"`
	// Warnings name what could not be read.
	Warnings []string `json:"warnings,omitempty"`
}

// TelemetryReader reads every GPU's Telemetry, sorted by index. A host
// without GPUs (or with simulated ones, which have no activity) reads none,
// without an error.
type TelemetryReader interface {
	Telemetry(ctx context.Context) ([]Telemetry, error)
}

// Probe is a Discoverer that holds a resource (the NVML library) until
// Close.
type Probe interface {
	Discoverer
	Close() error
}

// ForeignMemory returns a copy of s.GPUs with MemoryForeign filled: for each
// GPU, the used memory minus what processes in ownPIDs hold there, plus
// the driver-reserved memory (s.Reserved).
//
// Why "used minus ours" and not "the sum of the others' processes":
//   - NVML's per-process figure leaves out memory the driver holds that no
//     process is charged with (bookkeeping beyond each context), and on the
//     H200 fixture that gap is about 10 MiB with one process running. It is
//     as unavailable to our engines as another tenant's tensors.
//   - Processes NVML lists may not be visible to us (another PID namespace,
//     MPS clients that show as the MPS server), and a process can allocate
//     between the memory read and the process read.
//
// So whatever llmgw cannot prove is its own counts as foreign. That errs
// towards calling a GPU fuller than it is, which costs a placement; the
// other way costs an out-of-memory crash. It also means ownPIDs must hold
// every process of our engines, not only the one we started: vLLM runs its
// tensor-parallel workers and EngineCore as child processes, each with its
// own CUDA context. OwnPIDs expands engine PIDs to their descendants.
//
// MemoryUsed is NVML's v2 figure, which excludes driver-reserved memory
// (616 MiB on the H200 fixture) while MemoryTotal still counts it, so
// reserved memory is added to foreign: no engine can have it. vLLM refuses
// to start unless free memory (total − used − reserved) is at least its
// gpu_memory_utilization × total, and the vllm profile passes share/total;
// placement keeps total − foreign − promised ≥ share, which with reserved
// counted here is that same rule. It changes only the figure this node
// publishes, not what other nodes compute from it.
func ForeignMemory(s Snapshot, ownPIDs map[int]bool) []placement.GPU {
	ours := make(map[int]uint64) // by GPU index
	for _, p := range s.Processes {
		if ownPIDs[p.PID] {
			ours[p.GPUIndex] += p.UsedBytes
		}
	}
	out := cloneGPUs(s.GPUs)
	for i := range out {
		used, own := out[i].MemoryUsed, ours[out[i].Index]
		if own >= used {
			out[i].MemoryForeign = 0
		} else {
			out[i].MemoryForeign = used - own
		}
		out[i].MemoryForeign += s.Reserved[out[i].Index]
	}
	return out
}

// cloneGPUs copies GPUs deeply enough that the caller may change the copy
// (NVLinkPeers is the only reference field).
func cloneGPUs(in []placement.GPU) []placement.GPU {
	if in == nil {
		return nil
	}
	out := slices.Clone(in)
	for i := range out {
		out[i].NVLinkPeers = slices.Clone(out[i].NVLinkPeers)
	}
	return out
}
