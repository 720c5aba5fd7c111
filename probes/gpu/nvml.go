//go:build cgo

package gpu

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/llmgw/llmgw/placement"
)

// Symbols newer than some drivers still in service. go-nvml binds C symbols
// lazily, so calling one the loaded library lacks crashes the process
// instead of returning an error (NVIDIA/go-nvml#82); they are looked up once
// after Init.
const (
	symMemoryInfoV2   = "nvmlDeviceGetMemoryInfo_v2"
	symRemoteDevType  = "nvmlDeviceGetNvLinkRemoteDeviceType"
	notAvailableBytes = ^uint64(0) // NVML_VALUE_NOT_AVAILABLE in a uint64 field
)

type nvmlState int

const (
	stateNew       nvmlState = iota // Init not called or failed transiently
	stateReady                      // Init succeeded; Shutdown owed
	stateNoLibrary                  // no libnvidia-ml: no GPUs here, for good
	stateClosed
)

// NVML discovers GPUs through NVML. Init is called on the first Discover and
// the library stays initialised until Close, so a discovery tick costs only
// the device queries.
type NVML struct {
	lib nvml.Interface

	mu    sync.Mutex
	state nvmlState
	// Optional symbols present in the loaded library.
	hasV2, hasRemoteType bool
}

var _ Probe = (*NVML)(nil)

// NewNVML returns a Discoverer over lib: nvml.New() in production, a mock in
// tests. Nothing is called on lib until the first Discover.
func NewNVML(lib nvml.Interface) *NVML { return &NVML{lib: lib} }

// System returns the host's NVML discoverer.
func System() Probe { return NewNVML(nvml.New()) }

// Discover reads every device.
//
// A host without the NVML library gets an empty snapshot with Available
// false and no error, every time, and no further NVML call: after a failed
// Init the library's symbols are unresolved and any other call would crash
// (NVIDIA/go-nvml#36). Any other Init failure (driver not loaded, no
// permission) is an error, and the next Discover tries Init again, since a
// driver can finish loading after the agent starts.
//
// A device that cannot be read is left out with a warning, except a lost
// one (it fell off the bus), which is kept as Faulted so placement avoids it
// and operators see it. Per-device details that fail (MIG mode, NVLink,
// processes) leave their fields empty and add a warning.
func (n *NVML) Discover(ctx context.Context) (Snapshot, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return Snapshot{}, err
	}
	if ok, err := n.ready(); !ok || err != nil {
		return Snapshot{}, err
	}
	return n.read(ctx)
}

// ready initialises NVML if it is not yet; n.mu must be held. It is false
// (with no error) on a host without the library, and false with ErrClosed
// after Close.
func (n *NVML) ready() (bool, error) {
	switch n.state {
	case stateClosed:
		return false, ErrClosed
	case stateNoLibrary:
		return false, nil
	case stateNew:
		ret := n.lib.Init()
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			n.state = stateNoLibrary
			return false, nil
		}
		if ret != nvml.SUCCESS {
			return false, fmt.Errorf("gpu: nvml init: %w", ret)
		}
		n.state = stateReady
		ext := n.lib.Extensions()
		n.hasV2 = ext.LookupSymbol(symMemoryInfoV2) == nil
		n.hasRemoteType = ext.LookupSymbol(symRemoteDevType) == nil
	}
	return true, nil
}

// Close shuts NVML down if Discover initialised it. Later Discovers return
// ErrClosed. Closing twice is harmless.
func (n *NVML) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	prev := n.state
	n.state = stateClosed
	if prev != stateReady {
		return nil
	}
	if ret := n.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("gpu: nvml shutdown: %w", ret)
	}
	return nil
}

// device is what read keeps per GPU until NVLink peers can be resolved,
// which needs every device's PCI address.
type device struct {
	gpu placement.GPU
	// reserved is the driver-reserved memory NVML v2 reports apart (0
	// with v1, whose used figure includes it).
	reserved uint64
	// remote holds the PCI addresses at the far end of active links that
	// are (or may be) GPUs.
	remote []string
	// switched is set when an active link ends at an NVSwitch.
	switched bool
}

