package placement

import (
	"cmp"
	"encoding/binary"
	"slices"
	"strings"
)

// Capacity accounting and the index of live nodes by state (classes).

// wholeGPUForeignSlack is how much memory of processes llmgw does not own a
// GPU may carry and still count as free for a whole-GPU shard: a display
// server or monitoring agent, not another workload.
const wholeGPUForeignSlack = 1 << 30

// foreignQuantum: foreign memory is rounded up to whole GiB before fitting.
// The probe derives it as used minus what our engines account for, which
// wobbles by a few MiB from one reading to the next. Rounding up is
// conservative (placement may leave under 1GiB per GPU unused, never
// over-commit), keeps such noise from changing the plan, and lets nodes
// that differ only by noise share a class.
const foreignQuantum = 1 << 30

func roundForeign(b uint64) uint64 {
	if r := b % foreignQuantum; r != 0 {
		return satAdd(b-r, foreignQuantum)
	}
	return b
}

// maxNVLinkGPUs is how many GPUs of a node NVLink masks cover; GPUs past it
// are placed as if they had no NVLink (no node sold today has more than 16).
const maxNVLinkGPUs = 64

// gpuState is one GPU as placement accounts it: what the node advertised
// plus what our own shards were promised on it.
type gpuState struct {
	index   int
	name    string // as advertised, for reasons
	lname   string // lower-cased, for the GPU type filter
	total   uint64
	foreign uint64
	// promised is the memory promised to memory-sized shards of ours.
	promised uint64
	// whole is set when a whole-GPU shard of ours sits here.
	whole   bool
	mig     bool
	faulted bool
	// nvlink has bit p set when the GPU at position p of the node (not GPU
	// index p) is an NVLink peer.
	nvlink uint64
}

// usable: MIG-enabled and faulted GPUs take nothing new.
func (g *gpuState) usable() bool { return !g.mig && !g.faulted }

// capacity is what llmgw may ever use on the GPU.
func (g *gpuState) capacity() uint64 { return satSub(g.total, g.foreign) }

// free is what is left for a memory-sized shard.
func (g *gpuState) free() uint64 {
	if g.whole {
		return 0
	}
	return satSub(g.capacity(), g.promised)
}

// wholeFree: a whole-GPU shard needs nothing of ours on the GPU and almost
// nothing of anyone else's.
func (g *gpuState) wholeFree() bool {
	return g.usable() && !g.whole && g.promised == 0 && g.foreign <= wholeGPUForeignSlack
}

// reserve records a shard of ours on the GPU (mem 0: the whole GPU).
func (g *gpuState) reserve(mem uint64) {
	if mem == 0 {
		g.whole = true
		return
	}
	g.promised = satAdd(g.promised, mem)
}

// buildGPUs appends a node's advertised GPUs to dst as accounting state,
// sorted by index, with duplicate indices dropped (a node reporting one
// index twice is broken; keeping the first in a total order keeps the plan
// independent of the order they came in).
func (p *planner) buildGPUs(dst []gpuState, in []GPU) []gpuState {
	src := in
	if !sortedByIndex(in) { // the usual record is sorted already: skip the copy
		src = slices.Clone(in)
		slices.SortFunc(src, compareGPU)
		src = slices.CompactFunc(src, func(a, b GPU) bool { return a.Index == b.Index })
	}
	base := len(dst)
	dense := true // GPU index equals position, as NVML numbers them
	for i := range src {
		g := &src[i]
		dst = append(dst, gpuState{
			index:   g.Index,
			name:    g.Name,
			lname:   p.lower(g.Name),
			total:   g.MemoryTotal,
			foreign: roundForeign(g.MemoryForeign),
			mig:     g.MIG,
			faulted: g.Faulted,
		})
		dense = dense && g.Index == i
	}
	out := dst[base:]
	for i := range src {
		if i >= maxNVLinkGPUs {
			break
		}
		for _, peer := range src[i].NVLinkPeers {
			j, ok := peer, peer >= 0 && peer < len(out)
			if !dense {
				j, ok = gpuPos(out, peer)
			}
			if ok && j != i && j < maxNVLinkGPUs {
				// A link is a link whichever end reports it.
				out[i].nvlink |= 1 << j
				out[j].nvlink |= 1 << i
			}
		}
	}
	return dst
}

