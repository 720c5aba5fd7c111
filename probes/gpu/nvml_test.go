//go:build cgo

package gpu

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

const mib = 1 << 20

// probeJSON is the shape of testdata/h200/gpuprobe.json, written by a small
// go-nvml program on the H200 (v1 memory info only).
type probeJSON struct {
	Driver  string `json:"driver"`
	Devices []struct {
		Index      int    `json:"index"`
		Name       string `json:"name"`
		UUID       string `json:"uuid"`
		MemTotal   uint64 `json:"mem_total"`
		MemUsed    uint64 `json:"mem_used"`
		MemFree    uint64 `json:"mem_free"`
		MigCurrent int    `json:"mig_current"`
		MigPending int    `json:"mig_pending"`
		PCIBusID   string `json:"pci_bus_id"`
		Procs      []struct {
			PID        uint32 `json:"pid"`
			UsedMemory uint64 `json:"used_memory"`
		} `json:"procs"`
	} `json:"devices"`
}

// smiXML is the part of nvidia-smi -q -x the mock needs: the v2-style memory
// split (total, reserved, used, free) that gpuprobe.json lacks, and the
// PCI address in NVML's own 8-digit-domain spelling.
type smiXML struct {
	GPU struct {
		PCIBusID string `xml:"pci>pci_bus_id"`
		FB       struct {
			Total    string `xml:"total"`
			Reserved string `xml:"reserved"`
			Used     string `xml:"used"`
			Free     string `xml:"free"`
		} `xml:"fb_memory_usage"`
	} `xml:"gpu"`
}

func mibField(t *testing.T, s string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(strings.TrimSuffix(s, " MiB"), 10, 64)
	if err != nil {
		t.Fatalf("MiB field %q: %v", s, err)
	}
	return n * mib
}

func busID(s string) [32]int8 {
	var b [32]int8
	for i := 0; i < len(s) && i < 31; i++ {
		b[i] = int8(s[i])
	}
	return b
}

// h200 is a mock NVML answering with the H200 fixture's figures. symbols
// lists the optional symbols the "library" has.
type h200 struct {
	lib *mock.Interface
	dev *mock.Device
	v1  nvml.Memory
	v2  nvml.Memory_v2
	pid uint32
	pu  uint64 // the process's memory
}

func newH200(t *testing.T, symbols ...string) *h200 {
	t.Helper()
	raw, err := os.ReadFile("../testdata/h200/gpuprobe.json")
	if err != nil {
		t.Fatal(err)
	}
	var pj probeJSON
	if err := json.Unmarshal(raw, &pj); err != nil {
		t.Fatal(err)
	}
	raw, err = os.ReadFile("../testdata/h200/nvidia-smi-q.xml")
	if err != nil {
		t.Fatal(err)
	}
	var sx smiXML
	if err := xml.Unmarshal(raw, &sx); err != nil {
		t.Fatal(err)
	}
	pd := pj.Devices[0]
	h := &h200{
		v1: nvml.Memory{Total: pd.MemTotal, Used: pd.MemUsed, Free: pd.MemFree},
		// gpuprobe called only v1; the split comes from nvidia-smi, which
		// reads v2 (its used figure, 21491 MiB, leaves reserved out).
		v2: nvml.Memory_v2{
			Total:    pd.MemTotal,
			Reserved: mibField(t, sx.GPU.FB.Reserved),
			Used:     mibField(t, sx.GPU.FB.Used),
			Free:     pd.MemFree,
		},
		pid: pd.Procs[0].PID,
		pu:  pd.Procs[0].UsedMemory,
	}
	h.dev = &mock.Device{
		GetIndexFunc:         func() (int, nvml.Return) { return pd.Index, nvml.SUCCESS },
		GetUUIDFunc:          func() (string, nvml.Return) { return pd.UUID, nvml.SUCCESS },
		GetNameFunc:          func() (string, nvml.Return) { return pd.Name, nvml.SUCCESS },
		GetMemoryInfoFunc:    func() (nvml.Memory, nvml.Return) { return h.v1, nvml.SUCCESS },
		GetMemoryInfo_v2Func: func() (nvml.Memory_v2, nvml.Return) { return h.v2, nvml.SUCCESS },
		GetMigModeFunc:       func() (int, int, nvml.Return) { return pd.MigCurrent, pd.MigPending, nvml.SUCCESS },
		GetPciInfoFunc: func() (nvml.PciInfo, nvml.Return) {
			return nvml.PciInfo{BusId: busID(sx.GPU.PCIBusID)}, nvml.SUCCESS
		},
		// One GPU in a VM: no NVLink at all.
		GetNvLinkStateFunc: func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED },
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			return []nvml.ProcessInfo{{Pid: h.pid, UsedGpuMemory: h.pu}}, nvml.SUCCESS
		},
	}
	ext := &mock.ExtendedInterface{LookupSymbolFunc: func(s string) error {
		if slices.Contains(symbols, s) {
			return nil
		}
		return errors.New("undefined symbol: " + s)
	}}
	h.lib = &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		ExtensionsFunc:             func() nvml.ExtendedInterface { return ext },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return 1, nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return pj.Driver, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i != 0 {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return h.dev, nvml.SUCCESS
		},
	}
	return h
}

