package fit

import (
	"fmt"
	"sort"
)

// MaxModelLen is the longest context, for r's number of sequences, whose
// per-GPU figure fits in gpuBytes; 0 when not even one token fits. It never
// exceeds the model's own context.
func (p Profile) MaxModelLen(r Request, gpuBytes uint64) int {
	r = r.withDefaults(p)
	hi := p.Config.MaxContext
	if hi <= 0 {
		hi = 1 << 20
	}
	fits := func(ctx int) bool {
		r.MaxModelLen = ctx
		e, err := p.Estimate(r)
		return err == nil && e.PerGPU.Total <= gpuBytes
	}
	// The figure grows with ctx, so the first length that does not fit
	// bounds the search.
	n := sort.Search(hi, func(i int) bool { return !fits(i + 1) })
	return n
}

// MaxSeqs is how many sequences of r.MaxModelLen tokens fit in gpuBytes at
// once; 0 when not one does.
func (p Profile) MaxSeqs(r Request, gpuBytes uint64) int {
	r = r.withDefaults(p)
	fits := func(n int) bool {
		r.MaxNumSeqs = n
		e, err := p.Estimate(r)
		return err == nil && e.PerGPU.Total <= gpuBytes
	}
	return sort.Search(1<<16, func(i int) bool { return !fits(i + 1) })
}

// SmallestTP is the smallest tensor-parallel size, up to maxTP, that the
// heads allow and whose per-GPU figure fits in gpuBytes. The error says
// what the largest allowed split still needs.
func (p Profile) SmallestTP(r Request, gpuBytes uint64, maxTP int) (Estimate, error) {
	var last Estimate
	tried := false
	for tp := 1; tp <= maxTP; tp++ {
		if p.CheckSplit(tp, max(r.PipelineParallel, 1)) != nil {
			continue
		}
		r.TensorParallel = tp
		e, err := p.Estimate(r)
		if err != nil {
			return Estimate{}, err
		}
		if e.PerGPU.Total <= gpuBytes {
			return e, nil
		}
		last, tried = e, true
	}
	if !tried {
		return Estimate{}, fmt.Errorf("no tensor-parallel size up to %d divides the model's %d attention heads and %d KV heads", maxTP, p.Config.NumHeads, p.Config.kvHeads())
	}
	return last, fmt.Errorf("needs %s per GPU even at TP %d; the GPU has %s", GiB(last.PerGPU.Total), last.Request.TensorParallel, GiB(gpuBytes))
}

// GiB writes a size in GiB with one decimal, as the reasons and the CLI show
// them.
func GiB(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/gib) }

// DefaultMaxSeqs caps the sequences a gpu_memory: auto figure is sized for
// when the deployment names no max_num_seqs. vLLM and SGLang size their KV
// cache from the memory they are given and schedule as many sequences as it
// holds, so the figure only decides how much memory to ask for: enough for
// this many full-context sequences, or fewer when the GPU holds fewer.
const DefaultMaxSeqs = 16

// EmptyGPUReserve is what an empty GPU keeps from placement: the driver's
// reserved memory (616 MiB on an H200, see probes/gpu) counts as foreign,
// and placement rounds foreign memory up to whole GiB. A figure sized to
// the last byte of a GPU could never be placed on one.
const EmptyGPUReserve = 1 << 30

// ChooseSeqs is the number of sequences of r.MaxModelLen tokens (the
// model's own context when unset) that a deployment without max_num_seqs
// is sized for on GPU kind k at r's split: the most that fit in an empty
// GPU of k (less EmptyGPUReserve), at most DefaultMaxSeqs; 0 when not one
// does.
func (p Profile) ChooseSeqs(r Request, k GPUKind) int {
	if k.MemoryBytes <= EmptyGPUReserve {
		return 0
	}
	return min(DefaultMaxSeqs, p.MaxSeqs(r, k.MemoryBytes-EmptyGPUReserve))
}