func sortedByIndex(gs []GPU) bool {
	for i := 1; i < len(gs); i++ {
		if gs[i-1].Index >= gs[i].Index {
			return false
		}
	}
	return true
}

// compareGPU orders GPUs by index and, for the broken case of a repeated
// index, by everything placement reads, so the survivor does not depend on
// input order.
func compareGPU(a, b GPU) int {
	if c := a.Index - b.Index; c != 0 {
		return sign(c)
	}
	if c := strings.Compare(a.UUID, b.UUID); c != 0 {
		return c
	}
	if c := strings.Compare(a.Name, b.Name); c != 0 {
		return c
	}
	if a.MemoryTotal != b.MemoryTotal {
		return cmp.Compare(a.MemoryTotal, b.MemoryTotal)
	}
	if a.MemoryForeign != b.MemoryForeign {
		return cmp.Compare(a.MemoryForeign, b.MemoryForeign)
	}
	if a.MIG != b.MIG {
		return cmpBool(a.MIG, b.MIG)
	}
	if a.Faulted != b.Faulted {
		return cmpBool(a.Faulted, b.Faulted)
	}
	return slices.Compare(sortedInts(a.NVLinkPeers), sortedInts(b.NVLinkPeers))
}

// gpuPos finds GPU index idx among gs (sorted by index).
func gpuPos(gs []gpuState, idx int) (int, bool) {
	if idx >= 0 && idx < len(gs) && gs[idx].index == idx {
		return idx, true // the usual dense numbering
	}
	return slices.BinarySearchFunc(gs, idx, func(g gpuState, t int) int { return sign(g.index - t) })
}

// reserveHeld accounts every shard the node lists, whatever its lease: a
// shard that is draining, lost a duplicate contest or whose lease lapsed may
// still have a live engine holding the memory until its supervisor stops it
// and drops it from its record. Counting it costs one round of convergence;
// not counting it risks an out-of-memory start.
func reserveHeld(gs []gpuState, held []HeldShard) {
	for i := range held {
		h := &held[i]
		idxs := h.GPUs
		if !strictlySorted(idxs) {
			idxs = sortedInts(idxs) // a GPU listed twice is reserved once
		}
		for _, idx := range idxs {
			if pos, ok := gpuPos(gs, idx); ok {
				gs[pos].reserve(h.MemoryPerGPU)
			}
		}
	}
}

// class is a set of live nodes whose state is identical for every placement
// question: same GPUs (index, model, memory, promises, flags, NVLink), same
// values of the labels deployments ask about, same cached models among
// those deployed. Feasibility and ranking are computed once per class and
// request shape instead of once per node: in a large cluster thousands of
// nodes share a handful of classes. Only the spread count and the rendezvous
// tie break are per node.
type class struct {
	// Fields read for every class and deployment come first, so that the
	// per-deployment pass touches as few cache lines as possible.

	// Scratch for the deployment being placed (valid while the matching
	// seq field equals that deployment's seq).
	candSeq  int32
	candOK   bool // feasible for the deployment
	inCands  bool
	penalSeq int32
	penal    int32 // members already holding a shard of the deployment
	candRank int64 // its rank for the deployment, cache bonus included

	members []*nodeState
	labels  []int32
	cached  []int32
	// Memoised fits: memoFits[i] answers shape memoShapes[i], and
	// memoRanks[i] is its rank or -1 when it does not fit; the packed
	// copies keep the common lookup off the larger fit structs.
	memoShapes []int32
	memoRanks  []int32
	memoFits   []fit
	live       bool // listed in index.live

	key  string
	gpus []gpuState // the state; never modified once the class exists
}