func (n *NVML) read(ctx context.Context) (Snapshot, error) {
	snap := Snapshot{Available: true}
	warn := func(format string, a ...any) { snap.Warnings = append(snap.Warnings, fmt.Sprintf(format, a...)) }

	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return Snapshot{}, fmt.Errorf("gpu: nvml device count: %w", ret)
	}
	if v, ret := n.lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		snap.Driver = v
	} else {
		warn("driver version: %v", ret)
	}

	devs := make([]device, 0, count)
	for i := range count {
		if err := ctx.Err(); err != nil {
			return Snapshot{}, err
		}
		h, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret == nvml.ERROR_GPU_IS_LOST {
			warn("GPU %d: %v", i, ret)
			devs = append(devs, device{gpu: placement.GPU{Index: i, Faulted: true}})
			continue
		}
		if ret != nvml.SUCCESS {
			warn("GPU %d left out: handle: %v", i, ret)
			continue
		}
		d, procs, ok := n.readDevice(i, h, warn)
		if !ok {
			continue
		}
		devs = append(devs, d)
		snap.Processes = append(snap.Processes, procs...)
	}

	resolvePeers(devs, n.hasRemoteType)
	for _, d := range devs {
		snap.GPUs = append(snap.GPUs, d.gpu)
		if d.reserved > 0 {
			if snap.Reserved == nil {
				snap.Reserved = map[int]uint64{}
			}
			snap.Reserved[d.gpu.Index] = d.reserved
		}
	}
	slices.SortFunc(snap.GPUs, func(a, b placement.GPU) int { return a.Index - b.Index })
	return snap, nil
}

// readDevice reads one device. ok is false when identity or memory could not
// be read (a GPU without them cannot be placed on or told apart), except
// for a GPU NVML reports lost: that one is kept, marked faulted.
func (n *NVML) readDevice(i int, h nvml.Device, warn func(string, ...any)) (device, []GPUProcess, bool) {
	var d device
	g := &d.gpu
	g.Index = i
	if idx, ret := h.GetIndex(); ret == nvml.SUCCESS {
		g.Index = idx
	}
	// A GPU lost after its handle was taken is kept, marked faulted, as
	// when the handle itself reports it lost: it is there, and broken.
	lost := func(what string, err error) (device, []GPUProcess, bool) {
		warn("GPU %d: %s: %v", g.Index, what, err)
		return device{gpu: placement.GPU{Index: g.Index, UUID: g.UUID, Name: g.Name, Faulted: true}}, nil, true
	}
	uuid, ret := h.GetUUID()
	if ret == nvml.ERROR_GPU_IS_LOST {
		return lost("UUID", ret)
	}
	if ret != nvml.SUCCESS {
		warn("GPU %d left out: UUID: %v", i, ret)
		return d, nil, false
	}
	g.UUID = uuid
	if name, ret := h.GetName(); ret == nvml.SUCCESS {
		g.Name = name
	} else {
		warn("GPU %d: name: %v", g.Index, ret)
	}

	total, used, reserved, err := n.memory(h)
	if errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
		return lost("memory", err)
	}
	if err != nil {
		warn("GPU %d left out: %v", g.Index, err)
		return d, nil, false
	}
	g.MemoryTotal, g.MemoryUsed, d.reserved = total, used, reserved

	// MIG mode is NOT_SUPPORTED on GPUs without MIG (L40S, consumer cards):
	// that simply means no MIG.
	switch cur, _, ret := h.GetMigMode(); ret {
	case nvml.SUCCESS:
		g.MIG = cur == nvml.DEVICE_MIG_ENABLE
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		warn("GPU %d: MIG mode: %v", g.Index, ret)
	}

	if pci, ret := h.GetPciInfo(); ret == nvml.SUCCESS {
		g.PCIBusID = NormalizePCI(cString(pci.BusId[:]))
	} else {
		warn("GPU %d: PCI info: %v", g.Index, ret)
	}

	n.readLinks(&d, h, warn)

	var procs []GPUProcess
	switch ps, ret := h.GetComputeRunningProcesses(); ret {
	case nvml.SUCCESS:
		for _, p := range ps {
			used := p.UsedGpuMemory
			if used == notAvailableBytes {
				// The driver would not say (it does so without the
				// permission to see other users' processes). Zero keeps
				// the process listed; ForeignMemory then counts its share
				// as foreign, the safe side.
				warn("GPU %d: pid %d: memory not available", g.Index, p.Pid)
				used = 0
			}
			procs = append(procs, GPUProcess{PID: int(p.Pid), GPUIndex: g.Index, GPUUUID: g.UUID, UsedBytes: used})
		}
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		warn("GPU %d: processes: %v", g.Index, ret)
	}
	return d, procs, true
}

