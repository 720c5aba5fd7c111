package overview

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/status"
)

func TestEnginesFromStateFiles(t *testing.T) {
	d := newDataDir(t, "gpu-1", nil, nil)
	gone := gonePID(t)
	saveShard(t, d, "chat-0", "chat", []int{0, 1}, 8100, os.Getpid(), t0.Add(-time.Hour))
	saveShard(t, d, "embed-0", "embed", nil, 8101, gone, t0.Add(-time.Minute))
	if err := os.WriteFile(filepath.Join(d.ShardsDir(), "shard-broken.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	api := &fakeAPI{answers: map[string]any{"/v1/shards": []status.ShardInfo{
		{ShardID: "chat-0", SpecVersion: "abc123", Node: "gpu-1", Lease: placement.LeaseValid, Status: "ready"},
		{ShardID: "chat-0", SpecVersion: "abc123", Node: "gpu-2", Lease: placement.LeaseLapsed, Status: "crashed"},
	}}}
	s := EnginesReader{API: api}.Read(context.Background(), d, stamp{})
	if len(s.Engines) != 2 {
		t.Fatalf("engines = %+v", s.Engines)
	}
	chat, embed := s.Engines[0], s.Engines[1]
	if chat.Shard != "chat-0" || !chat.PIDAlive || chat.Lease != "valid" || chat.Port != 8100 || len(chat.GPUs) != 2 {
		t.Errorf("chat-0 = %+v (the lease is this node's, not gpu-2's)", chat)
	}
	if embed.PIDAlive || embed.PID != gone || embed.Lease != "" {
		t.Errorf("embed-0 = %+v, want its pid gone and no lease", embed)
	}
	if len(s.Bad) != 1 || !strings.Contains(s.Bad[0], "shard-broken.json") {
		t.Errorf("bad = %q", s.Bad)
	}
	// Read-only: the corrupt file stays where it was.
	if _, err := os.Stat(filepath.Join(d.ShardsDir(), "shard-broken.json")); err != nil {
		t.Errorf("the reader moved a corrupt file: %v", err)
	}
	out := Render(Frame{At: t0, Engines: s}, 0, Plain())
	for _, want := range []string{"chat-0", "0,1", "8100", "alive", "1h", "valid", "embed-0", "CPU", "gone"} {
		if !strings.Contains(out, want) {
			t.Errorf("frame lacks %q:\n%s", want, out)
		}
	}

	// Agent down: engines still listed, leases not.
	s = EnginesReader{API: goneAPI}.Read(context.Background(), d, stamp{})
	if len(s.Engines) != 2 || s.Engines[0].Lease != "" || !s.Engines[0].PIDAlive || !strings.Contains(s.LeaseNote, "does not answer") {
		t.Errorf("agent down: %+v", s)
	}
}

func TestEnginesNeedRoot(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads every file: the permission check cannot fail")
	}
	d := newDataDir(t, "gpu-1", nil, nil)
	saveShard(t, d, "chat-0", "chat", nil, 8100, 1, t0)
	if err := os.Chmod(d.ShardsDir(), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(d.ShardsDir(), 0o700) })
	s := EnginesReader{}.Read(context.Background(), d, stamp{})
	if !s.NeedsRoot || len(s.Bad) != 0 {
		t.Errorf("section = %+v", s)
	}
}