func TestNVMLH200Fixture(t *testing.T) {
	h := newH200(t, symMemoryInfoV2, symRemoteDevType)
	d := NewNVML(h.lib)
	snap, err := d.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !snap.Available || snap.Driver != "580.159.04" || len(snap.Warnings) != 0 {
		t.Fatalf("snapshot = %+v", snap)
	}
	if len(snap.GPUs) != 1 {
		t.Fatalf("GPUs = %+v", snap.GPUs)
	}
	g := snap.GPUs[0]
	if g.Index != 0 || g.UUID != "GPU-8b38414a-24cf-3fdb-ca7d-672639ff58e5" || g.Name != "NVIDIA H200" {
		t.Errorf("identity = %+v", g)
	}
	if g.MemoryTotal != 150754820096 {
		t.Errorf("total = %d", g.MemoryTotal)
	}
	// v2 used, as nvidia-smi shows it (21491 MiB), not v1's 23179689984,
	// which counts the driver's reserve.
	if g.MemoryUsed != 21491*mib {
		t.Errorf("used = %d, want v2's %d", g.MemoryUsed, 21491*mib)
	}
	if g.MIG || len(g.NVLinkPeers) != 0 || g.Faulted {
		t.Errorf("MIG/NVLink/faulted = %+v", g)
	}
	if g.PCIBusID != "0000:00:06.0" { // fixture README's spelling; NVML says 00000000:00:06.0
		t.Errorf("PCI = %q", g.PCIBusID)
	}
	want := []GPUProcess{{PID: 448, GPUIndex: 0, GPUUUID: g.UUID, UsedBytes: 22525509632}}
	if !slices.Equal(snap.Processes, want) {
		t.Errorf("processes = %+v, want %+v", snap.Processes, want)
	}
	if n := len(h.dev.GetMemoryInfoCalls()); n != 0 {
		t.Errorf("v1 memory info called %d times with v2 present", n)
	}

	// v2 reports the driver's reservation apart: 616 MiB on this card.
	if snap.Reserved[0] != 616*mib {
		t.Errorf("reserved = %v, want 616 MiB on GPU 0", snap.Reserved)
	}
	// Our engine is pid 448: what is left is driver overhead not charged to
	// any process, about 10 MiB, and the reserved 616 MiB; neither is ours
	// to use (vLLM does not count reserved memory as free).
	gs := ForeignMemory(snap, map[int]bool{448: true})
	if gs[0].MemoryForeign != 21491*mib-22525509632+616*mib { // exactly 10 MiB + 616 MiB
		t.Errorf("foreign with pid 448 ours = %d", gs[0].MemoryForeign)
	}
	gs = ForeignMemory(snap, nil)
	if gs[0].MemoryForeign != g.MemoryUsed+616*mib {
		t.Errorf("foreign with nothing ours = %d, want all used %d + 616 MiB reserved", gs[0].MemoryForeign, g.MemoryUsed)
	}
	if snap.GPUs[0].MemoryForeign != 0 {
		t.Error("ForeignMemory changed the snapshot it was given")
	}

	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(h.lib.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times", n)
	}
	if _, err := d.Discover(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Discover after Close = %v", err)
	}
	if err := d.Close(); err != nil || len(h.lib.ShutdownCalls()) != 1 {
		t.Errorf("second Close = %v, shutdowns %d", err, len(h.lib.ShutdownCalls()))
	}
}