func (c *class) penalized(seq int32) int32 {
	if c.penalSeq != seq {
		return 0
	}
	return c.penal
}

func (c *class) addPenal(seq int32, delta int32) {
	if c.penalSeq != seq {
		c.penalSeq, c.penal = seq, 0
	}
	c.penal += delta
}

func (c *class) matches(labels []labelReq) bool {
	for _, l := range labels {
		if c.labels[l.key] != l.val {
			return false
		}
	}
	return true
}

func (c *class) caches(model int32) bool {
	_, ok := slices.BinarySearch(c.cached, model)
	return ok
}

// index groups live nodes into classes.
type index struct {
	classes map[string]*class
	// live lists classes that have, or recently had, members, in creation
	// order; empty ones are dropped when a deployment starts.
	live []*class
	buf  []byte
	// largestGPU is the largest memory of a live GPU: a whole GPU weighs
	// that much when gangs are ordered by size.
	largestGPU uint64
}

// ensureIndex builds the capacity index on first need: a view where every
// shard is kept never pays for it.
func (p *planner) ensureIndex() {
	if p.idx != nil {
		return
	}
	p.lowered = map[string]string{}
	p.internConstraints()
	p.idx = &index{classes: map[string]*class{}}
	var labels, cached []int32
	for _, n := range p.nodes {
		if !n.alive {
			continue // dead or leaving: takes nothing
		}
		// Scratch buffers: a node's state lives in its class, which copies
		// it only when the class is new.
		labels = p.nodeLabels(labels[:0], n.node)
		cached = p.nodeCached(cached[:0], n.node)
		p.gpuBuf = p.buildGPUs(p.gpuBuf[:0], n.node.GPUs)
		for i := range p.gpuBuf {
			p.idx.largestGPU = max(p.idx.largestGPU, p.gpuBuf[i].total)
		}
		reserveHeld(p.gpuBuf, n.node.Shards)
		p.idx.join(n, p.idx.classFor(p.gpuBuf, labels, cached))
	}
}

// internConstraints gives IDs to the label values, models and shapes that
// deployments ask for. Node classes only distinguish what some deployment
// can tell apart: a "rack" label nobody constrains does not split classes.
func (p *planner) internConstraints() {
	vals := map[string]map[string]bool{}
	p.models = map[string]int32{}
	p.shapeIDs = map[shape]int32{}
	for _, d := range p.deps {
		for k, v := range d.d.Labels {
			if vals[k] == nil {
				vals[k] = map[string]bool{}
			}
			vals[k][v] = true
		}
	}
	p.labelKeys = sortedKeys(vals)
	p.labelVals = make([]map[string]int32, len(p.labelKeys))
	p.labelLast = make([]labelMemo, len(p.labelKeys))
	for i, k := range p.labelKeys {
		p.labelVals[i] = map[string]int32{}
		for j, v := range sortedKeys(vals[k]) {
			p.labelVals[i][v] = int32(j)
		}
	}
	for _, d := range p.deps {
		if _, ok := p.models[d.d.Model]; !ok {
			p.models[d.d.Model] = int32(len(p.models))
		}
		d.model = p.models[d.d.Model]
		sh := shape{tp: d.d.TensorParallel, mem: uint64(d.d.GPUMemory), gpuType: strings.ToLower(d.d.GPUType)}
		id, ok := p.shapeIDs[sh]
		if !ok {
			id = int32(len(p.shapes))
			p.shapes = append(p.shapes, sh)
			p.shapeIDs[sh] = id
		}
		d.shapeID = id
		d.labels = d.labels[:0]
		for i, k := range p.labelKeys {
			if v, ok := d.d.Labels[k]; ok {
				d.labels = append(d.labels, labelReq{key: i, val: p.labelVals[i][v]})
			}
		}
	}
}