// What a user without root sees in place of a section it cannot read.
func TestSectionsThatNeedRootSaySo(t *testing.T) {
	f := Frame{At: t0, Engines: EnginesSection{NeedsRoot: true}, Peers: PeersSection{NeedsRoot: true, Note: "node.json is root's"}}
	out := Render(f, 0, Plain())
	for _, want := range []string{"run with sudo to read the shard state files", "Run with sudo to read node.json (the remembered peers), the shard state files."} {
		if !strings.Contains(out, want) {
			t.Errorf("frame lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "none on this machine") {
		t.Errorf("unreadable engines shown as none:\n%s", out)
	}
}

// h200Snapshot is what probes/gpu reads from the H200 of the fixtures,
// and h200Telemetry what NVML said of its work then.
func h200Fixture(t *testing.T) (gpu.Snapshot, GPUReading) {
	t.Helper()
	b, err := os.ReadFile("../../probes/testdata/h200/gpuprobe.json")
	if err != nil {
		t.Fatal(err)
	}
	var pj struct {
		Driver  string `json:"driver"`
		Devices []struct {
			Index    int     `json:"index"`
			Name     string  `json:"name"`
			UUID     string  `json:"uuid"`
			MemTotal uint64  `json:"mem_total"`
			MemUsed  uint64  `json:"mem_used"`
			Util     float64 `json:"util_gpu"`
			Temp     float64 `json:"temp_c"`
			PowerMW  float64 `json:"power_mw"`
			MIG      int     `json:"mig_current"`
			PCI      string  `json:"pci_bus_id"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(b, &pj); err != nil {
		t.Fatal(err)
	}
	g := pj.Devices[0]
	snap := gpu.Snapshot{Available: true, Driver: pj.Driver, GPUs: []placement.GPU{{Index: g.Index, UUID: g.UUID, Name: g.Name,
		MemoryTotal: g.MemTotal, MemoryUsed: 21491 << 20, MIG: g.MIG != 0, PCIBusID: g.PCI}}}
	return snap, GPUReading{Index: g.Index, UtilPercent: g.Util, TempC: g.Temp, PowerW: g.PowerMW / 1000}
}

type snapGPUs struct {
	snap gpu.Snapshot
	err  error
	hang chan struct{}
}

func (s snapGPUs) Discover(ctx context.Context) (gpu.Snapshot, error) {
	if s.hang != nil {
		<-s.hang
	}
	return s.snap, s.err
}

type readings []GPUReading

func (r readings) Telemetry(context.Context) ([]GPUReading, error) { return r, nil }

func TestGPUsH200(t *testing.T) {
	snap, rd := h200Fixture(t)
	s := GPUsReader{GPUs: snapGPUs{snap: snap}, Telemetry: readings{rd}}.Read(context.Background(), stamp{})
	if len(s.GPUs) != 1 || s.Driver != "580.159.04" || s.GPUs[0].Reading == nil {
		t.Fatalf("section = %+v", s)
	}
	s.addEngines([]Engine{{Model: "llama", GPUs: []int{0}}, {Model: "llama", GPUs: []int{0}}, {Model: "other", GPUs: []int{1}}})
	// An Xid for this GPU (the kernel prints it without the function) and
	// one for another GPU, both recent, and an old one.
	s.addFaults(faultReading{faults: faultsOf(t, t0, []string{
		"[Tue Dec  1 19:58:00 2026] NVRM: Xid (PCI:0000:00:06): 79, pid=1, GPU has fallen off the bus.",
		"[Tue Dec  1 19:59:00 2026] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception",
		"[Tue Dec  1 10:00:00 2026] NVRM: Xid (PCI:0000:00:06): 31, pid=1, MMU fault",
	})}, t0)
	g := s.GPUs[0]
	if g.RecentXids != 1 || len(g.Models) != 1 || g.Models[0] != "llama" {
		t.Errorf("gpu = %+v", g)
	}
	out := Render(Frame{At: t0, GPUs: s}, 0, Plain())
	for _, want := range []string{"NVIDIA H200", "21.0/140.4 GiB", "100%", "58°C", "691W", "off", "XID (15m)", "llama", "driver 580.159.04"} {
		if !strings.Contains(out, want) {
			t.Errorf("frame lacks %q:\n%s", want, out)
		}
	}
}

func TestGPUsWithoutTelemetryShowDashes(t *testing.T) {
	snap, _ := h200Fixture(t)
	out := Render(Frame{At: t0, GPUs: GPUsReader{GPUs: snapGPUs{snap: snap}}.Read(context.Background(), stamp{})}, 0, Plain())
	if !strings.Contains(out, "NVIDIA H200") || strings.Contains(out, "58°C") {
		t.Errorf("frame:\n%s", out)
	}
}

func TestGPUsNVMLError(t *testing.T) {
	s := GPUsReader{GPUs: snapGPUs{err: errors.New("gpu: nvml init: Driver Not Loaded")}}.Read(context.Background(), stamp{})
	if len(s.GPUs) != 0 || !strings.Contains(s.Note, "Driver Not Loaded") {
		t.Errorf("section = %+v", s)
	}
}

func TestGPUsSimulatedFromStamp(t *testing.T) {
	st := stamp{found: true, alive: datadir.Alive{Name: "node-1", SimulatedGPUs: "2xH100-80GB"}}
	s := GPUsReader{GPUs: snapGPUs{}}.Read(context.Background(), st)
	if !s.Simulated || len(s.GPUs) != 2 {
		t.Fatalf("section = %+v", s)
	}
	if out := Render(Frame{At: t0, GPUs: s}, 0, Plain()); !strings.Contains(out, "simulated") {
		t.Errorf("frame:\n%s", out)
	}
	// Simulated GPUs hold what the running engines were placed with, as
	// the agent tells the cluster; an engine whose process is gone holds
	// nothing.
	s.addEngines([]Engine{
		{Model: "chat", GPUs: []int{0}, MemoryPerGPU: 40 << 30, PIDAlive: true},
		{Model: "gone", GPUs: []int{1}, PIDAlive: false},
	})
	if s.GPUs[0].MemUsed != 40<<30 || s.GPUs[1].MemUsed != 0 {
		t.Fatalf("used %d and %d bytes, want 40 GiB and 0", s.GPUs[0].MemUsed, s.GPUs[1].MemUsed)
	}
	s.addEngines([]Engine{{Model: "big", GPUs: []int{1}, PIDAlive: true}}) // whole GPU
	if out := Render(Frame{At: t0, GPUs: s}, 0, Plain()); !strings.Contains(out, "80.0/80.0 GiB") {
		t.Errorf("a whole-GPU engine does not fill its GPU:\n%s", out)
	}
}

func TestDisks(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	d := datadir.New("/var/lib/llmgw")
	statfs := func(path string) (uint64, uint64, error) {
		switch path {
		case "/var/lib/llmgw":
			return 5 << 30, 100 << 30, nil // 5%: low
		case "/mnt/weights":
			<-release // a network mount that went away
		}
		return 0, 0, os.ErrNotExist
	}
	s := DisksReader{Statfs: statfs}.Read(d, stamp{alive: datadir.Alive{WeightsDir: "/mnt/weights"}}, 50*time.Millisecond)
	if len(s.Disks) != 2 {
		t.Fatalf("disks = %+v", s.Disks)
	}
	if !s.Disks[0].Low() || s.Disks[0].Free != 5<<30 {
		t.Errorf("data dir = %+v, want low", s.Disks[0])
	}
	if s.Disks[1].Err != "does not answer" {
		t.Errorf("weights = %+v, want does not answer", s.Disks[1])
	}
	out := Render(Frame{At: t0, Disks: s}, 0, Plain())
	if !strings.Contains(out, "5.0 GiB free of 100.0 GiB (5%), under 10% free") || !regexp.MustCompile(`/mnt/weights +does not answer`).MatchString(out) {
		t.Errorf("frame:\n%s", out)
	}
	// The real statfs on a real directory.
	s = DisksReader{}.Read(datadir.New(t.TempDir()), stamp{}, Timeout)
	if len(s.Disks) != 1 || s.Disks[0].Err != "" || s.Disks[0].Total == 0 {
		t.Errorf("real statfs: %+v", s.Disks)
	}
}
