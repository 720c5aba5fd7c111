package gpu

import (
	"context"
	"strings"
	"testing"
)

func TestParseSimulated(t *testing.T) {
	gs, err := ParseSimulated("4xH100-80GB, 2×L40S-48GB", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(gs) != 6 {
		t.Fatalf("got %d GPUs", len(gs))
	}
	for i, g := range gs {
		if g.Index != i {
			t.Errorf("GPU %d has index %d", i, g.Index)
		}
		name, total := "NVIDIA H100 80GB", uint64(80<<30)
		if i >= 4 {
			name, total = "NVIDIA L40S 48GB", 48<<30
		}
		if g.Name != name || g.MemoryTotal != total || g.MemoryUsed != 0 {
			t.Errorf("GPU %d = %+v", i, g)
		}
		if len(g.UUID) != len("GPU-8b38414a-24cf-3fdb-ca7d-672639ff58e5") || !strings.HasPrefix(g.UUID, "GPU-") {
			t.Errorf("GPU %d UUID %q is not shaped like NVML's", i, g.UUID)
		}
	}

	again, _ := ParseSimulated("4xH100-80GB,2xL40S-48GB", "node-a")
	other, _ := ParseSimulated("4xH100-80GB,2xL40S-48GB", "node-b")
	seen := map[string]bool{}
	for i := range gs {
		if again[i].UUID != gs[i].UUID {
			t.Errorf("UUID %d not stable: %s vs %s", i, gs[i].UUID, again[i].UUID)
		}
		for _, u := range []string{gs[i].UUID, other[i].UUID} {
			if seen[u] {
				t.Errorf("UUID %s appears twice across two nodes", u)
			}
			seen[u] = true
		}
	}
}

func TestParseSimulatedBad(t *testing.T) {
	for spec, wantIn := range map[string]string{
		"":                        "empty spec",
		"H100-80GB":               `part 1 "H100-80GB": does not start with a count`,
		"0xH100-80GB":             "count must be a positive number",
		"4H100-80GB":              `no "x" after the count`,
		"4xH100":                  `no "-<memory>GB"`,
		"4x-80GB":                 "no model",
		"4xH100-80":               `memory "80" does not end in GB`,
		"4xH100-eightyGB":         "not a positive whole number",
		"4xH100-0GB":              "not a positive whole number",
		"4xH100-80GB,,":           `part 2 ""`,
		"4xH100-80GB,2xL4 0-24GB": `part 2 "2xL4 0-24GB": model "L4 0"`,
		"2000xH100-80GB":          "more than 1024 GPUs",
	} {
		_, err := ParseSimulated(spec, "n1")
		if err == nil || !strings.Contains(err.Error(), wantIn) {
			t.Errorf("ParseSimulated(%q) = %v, want error containing %q", spec, err, wantIn)
			continue
		}
		if !strings.Contains(err.Error(), "4xH100-80GB") && spec != "2000xH100-80GB" {
			t.Errorf("error for %q does not show the expected form: %v", spec, err)
		}
	}
	if _, err := ParseSimulated("1xH100-80GB", ""); err == nil || !strings.Contains(err.Error(), "seed") {
		t.Errorf("empty seed: %v", err)
	}
}

func TestSimulatedDiscoverer(t *testing.T) {
	s, err := NewSimulated("2xA100-40GB", "n1")
	if err != nil {
		t.Fatal(err)
	}
	snap, err := s.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !snap.Available || !snap.Simulated || len(snap.GPUs) != 2 || snap.GPUs[1].Name != "NVIDIA A100 40GB" {
		t.Fatalf("snapshot = %+v", snap)
	}
	snap.GPUs[0].Name = "changed"
	again, _ := s.Discover(context.Background())
	if again.GPUs[0].Name != "NVIDIA A100 40GB" {
		t.Error("a caller's change leaked into the discoverer")
	}
	if _, err := NewSimulated("nonsense", "n1"); err == nil {
		t.Error("bad spec accepted")
	}
}

func TestWithClaims(t *testing.T) {
	gpus, err := ParseSimulated("3xH100-80GB", "n1")
	if err != nil {
		t.Fatal(err)
	}
	got := WithClaims(gpus, []Claim{{Index: 0, Bytes: 20 << 30}, {Index: 0, Bytes: 30 << 30}, {Index: 1}, {Index: 2, Bytes: 100 << 30}})
	for i, want := range []uint64{50 << 30, 80 << 30, 80 << 30} {
		if got[i].MemoryUsed != want {
			t.Errorf("GPU %d used %d, want %d", i, got[i].MemoryUsed, want)
		}
	}
	if gpus[0].MemoryUsed != 0 {
		t.Error("WithClaims changed its input")
	}
}

// Simulated GPUs report the H200's share of driver-reserved memory, which
// ForeignMemory counts as foreign: under 1 GiB, so an empty simulated GPU
// still takes a whole-GPU shard, and over 0, so a share of the whole GPU
// is refused as vLLM would refuse it.
func TestSimulatedReserved(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct{ total, want uint64 }{
		{143771 * mib, 616 * mib}, // the measured H200
		{80 << 30, 351 * mib},
		{48 << 30, 211 * mib},
	} {
		if got := SimulatedReserved(c.total); got != c.want {
			t.Errorf("SimulatedReserved(%d MiB) = %d MiB, want %d MiB", c.total/mib, got/mib, c.want/mib)
		}
	}
	s, err := NewSimulated("2xH100-80GB", "n")
	if err != nil {
		t.Fatal(err)
	}
	snap, err := s.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range ForeignMemory(snap, nil) {
		if g.MemoryForeign != 351*mib || g.MemoryUsed != 0 {
			t.Errorf("GPU %d: foreign %d, used %d; want the 351 MiB reserved as foreign", g.Index, g.MemoryForeign, g.MemoryUsed)
		}
	}
}
