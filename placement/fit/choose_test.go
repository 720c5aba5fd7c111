package fit_test

import (
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/llmgw/llmgw/placement/fit"
	"github.com/llmgw/llmgw/placement/fit/fittest"
)

// Kinds: one row per name and size, the most one node has (the first
// node by name among equals), MIG instances and other types left out,
// largest first.
func TestKinds(t *testing.T) {
	h100 := fit.GPU{Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30}
	l4 := fit.GPU{Name: "NVIDIA L4", MemoryBytes: 24 << 30}
	mig := fit.GPU{Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, MIG: true}
	nodes := []fit.NodeGPUs{
		{Node: "c", GPUs: []fit.GPU{l4, h100, h100}},
		{Node: "b", GPUs: []fit.GPU{h100, h100, mig, mig, mig}},
		{Node: "a", GPUs: []fit.GPU{l4, l4, l4}},
	}
	got := fit.Kinds(nodes, "")
	want := []fit.GPUKind{
		{Name: h100.Name, MemoryBytes: 80 << 30, PerNode: 2, Node: "b"},
		{Name: l4.Name, MemoryBytes: 24 << 30, PerNode: 3, Node: "a"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Kinds = %+v, want %+v", got, want)
	}
	if got := fit.Kinds(nodes, "h100"); len(got) != 1 || got[0].Name != h100.Name {
		t.Errorf("Kinds matching h100 = %+v, want the H100 alone", got)
	}
	if got := fit.Kinds(nodes, "A100"); len(got) != 0 {
		t.Errorf("Kinds matching A100 = %+v, want none", got)
	}
}

// ChooseTP (place --tp auto, over the cluster's kinds) and OnKind with
// tpAuto (llmgw fit, one row per kind) are one rule: the chosen size is
// the smallest of each kind's own, and a kind holds the model at its own
// size exactly when its row says it fits.
func TestChooseTPAgreesWithEachKind(t *testing.T) {
	ps := profiles(t)
	rapid.Check(t, func(t *rapid.T) {
		p := ps[rapid.IntRange(0, len(ps)-1).Draw(t, "model")]
		r := fit.Request{MaxModelLen: rapid.IntRange(1, p.Config.MaxContext).Draw(t, "ctx"),
			MaxNumSeqs: rapid.IntRange(1, 8).Draw(t, "seqs"), PipelineParallel: rapid.IntRange(1, 2).Draw(t, "pp")}
		var kinds []fit.GPUKind
		for i := range rapid.IntRange(1, 3).Draw(t, "kinds") {
			kinds = append(kinds, fit.GPUKind{Name: string(rune('a' + i)),
				MemoryBytes: uint64(rapid.IntRange(8, 160).Draw(t, "gib")) << 30, PerNode: rapid.IntRange(1, 8).Draw(t, "per node")})
		}
		tp, held, err := p.ChooseTP(r, kinds)
		if err != nil {
			t.Skip(err)
		}
		e, err := p.Estimate(r)
		if err != nil {
			t.Fatalf("ChooseTP had no error, Estimate has: %v", err)
		}
		best := 0
		for _, k := range kinds {
			row := p.OnKind(e, k, true)
			if !row.Fits {
				continue
			}
			if best == 0 || row.TensorParallel < best {
				best = row.TensorParallel
			}
			at := r
			at.TensorParallel = row.TensorParallel
			ek, err := p.Estimate(at)
			if err != nil || !k.Holds(ek) {
				t.Fatalf("kind %+v: its row fits at TP %d, but it does not hold that (%v)", k, row.TensorParallel, err)
			}
		}
		if held != (best > 0) || (held && tp != best) {
			t.Fatalf("ChooseTP = %d (held %v); the kinds' own smallest: %d", tp, held, best)
		}
		if !held && tp > 1 && p.CheckSplit(tp, r.PipelineParallel) != nil {
			t.Fatalf("ChooseTP's best try %d is not a valid split", tp)
		}
	})
}

// Nothing fits: the best try is the largest split some node has GPUs for,
// and the kinds named by hand (PerNode 0) allow any split.
func TestChooseTPBestTry(t *testing.T) {
	p, err := fit.Analyze(model(t, fittest.Mixtral8x7B()), "")
	if err != nil {
		t.Fatal(err)
	}
	r := fit.Request{MaxModelLen: 32768}
	small := []fit.GPUKind{{Name: "L4", MemoryBytes: 24 << 30, PerNode: 2}, {Name: "T4", MemoryBytes: 16 << 30, PerNode: 4}}
	if tp, held, err := p.ChooseTP(r, small); err != nil || held || tp != 4 {
		t.Errorf("Mixtral on 2 × L4 or 4 × T4: TP %d held %v err %v, want the best try TP 4, not held", tp, held, err)
	}
	if tp, held, err := p.ChooseTP(r, []fit.GPUKind{{Name: "H100", MemoryBytes: 80 << 30}}); err != nil || !held || tp != 2 {
		t.Errorf("Mixtral on H100s, count not known: TP %d held %v err %v, want 2", tp, held, err)
	}
	if _, _, err := p.ChooseTP(fit.Request{MaxModelLen: 1 << 20}, small); err == nil {
		t.Error("a context longer than the model's: no error")
	}
}

// The kind a split is sized for is the largest one node of which has that
// many GPUs.
func TestSizedFor(t *testing.T) {
	kinds := []fit.GPUKind{{Name: "big", MemoryBytes: 141 << 30, PerNode: 2}, {Name: "mid", MemoryBytes: 80 << 30, PerNode: 8}}
	for _, c := range []struct {
		tp   int
		want string
	}{{1, "big"}, {2, "big"}, {4, "mid"}, {8, "mid"}, {16, ""}} {
		k, ok := fit.SizedFor(kinds, c.tp)
		if k.Name != c.want || ok != (c.want != "") {
			t.Errorf("SizedFor(tp %d) = %q, %v; want %q", c.tp, k.Name, ok, c.want)
		}
	}
}
