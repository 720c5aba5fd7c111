package fit_test

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/llmgw/llmgw/placement/fit"
	"github.com/llmgw/llmgw/placement/fit/fittest"
)

func profiles(t *testing.T) []fit.Profile {
	var out []fit.Profile
	for _, f := range []fittest.Family{fittest.Llama31_8B(), fittest.Gemma2_9B(), fittest.Mixtral8x7B(), fittest.Qwen25_7B_AWQ(), fittest.Llama31_8B_Q4KM()} {
		p, err := fit.Analyze(model(t, f), "")
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// More context or more sequences never needs less memory; more GPUs never
// need more per GPU for weights and KV; the total is always the sum of
// the terms shown.
func TestEstimateMonotone(t *testing.T) {
	ps := profiles(t)
	rapid.Check(t, func(t *rapid.T) {
		p := ps[rapid.IntRange(0, len(ps)-1).Draw(t, "model")]
		ctx := rapid.IntRange(1, p.Config.MaxContext-1).Draw(t, "ctx")
		seqs := rapid.IntRange(1, 64).Draw(t, "seqs")
		tp := rapid.SampledFrom([]int{1, 2, 4}).Draw(t, "tp")
		pp := rapid.IntRange(1, 4).Draw(t, "pp")
		r := fit.Request{TensorParallel: tp, PipelineParallel: pp, MaxModelLen: ctx, MaxNumSeqs: seqs}
		e, err := p.Estimate(r)
		if err != nil {
			t.Skip(err)
		}
		b := e.PerGPU
		if b.Total != b.Weights+b.KVCache+b.Framework+b.Activations+b.CUDAGraphs {
			t.Fatalf("total %d is not the sum of %+v", b.Total, b)
		}
		more := r
		more.MaxModelLen++
		more.MaxNumSeqs++
		if e2, err := p.Estimate(more); err != nil || e2.PerGPU.KVCache < b.KVCache || e2.PerGPU.Total < b.Total {
			t.Fatalf("one more token and sequence: %+v (err %v) after %+v", e2.PerGPU, err, b)
		}
		wider := r
		wider.TensorParallel *= 2
		if e3, err := p.Estimate(wider); err == nil && e3.PerGPU.Weights+e3.PerGPU.KVCache > b.Weights+b.KVCache {
			t.Fatalf("TP %d needs more weights and KV per GPU than TP %d: %+v vs %+v", 2*tp, tp, e3.PerGPU, b)
		}
	})
}

// MaxModelLen and MaxSeqs are exact boundaries: the answer fits and one
// more does not.
func TestCapacityBoundaries(t *testing.T) {
	ps := profiles(t)
	rapid.Check(t, func(t *rapid.T) {
		p := ps[rapid.IntRange(0, len(ps)-1).Draw(t, "model")]
		gpu := uint64(rapid.IntRange(8, 200).Draw(t, "gib")) << 30
		r := fit.Request{MaxNumSeqs: rapid.IntRange(1, 16).Draw(t, "seqs"), TensorParallel: rapid.SampledFrom([]int{1, 2}).Draw(t, "tp")}
		n := p.MaxModelLen(r, gpu)
		total := func(ctx, seqs int) uint64 {
			q := r
			q.MaxModelLen, q.MaxNumSeqs = ctx, seqs
			e, err := p.Estimate(q)
			if err != nil {
				t.Fatal(err)
			}
			return e.PerGPU.Total
		}
		if n > 0 && total(n, r.MaxNumSeqs) > gpu {
			t.Fatalf("MaxModelLen %d does not fit in %d", n, gpu)
		}
		if n < p.Config.MaxContext && total(n+1, r.MaxNumSeqs) <= gpu {
			t.Fatalf("MaxModelLen %d, but %d fits too", n, n+1)
		}
		if n == 0 {
			return
		}
		r.MaxModelLen = n
		s := p.MaxSeqs(r, gpu)
		if s < r.MaxNumSeqs || total(n, s) > gpu || total(n, s+1) <= gpu {
			t.Fatalf("MaxSeqs %d at %d tokens is not the boundary", s, n)
		}
	})
}

func TestSmallestTP(t *testing.T) {
	p, err := fit.Analyze(model(t, fittest.Mixtral8x7B()), "")
	if err != nil {
		t.Fatal(err)
	}
	e, err := p.SmallestTP(fit.Request{MaxModelLen: 32768}, 80<<30, 8)
	if err != nil {
		t.Fatal(err)
	}
	// 93.4 GB of weights: two 80 GiB GPUs hold it.
	if e.Request.TensorParallel != 2 {
		t.Errorf("smallest TP for Mixtral on 80 GiB = %d, want 2 (%+v)", e.Request.TensorParallel, e.PerGPU)
	}
	if _, err := p.SmallestTP(fit.Request{}, 8<<30, 8); err == nil {
		t.Error("Mixtral on 8 GiB GPUs up to TP 8: no error")
	}
}

// ChooseSeqs, the sequences a deployment without max_num_seqs is sized
// for: between 0 and DefaultMaxSeqs; what it chose fits an empty GPU less
// the reserve and one more does not (below the cap); more GPUs or a larger
// GPU never hold fewer.
func TestChooseSeqs(t *testing.T) {
	ps := profiles(t)
	rapid.Check(t, func(t *rapid.T) {
		p := ps[rapid.IntRange(0, len(ps)-1).Draw(t, "model")]
		gpu := uint64(rapid.IntRange(8, 200).Draw(t, "gib")) << 30
		tp := rapid.SampledFrom([]int{1, 2, 4}).Draw(t, "tp")
		if p.CheckSplit(tp, 1) != nil || p.CheckSplit(2*tp, 1) != nil {
			t.Skip("split")
		}
		r := fit.Request{TensorParallel: tp, MaxModelLen: rapid.IntRange(1, p.Config.MaxContext).Draw(t, "ctx")}
		k := fit.GPUKind{Name: "g", MemoryBytes: gpu}
		n := p.ChooseSeqs(r, k)
		if n < 0 || n > fit.DefaultMaxSeqs {
			t.Fatalf("ChooseSeqs = %d, want 0 to %d", n, fit.DefaultMaxSeqs)
		}
		total := func(q fit.Request, seqs int) uint64 {
			q.MaxNumSeqs = seqs
			e, err := p.Estimate(q)
			if err != nil {
				t.Fatal(err)
			}
			return e.PerGPU.Total
		}
		room := gpu - fit.EmptyGPUReserve
		if n > 0 && total(r, n) > room {
			t.Fatalf("%d sequences need %d, more than the %d an empty GPU offers", n, total(r, n), room)
		}
		if n < fit.DefaultMaxSeqs && total(r, n+1) <= room {
			t.Fatalf("ChooseSeqs = %d, but %d fit", n, n+1)
		}
		wider := r
		wider.TensorParallel *= 2
		if m := p.ChooseSeqs(wider, k); m < n {
			t.Fatalf("TP %d holds %d sequences, TP %d only %d", tp, n, 2*tp, m)
		}
		if m := p.ChooseSeqs(r, fit.GPUKind{Name: "g", MemoryBytes: gpu + 8<<30}); m < n {
			t.Fatalf("%d GiB holds %d sequences, 8 GiB more only %d", gpu>>30, n, m)
		}
	})
}