func TestNVMLInitOnce(t *testing.T) {
	h := newH200(t, symMemoryInfoV2)
	d := NewNVML(h.lib)
	for range 3 {
		if _, err := d.Discover(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(h.lib.InitCalls()); n != 1 {
		t.Errorf("Init called %d times over 3 discoveries", n)
	}
}

// An old driver without nvmlDeviceGetMemoryInfo_v2: calling it would crash,
// so it must not be called at all (the mock panics if it is: its Func is
// nil), and v1's figure is the one reported.
func TestNVMLWithoutV2Symbol(t *testing.T) {
	h := newH200(t)
	h.dev.GetMemoryInfo_v2Func = nil
	snap, err := NewNVML(h.lib).Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.GPUs[0].MemoryUsed; got != 23179689984 {
		t.Errorf("used = %d, want v1's 23179689984", got)
	}
	// v1's used already holds the reservation: not counted twice.
	if len(snap.Reserved) != 0 {
		t.Errorf("reserved = %v with v1, want none", snap.Reserved)
	}
}

func TestNVMLV2NotSupportedFallsBack(t *testing.T) {
	for _, ret := range []nvml.Return{nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND} {
		h := newH200(t, symMemoryInfoV2)
		h.dev.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) { return nvml.Memory_v2{}, ret }
		snap, err := NewNVML(h.lib).Discover(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got := snap.GPUs[0].MemoryUsed; got != h.v1.Used {
			t.Errorf("%v: used = %d, want v1's %d", ret, got, h.v1.Used)
		}
	}
}

func TestNVMLMemoryFailureLeavesDeviceOut(t *testing.T) {
	h := newH200(t, symMemoryInfoV2)
	h.dev.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) { return nvml.Memory_v2{}, nvml.ERROR_UNKNOWN }
	snap, err := NewNVML(h.lib).Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.GPUs) != 0 || len(snap.Processes) != 0 {
		t.Errorf("GPUs = %+v, processes = %+v", snap.GPUs, snap.Processes)
	}
	if len(snap.Warnings) != 1 || !strings.Contains(snap.Warnings[0], "GPU 0 left out") {
		t.Errorf("warnings = %q", snap.Warnings)
	}
}

func TestNVMLDetailFailuresAreWarnings(t *testing.T) {
	h := newH200(t, symMemoryInfoV2)
	h.dev.GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NO_PERMISSION }
	h.dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 9, UsedGpuMemory: notAvailableBytes}}, nvml.SUCCESS
	}
	snap, err := NewNVML(h.lib).Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.GPUs) != 1 || snap.GPUs[0].MIG {
		t.Fatalf("GPUs = %+v", snap.GPUs)
	}
	if len(snap.Processes) != 1 || snap.Processes[0].UsedBytes != 0 {
		t.Errorf("processes = %+v", snap.Processes)
	}
	w := strings.Join(snap.Warnings, "\n")
	if !strings.Contains(w, "MIG mode") || !strings.Contains(w, "pid 9: memory not available") {
		t.Errorf("warnings = %q", snap.Warnings)
	}
}

func TestNVMLMIGNotSupportedIsQuiet(t *testing.T) {
	h := newH200(t, symMemoryInfoV2)
	h.dev.GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
	snap, err := NewNVML(h.lib).Discover(context.Background())
	if err != nil || len(snap.Warnings) != 0 || snap.GPUs[0].MIG {
		t.Fatalf("snap = %+v, err = %v", snap, err)
	}
	h.dev.GetMigModeFunc = func() (int, int, nvml.Return) { return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS }
	snap, _ = NewNVML(h.lib).Discover(context.Background())
	if !snap.GPUs[0].MIG {
		t.Error("MIG enabled not reported")
	}
}

