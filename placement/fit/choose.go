package fit

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Choosing a tensor-parallel size and the GPU types to size for. Who lists
// the cluster's GPUs differs (the node that accepts a place reads gossip,
// `llmgw fit` asks a node's /v1/cluster); what follows from that list is
// decided here, once, so that `place --tp auto` and `llmgw fit` agree.

// MaxTensorParallel is the largest tensor-parallel size tried (CheckSplit
// refuses more).
const MaxTensorParallel = 64

// GPU is one GPU a node reports, as far as sizing needs it.
type GPU struct {
	Name        string
	MemoryBytes uint64
	// MIG: a MIG instance, never sized for (its memory is a slice).
	MIG bool
}

// NodeGPUs is one node's GPUs. Callers pass only the nodes that count
// (alive or suspect), which this package cannot judge.
type NodeGPUs struct {
	Node string
	GPUs []GPU
}

// GPUKind is one GPU type: a name and a memory size, the most GPUs of it
// one node has, and that node.
type GPUKind struct {
	Name        string `json:"name"`
	MemoryBytes uint64 `json:"memory_bytes"`
	// PerNode is the most one node has; 0 when not known (a type named by
	// hand), which allows any split up to MaxTensorParallel.
	PerNode int `json:"per_node,omitempty"`
	// Node has PerNode of them (the first by name among equals).
	Node string `json:"-"`
}

// Kinds lists the GPU types of nodes whose names contain gpuType (any
// case, as placement matches gpu_type; "" matches all), MIG instances left
// out, largest memory first, then by name.
func Kinds(nodes []NodeGPUs, gpuType string) []GPUKind {
	type key struct {
		name  string
		bytes uint64
	}
	var kinds []GPUKind
	for _, n := range nodes {
		count := map[key]int{}
		var order []key
		for _, g := range n.GPUs {
			if g.MIG || !strings.Contains(strings.ToLower(g.Name), strings.ToLower(gpuType)) {
				continue
			}
			k := key{g.Name, g.MemoryBytes}
			if count[k] == 0 {
				order = append(order, k)
			}
			count[k]++
		}
		for _, k := range order {
			c := count[k]
			i := slices.IndexFunc(kinds, func(x GPUKind) bool { return x.Name == k.name && x.MemoryBytes == k.bytes })
			switch {
			case i < 0:
				kinds = append(kinds, GPUKind{Name: k.name, MemoryBytes: k.bytes, PerNode: c, Node: n.Node})
			case c > kinds[i].PerNode || (c == kinds[i].PerNode && n.Node < kinds[i].Node):
				kinds[i].PerNode, kinds[i].Node = c, n.Node
			}
		}
	}
	slices.SortFunc(kinds, func(a, b GPUKind) int {
		if a.MemoryBytes != b.MemoryBytes {
			return -cmp.Compare(a.MemoryBytes, b.MemoryBytes)
		}
		return strings.Compare(a.Name, b.Name)
	})
	return kinds
}

// maxTP is the largest split one node's GPUs of k allow.
func (k GPUKind) maxTP() int {
	if k.PerNode <= 0 {
		return MaxTensorParallel
	}
	return min(k.PerNode, MaxTensorParallel)
}

// Holds reports whether one node's GPUs of kind k hold e: as many GPUs as
// its tensor-parallel size, each with room for its per-GPU figure.
func (k GPUKind) Holds(e Estimate) bool {
	return k.maxTP() >= e.Request.TensorParallel && e.PerGPU.Total <= k.MemoryBytes
}

