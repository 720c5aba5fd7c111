//go:build cgo

package dgxtest

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/llmgw/llmgw/probes/gpu"
)

// h100Links is the number of NVLinks of an H100 SXM5; every one goes to an
// NVSwitch on a DGX H100.
const h100Links = 18

// dgx returns the mock with the calls it leaves unset filled in the way a
// DGX H100 answers them: each GPU's 18 links active and ending at an
// NVSwitch, v2 memory info, a PCI bus id in NVML's spelling, and the given
// processes per GPU index.
func dgx(t *testing.T, procs map[int][]nvml.ProcessInfo) *server.Server {
	t.Helper()
	s := dgxh100.New()
	for i, h := range s.Devices {
		d := h.(*server.Device)
		d.MemoryInfo.Used = 0
		for _, p := range procs[i] {
			d.MemoryInfo.Used += p.UsedGpuMemory
		}
		d.MemoryInfo.Free = d.MemoryInfo.Total - d.MemoryInfo.Used
		d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
			m := d.MemoryInfo
			return nvml.Memory_v2{Total: m.Total, Used: m.Used, Free: m.Free}, nvml.SUCCESS
		}
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for j, c := range "0000" + d.PciBusID { // NVML's 8-digit domain
				p.BusId[j] = int8(c)
			}
			return p, nvml.SUCCESS
		}
		d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			if link >= h100Links {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		d.GetNvLinkRemoteDeviceTypeFunc = func(int) (nvml.IntNvLinkDeviceType, nvml.Return) {
			return nvml.NVLINK_DEVICE_TYPE_SWITCH, nvml.SUCCESS
		}
		d.GetNvLinkRemotePciInfoFunc = func(int) (nvml.PciInfo, nvml.Return) {
			return nvml.PciInfo{}, nvml.ERROR_NOT_SUPPORTED // never needed for switch links
		}
		d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			return procs[i], nvml.SUCCESS
		}
	}
	return s
}

func TestDGXH100(t *testing.T) {
	const gib = 1 << 30
	procs := map[int][]nvml.ProcessInfo{
		0: {{Pid: 4100, UsedGpuMemory: 70 * gib}},
		1: {{Pid: 4101, UsedGpuMemory: 70 * gib}},
		5: {{Pid: 777, UsedGpuMemory: 12 * gib}},
	}
	s := dgx(t, procs)
	d := gpu.NewNVML(s)
	defer d.Close()
	snap, err := d.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !snap.Available || snap.Driver != "550.54.15" || len(snap.Warnings) != 0 {
		t.Fatalf("snapshot = %+v", snap)
	}
	if len(snap.GPUs) != 8 {
		t.Fatalf("got %d GPUs", len(snap.GPUs))
	}
	uuids := map[string]bool{}
	for i, g := range snap.GPUs {
		if g.Index != i || g.Name != "NVIDIA H100 80GB HBM3" || g.MemoryTotal != 80*gib || g.MIG {
			t.Errorf("GPU %d = %+v", i, g)
		}
		if want := s.Devices[i].(*server.Device).PciBusID; g.PCIBusID != want {
			t.Errorf("GPU %d PCI = %q, want %q", i, g.PCIBusID, want)
		}
		uuids[g.UUID] = true
		var want []int
		for j := range 8 {
			if j != i {
				want = append(want, j)
			}
		}
		if !slices.Equal(g.NVLinkPeers, want) {
			t.Errorf("GPU %d NVLink peers = %v, want all others", i, g.NVLinkPeers)
		}
	}
	if len(uuids) != 8 {
		t.Errorf("UUIDs not distinct: %v", uuids)
	}
	if len(snap.Processes) != 3 || snap.Processes[2].PID != 777 || snap.Processes[2].GPUIndex != 5 ||
		snap.Processes[2].GPUUUID != snap.GPUs[5].UUID {
		t.Errorf("processes = %+v", snap.Processes)
	}

	// 4100 is our engine and 4101 its tensor-parallel worker; 777 is not
	// ours.
	own := map[int]bool{4100: true, 4101: true}
	gs := gpu.ForeignMemory(snap, own)
	for i, g := range gs {
		want := uint64(0)
		if i == 5 {
			want = 12 * gib
		}
		if g.MemoryForeign != want {
			t.Errorf("GPU %d foreign = %d, want %d", i, g.MemoryForeign, want)
		}
	}
}

func TestDGXH100MIGAndOldDriver(t *testing.T) {
	s := dgx(t, nil)
	if ret, _ := s.Devices[3].SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	// A driver without the v2 memory call: it must not be called.
	s.LookupSymbolFunc = func(sym string) error {
		if sym == "nvmlDeviceGetMemoryInfo_v2" {
			return errors.New("undefined symbol")
		}
		return nil
	}
	for _, h := range s.Devices {
		h.(*server.Device).GetMemoryInfo_v2Func = nil
	}
	snap, err := gpu.NewNVML(s).Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range snap.GPUs {
		if g.MIG != (i == 3) {
			t.Errorf("GPU %d MIG = %v", i, g.MIG)
		}
		if g.MemoryTotal != 80<<30 {
			t.Errorf("GPU %d total = %d", i, g.MemoryTotal)
		}
	}
}