func TestNVMLLostGPU(t *testing.T) {
	h := newH200(t, symMemoryInfoV2)
	h.lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 2, nvml.SUCCESS }
	h.lib.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 1 {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		return h.dev, nvml.SUCCESS
	}
	snap, err := NewNVML(h.lib).Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.GPUs) != 2 || !snap.GPUs[1].Faulted || snap.GPUs[1].Index != 1 || snap.GPUs[0].Faulted {
		t.Errorf("GPUs = %+v", snap.GPUs)
	}
}

// A GPU lost after its handle was taken (UUID or memory queries answer
// GPU_IS_LOST) is kept and marked faulted, not left out.
func TestNVMLGPULostAfterHandle(t *testing.T) {
	for _, where := range []string{"uuid", "memory"} {
		h := newH200(t, symMemoryInfoV2)
		switch where {
		case "uuid":
			h.dev.GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
		case "memory":
			h.dev.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) { return nvml.Memory_v2{}, nvml.ERROR_GPU_IS_LOST }
		}
		snap, err := NewNVML(h.lib).Discover(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.GPUs) != 1 || !snap.GPUs[0].Faulted {
			t.Errorf("lost at %s: GPUs = %+v, want the GPU kept, faulted", where, snap.GPUs)
		}
	}
}

// No NVML library: an empty snapshot, no error, and nothing but Init is
// ever called (every other Func of the mock is nil and would panic).
func TestNVMLLibraryNotFound(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	d := NewNVML(lib)
	for range 2 {
		snap, err := d.Discover(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if snap.Available || len(snap.GPUs) != 0 || snap.Driver != "" {
			t.Fatalf("snapshot = %+v", snap)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(lib.InitCalls()); n != 1 {
		t.Errorf("Init called %d times", n)
	}
}

// Any other Init failure is an error worth reporting, and a later Discover
// tries again: the driver may still be loading.
func TestNVMLInitFailureRetries(t *testing.T) {
	h := newH200(t, symMemoryInfoV2)
	fail := true
	h.lib.InitFunc = func() nvml.Return {
		if fail {
			return nvml.ERROR_DRIVER_NOT_LOADED
		}
		return nvml.SUCCESS
	}
	d := NewNVML(h.lib)
	_, err := d.Discover(context.Background())
	if !errors.Is(err, nvml.ERROR_DRIVER_NOT_LOADED) {
		t.Fatalf("err = %v", err)
	}
	// Nothing to shut down after a failed Init.
	fail = false
	snap, err := d.Discover(context.Background())
	if err != nil || len(snap.GPUs) != 1 {
		t.Fatalf("retry: %+v, %v", snap, err)
	}
	if n := len(h.lib.InitCalls()); n != 2 {
		t.Errorf("Init called %d times", n)
	}
}

func TestNVMLCloseWithoutInit(t *testing.T) {
	lib := &mock.Interface{} // any call would panic
	if err := NewNVML(lib).Close(); err != nil {
		t.Fatal(err)
	}
}

func TestNVMLCancelled(t *testing.T) {
	lib := &mock.Interface{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := NewNVML(lib).Discover(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v", err)
	}
}

// linked builds n mock GPUs whose links are given as pairs of GPU indices
// (direct GPU-to-GPU NVLink, as on a 4-GPU board or an NVLink bridge) or
// as index -> -1 (a link to an NVSwitch).
func linked(n int, links map[int][]int, typed bool) *mock.Interface {
	pci := func(i int) string { return "00000000:" + strconv.FormatInt(int64(0x18+i), 16) + ":00.0" }
	const switchPCI = "00000000:c5:00.0"
	devs := make([]*mock.Device, n)
	for i := range n {
		ends := links[i]
		devs[i] = &mock.Device{
			GetIndexFunc:         func() (int, nvml.Return) { return i, nvml.SUCCESS },
			GetUUIDFunc:          func() (string, nvml.Return) { return "GPU-" + strconv.Itoa(i), nvml.SUCCESS },
			GetNameFunc:          func() (string, nvml.Return) { return "NVIDIA A100-SXM4-80GB", nvml.SUCCESS },
			GetMemoryInfo_v2Func: func() (nvml.Memory_v2, nvml.Return) { return nvml.Memory_v2{Total: 80 << 30}, nvml.SUCCESS },
			GetMigModeFunc:       func() (int, int, nvml.Return) { return 0, 0, nvml.SUCCESS },
			GetPciInfoFunc:       func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{BusId: busID(pci(i))}, nvml.SUCCESS },
			GetNvLinkStateFunc: func(l int) (nvml.EnableState, nvml.Return) {
				if l >= 12 {
					return 0, nvml.ERROR_INVALID_ARGUMENT
				}
				if l < len(ends) {
					return nvml.FEATURE_ENABLED, nvml.SUCCESS
				}
				return nvml.FEATURE_DISABLED, nvml.SUCCESS
			},
			GetNvLinkRemotePciInfoFunc: func(l int) (nvml.PciInfo, nvml.Return) {
				if ends[l] < 0 {
					return nvml.PciInfo{BusId: busID(switchPCI)}, nvml.SUCCESS
				}
				return nvml.PciInfo{BusId: busID(strings.ToUpper(pci(ends[l])))}, nvml.SUCCESS
			},
			GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS },
		}
		if typed {
			devs[i].GetNvLinkRemoteDeviceTypeFunc = func(l int) (nvml.IntNvLinkDeviceType, nvml.Return) {
				if ends[l] < 0 {
					return nvml.NVLINK_DEVICE_TYPE_SWITCH, nvml.SUCCESS
				}
				return nvml.NVLINK_DEVICE_TYPE_GPU, nvml.SUCCESS
			}
		}
	}
	syms := []string{symMemoryInfoV2}
	if typed {
		syms = append(syms, symRemoteDevType)
	}
	ext := &mock.ExtendedInterface{LookupSymbolFunc: func(s string) error {
		if slices.Contains(syms, s) {
			return nil
		}
		return errors.New("undefined")
	}}
	return &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ExtensionsFunc:             func() nvml.ExtendedInterface { return ext },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return n, nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) { return devs[i], nvml.SUCCESS },
	}
}