// ChooseTP is the tensor-parallel size `tensor_parallel: auto` takes: the
// smallest that the heads allow and that one node's GPUs of some kind hold
// (Holds). held is false when no size does; tp is then the largest split
// some node has GPUs for, so that a refusal shows the figure of the best
// try. It is the smallest of SmallestTP over the kinds. The error is
// Estimate's, for a request no split can serve (a context longer than the
// model's, say).
func (p Profile) ChooseTP(r Request, kinds []GPUKind) (tp int, held bool, err error) {
	for tp := 1; tp <= MaxTensorParallel; tp++ {
		if p.CheckSplit(tp, max(r.PipelineParallel, 1)) != nil {
			continue
		}
		r.TensorParallel = tp
		e, err := p.Estimate(r)
		if err != nil {
			return 0, false, err
		}
		if slices.ContainsFunc(kinds, func(k GPUKind) bool { return k.Holds(e) }) {
			return tp, true, nil
		}
	}
	return p.largestSplit(kinds, r.PipelineParallel), false, nil
}

// largestSplit is the largest valid tensor-parallel size some node has
// GPUs for (1 when none is larger).
func (p Profile) largestSplit(kinds []GPUKind, pp int) int {
	best := 1
	for _, k := range kinds {
		for tp := k.maxTP(); tp > best; tp-- {
			if p.CheckSplit(tp, max(pp, 1)) == nil {
				best = tp
				break
			}
		}
	}
	return best
}

// GPUFit is what one GPU type buys a model served as asked: the row
// `llmgw fit` prints per GPU type.
type GPUFit struct {
	GPUKind
	TensorParallel int    `json:"tensor_parallel"`
	PerGPUBytes    uint64 `json:"per_gpu_bytes"`
	Fits           bool   `json:"fits"`
	// MaxModelLen is the longest context of one sequence that fits, and
	// MaxNumSeqs how many sequences of the requested context fit at once.
	MaxModelLen int `json:"max_model_len"`
	MaxNumSeqs  int `json:"max_num_seqs"`
	// Why it does not fit ("" when it does).
	Why string `json:"why,omitempty"`
}

// OnKind sizes e, the model served as asked, for GPU kind k. With tpAuto
// the tensor-parallel size is the smallest that fits k (SmallestTP up to
// what one node has) instead of e's.
func (p Profile) OnKind(e Estimate, k GPUKind, tpAuto bool) GPUFit {
	g := GPUFit{GPUKind: k, TensorParallel: e.Request.TensorParallel, PerGPUBytes: e.PerGPU.Total}
	r := e.Request
	if tpAuto {
		if best, err := p.SmallestTP(r, k.MemoryBytes, k.maxTP()); err == nil {
			r.TensorParallel, g.TensorParallel, g.PerGPUBytes = best.Request.TensorParallel, best.Request.TensorParallel, best.PerGPU.Total
		} else {
			g.Why = err.Error()
		}
	}
	if k.PerNode > 0 && k.PerNode < g.TensorParallel {
		g.Why = fmt.Sprintf("TP %d needs %d GPUs on one node; the most one node has is %d", g.TensorParallel, g.TensorParallel, k.PerNode)
	}
	g.Fits = g.Why == "" && g.PerGPUBytes <= k.MemoryBytes
	if !g.Fits && g.Why == "" {
		g.Why = fmt.Sprintf("needs %s per GPU at TP %d", GiB(g.PerGPUBytes), g.TensorParallel)
	}
	one := r
	one.MaxNumSeqs = 1
	g.MaxModelLen = p.MaxModelLen(one, k.MemoryBytes)
	g.MaxNumSeqs = p.MaxSeqs(r, k.MemoryBytes)
	return g
}

// SizedFor is the GPU kind a figure at tensor-parallel size tp is sized
// for: the largest kind (kinds come largest first, see Kinds) one node of
// which has tp GPUs. It is the kind resolveAuto's "could ever hold" test
// passes on, so a deployment without max_num_seqs gets the sequences that
// kind holds (ChooseSeqs); with gpu_type the operator picks a smaller one.
func SizedFor(kinds []GPUKind, tp int) (GPUKind, bool) {
	i := slices.IndexFunc(kinds, func(k GPUKind) bool { return k.maxTP() >= tp })
	if i < 0 {
		return GPUKind{}, false
	}
	return kinds[i], true
}