// lower interns lower-cased GPU names; a node's GPUs are usually all one
// model, so the last answer is tried first.
func (p *planner) lower(s string) string {
	if s == p.lastName {
		return p.lastLower
	}
	l, ok := p.lowered[s]
	if !ok {
		l = strings.ToLower(s)
		p.lowered[s] = l
	}
	p.lastName, p.lastLower = s, l
	return l
}

// nodeLabels appends the node's value ID for each label key deployments
// ask about.
func (p *planner) nodeLabels(out []int32, n *Node) []int32 {
	for i, k := range p.labelKeys {
		id := int32(-1) // absent, or a value no deployment asks for
		if v, ok := n.Labels[k]; ok {
			id = p.labelID(i, v)
		}
		out = append(out, id)
	}
	return out
}

// labelID looks up a value of label key i, remembering the last answer per
// key: neighbouring nodes mostly share their values.
func (p *planner) labelID(i int, v string) int32 {
	last := &p.labelLast[i]
	if last.ok && last.val == v {
		return last.id
	}
	id, ok := p.labelVals[i][v]
	if !ok {
		id = -1
	}
	*last = labelMemo{val: v, id: id, ok: true}
	return id
}

type labelMemo struct {
	val string
	id  int32
	ok  bool
}

// nodeCached appends the IDs of the deployed models the node has cached.
func (p *planner) nodeCached(out []int32, n *Node) []int32 {
	for _, m := range n.CachedModels {
		if id, ok := p.models[m]; ok {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// classFor returns the class of the given state, creating it if new. The
// arguments are copied when a class is created, so callers may reuse them.
func (ix *index) classFor(gs []gpuState, labels, cached []int32) *class {
	ix.buf = appendClassKey(ix.buf[:0], gs, labels, cached)
	if c, ok := ix.classes[string(ix.buf)]; ok {
		return c
	}
	c := &class{key: string(ix.buf), gpus: slices.Clone(gs), labels: slices.Clone(labels), cached: slices.Clone(cached)}
	ix.classes[c.key] = c
	return c
}

func (ix *index) join(n *nodeState, c *class) {
	n.class = c
	n.classPos = len(c.members)
	c.members = append(c.members, n)
	if !c.live {
		c.live = true
		ix.live = append(ix.live, c)
	}
}

// leave removes n from its class. Member order inside a class carries no
// meaning (the tie break is a hash over all members), so swap-remove is fine.
func (ix *index) leave(n *nodeState) {
	c := n.class
	last := c.members[len(c.members)-1]
	c.members[n.classPos] = last
	last.classPos = n.classPos
	c.members = c.members[:len(c.members)-1]
	n.class = nil
}

func appendClassKey(b []byte, gs []gpuState, labels, cached []int32) []byte {
	b = binary.AppendUvarint(b, uint64(len(labels)))
	for _, l := range labels {
		b = binary.AppendVarint(b, int64(l))
	}
	b = binary.AppendUvarint(b, uint64(len(cached)))
	for _, m := range cached {
		b = binary.AppendVarint(b, int64(m))
	}
	b = binary.AppendUvarint(b, uint64(len(gs)))
	for i := range gs {
		g := &gs[i]
		b = binary.AppendVarint(b, int64(g.index))
		b = binary.AppendUvarint(b, uint64(len(g.name)))
		b = append(b, g.name...)
		b = binary.AppendUvarint(b, g.total)
		b = binary.AppendUvarint(b, g.foreign)
		b = binary.AppendUvarint(b, g.promised)
		var flags byte
		if g.whole {
			flags |= 1
		}
		if g.mig {
			flags |= 2
		}
		if g.faulted {
			flags |= 4
		}
		b = append(b, flags)
		b = binary.AppendUvarint(b, g.nvlink)
	}
	return b
}
