package gpu

import (
	"maps"
	"slices"
	"testing"
	"testing/fstest"

	"github.com/llmgw/llmgw/placement"
)

func stat(pid, ppid, comm string) *fstest.MapFile {
	return &fstest.MapFile{Data: []byte(pid + " (" + comm + ") S " + ppid + " 1 1 0 -1 4194560\n")}
}

func TestOwnPIDs(t *testing.T) {
	proc := fstest.MapFS{
		"1/stat":    stat("1", "0", "systemd"),
		"100/stat":  stat("100", "1", "python3"),               // vllm serve (our engine)
		"101/stat":  stat("101", "100", "VLLM::EngineCore"),    // its engine core
		"102/stat":  stat("102", "101", "VLLM::Worker TP0 )x"), // a name with ") " in it
		"103/stat":  stat("103", "101", "VLLM::Worker TP1"),
		"200/stat":  stat("200", "1", "python3"), // someone else's
		"201/stat":  stat("201", "200", "python3"),
		"self/stat": stat("300", "1", "llmgw"), // not numeric: skipped
		"meminfo":   &fstest.MapFile{Data: []byte("MemTotal: 1 kB\n")},
		"400/stat":  &fstest.MapFile{Data: []byte("garbage")},
	}
	got := OwnPIDs(proc, []int{100, 999})
	keys := slices.Sorted(maps.Keys(got))
	if want := []int{100, 101, 102, 103, 999}; !slices.Equal(keys, want) {
		t.Errorf("OwnPIDs = %v, want %v", keys, want)
	}
	if got := OwnPIDs(fstest.MapFS{}, nil); len(got) != 0 {
		t.Errorf("empty = %v", got)
	}
}

func TestForeignMemory(t *testing.T) {
	snap := Snapshot{
		GPUs: []placement.GPU{
			{Index: 0, MemoryUsed: 70 << 30, NVLinkPeers: []int{1}},
			{Index: 1, MemoryUsed: 10 << 30},
			{Index: 2, MemoryUsed: 1 << 30},
		},
		Processes: []GPUProcess{
			{PID: 101, GPUIndex: 0, UsedBytes: 40 << 30},
			{PID: 102, GPUIndex: 0, UsedBytes: 20 << 30},
			{PID: 500, GPUIndex: 0, UsedBytes: 9 << 30},
			{PID: 500, GPUIndex: 1, UsedBytes: 9 << 30},
			// NVML's process figure can briefly exceed used: never below 0.
			{PID: 101, GPUIndex: 2, UsedBytes: 2 << 30},
		},
	}
	gs := ForeignMemory(snap, map[int]bool{101: true, 102: true})
	want := []uint64{10 << 30, 10 << 30, 0}
	for i, g := range gs {
		if g.MemoryForeign != want[i] {
			t.Errorf("GPU %d foreign = %d GiB, want %d GiB", i, g.MemoryForeign>>30, want[i]>>30)
		}
	}
	gs[0].NVLinkPeers[0] = 7
	if snap.GPUs[0].NVLinkPeers[0] != 1 {
		t.Error("ForeignMemory's result shares NVLinkPeers with the snapshot")
	}
}

// vLLM starts only when free memory (total − used − reserved) is at least
// its fraction × total, the fraction being share/total. With reserved
// memory counted as foreign, placement's own rule (total − foreign −
// promised ≥ share) keeps it: an empty H200 with 616 MiB reserved cannot
// take a share of total − reserved + 1 byte, and still takes a share of
// total − 1 GiB, or the whole GPU.
func TestReservedMemoryRefusesAShareVLLMWouldRefuse(t *testing.T) {
	const mib = 1 << 20
	total := uint64(143771 * mib)
	snap := Snapshot{
		GPUs:     []placement.GPU{{Index: 0, UUID: "GPU-0", Name: "NVIDIA H200", MemoryTotal: total}},
		Reserved: map[int]uint64{0: 616 * mib},
	}
	node := placement.Node{Name: "n", Alive: true, GPUs: ForeignMemory(snap, nil)}
	for _, c := range []struct {
		share  uint64
		placed bool
	}{
		{total - 616*mib + 1, false},
		{total - 1<<30, true},
		{0, true}, // the whole GPU: 616 MiB of foreign memory is an empty GPU still
	} {
		d := placement.Deployment{Name: "d", Model: "m", Replicas: 1, GPUMemory: placement.Bytes(c.share)}.WithDefaults()
		plan := placement.Compute(placement.View{Nodes: []placement.Node{node}, Deployments: []placement.Deployment{d}})
		if placed := len(plan.Assignments) == 1; placed != c.placed {
			t.Errorf("share %d MiB of %d MiB: placed %v, want %v (%+v)", c.share/mib, total/mib, placed, c.placed, plan.Unplaced)
		}
	}
}