func peers(t *testing.T, lib nvml.Interface) [][]int {
	t.Helper()
	snap, err := NewNVML(lib).Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out [][]int
	for _, g := range snap.GPUs {
		out = append(out, g.NVLinkPeers)
	}
	return out
}

func TestNVLinkPeers(t *testing.T) {
	// Two bridged pairs (0-1, 2-3, two links each) and one GPU with none.
	pairs := map[int][]int{0: {1, 1}, 1: {0, 0}, 2: {3, 3}, 3: {2, 2}}
	// GPUs 0-2 on an NVSwitch, 3 not: the switch joins the first three.
	switched := map[int][]int{0: {-1, -1}, 1: {-1}, 2: {-1, -1, -1}}
	for _, typed := range []bool{true, false} {
		got := peers(t, linked(5, pairs, typed))
		want := [][]int{{1}, {0}, {3}, {2}, nil}
		if !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("typed=%v pairs: peers = %v, want %v", typed, got, want)
		}
		got = peers(t, linked(4, switched, typed))
		want = [][]int{{1, 2}, {0, 2}, {0, 1}, nil}
		if !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("typed=%v switch: peers = %v, want %v", typed, got, want)
		}
	}
}

func TestNormalizePCI(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:3B:00.0": "0000:3b:00.0",
		"0000:3b:00.0":     "0000:3b:00.0",
		" 0001:04:00.1 ":   "0001:04:00.1",
		"0000:3b:00":       "0000:3b:00",
		"garbage":          "garbage",
		"":                 "",
	} {
		if got := NormalizePCI(in); got != want {
			t.Errorf("NormalizePCI(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestSystemNVML reads this host's real NVML through go-nvml. Without the
// NVIDIA library (this project's build machines) it checks that a missing
// library is a quiet "no GPUs" and not a crash; on a GPU host it checks the
// figures are sane.
func TestSystemNVML(t *testing.T) {
	p := System()
	defer func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	}()
	for range 2 { // the second call must not touch the library again
		snap, err := p.Discover(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(snap)
		t.Logf("%s", b)
		if !snap.Available {
			if len(snap.GPUs) != 0 {
				t.Errorf("GPUs without NVML: %+v", snap.GPUs)
			}
			continue
		}
		for _, g := range snap.GPUs {
			if g.UUID == "" || g.MemoryTotal == 0 || g.MemoryUsed > g.MemoryTotal {
				t.Errorf("GPU %+v", g)
			}
		}
	}
}