// memory returns total, used and driver-reserved bytes. v2's Used leaves
// out what the driver reserves and reports it apart (v1 counts it as used:
// on the H200 fixture v1 said 23.18 GB used where the processes held
// 22.53 GB, and 645 MB with none running), so v2 is preferred and v1, with
// reserved 0, is the fallback for drivers without it.
func (n *NVML) memory(h nvml.Device) (total, used, reserved uint64, err error) {
	if n.hasV2 {
		m, ret := h.GetMemoryInfo_v2()
		switch ret {
		case nvml.SUCCESS:
			return m.Total, m.Used, m.Reserved, nil
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
		default:
			return 0, 0, 0, fmt.Errorf("memory info v2: %w", ret)
		}
	}
	m, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return 0, 0, 0, fmt.Errorf("memory info: %w", ret)
	}
	return m.Total, m.Used, 0, nil
}

// readLinks records where each active NVLink goes. A GPU without NVLink
// answers NOT_SUPPORTED on link 0; links a GPU does not have answer
// INVALID_ARGUMENT or NOT_SUPPORTED and are skipped.
func (n *NVML) readLinks(d *device, h nvml.Device, warn func(string, ...any)) {
	for link := range nvml.NVLINK_MAX_LINKS {
		state, ret := h.GetNvLinkState(link)
		if ret != nvml.SUCCESS {
			if link == 0 && ret == nvml.ERROR_NOT_SUPPORTED {
				return
			}
			continue
		}
		if state != nvml.FEATURE_ENABLED {
			continue
		}
		if n.hasRemoteType {
			t, ret := h.GetNvLinkRemoteDeviceType(link)
			if ret == nvml.SUCCESS && t == nvml.NVLINK_DEVICE_TYPE_SWITCH {
				d.switched = true
				continue
			}
			if ret == nvml.SUCCESS && t != nvml.NVLINK_DEVICE_TYPE_GPU {
				continue // an IBM NPU (POWER9 CPU) or unknown: not a peer
			}
		}
		pci, ret := h.GetNvLinkRemotePciInfo(link)
		if ret != nvml.SUCCESS {
			warn("GPU %d: NVLink %d remote PCI info: %v", d.gpu.Index, link, ret)
			continue
		}
		d.remote = append(d.remote, NormalizePCI(cString(pci.BusId[:])))
	}
}

// resolvePeers turns remote PCI addresses into GPU indices.
//
// A link to another local GPU makes that GPU a peer. A link to an NVSwitch
// (DGX/HGX H100 and later: every GPU's links go to switches) makes every
// other switch-attached GPU of the node a peer, since the switches connect
// them all. Without the remote-type call (old drivers), a remote address
// that is no local GPU is taken to be a switch: NVLink ends only at GPUs,
// switches and IBM NPUs, and the last exist only on POWER9.
func resolvePeers(devs []device, typed bool) {
	byPCI := make(map[string]int, len(devs))
	for _, d := range devs {
		if d.gpu.PCIBusID != "" {
			byPCI[d.gpu.PCIBusID] = d.gpu.Index
		}
	}
	for i := range devs {
		for _, r := range devs[i].remote {
			if _, ok := byPCI[r]; !ok && !typed {
				devs[i].switched = true
			}
		}
	}
	for i := range devs {
		d := &devs[i]
		var peers []int
		for _, r := range d.remote {
			if idx, ok := byPCI[r]; ok && idx != d.gpu.Index {
				peers = append(peers, idx)
			}
		}
		if d.switched {
			for _, o := range devs {
				if o.switched && o.gpu.Index != d.gpu.Index {
					peers = append(peers, o.gpu.Index)
				}
			}
		}
		slices.Sort(peers)
		d.gpu.NVLinkPeers = slices.Compact(peers)
	}
}

// cString converts NVML's NUL-terminated char array.
func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}
