package placement

import (
	"math/bits"
	"slices"
	"strings"
)

// Feasibility and per-node ranking for one request shape.

// Scores are integers in [0, scoreMax] per criterion, added up (Nomad
// normalises and averages; integers keep every architecture in agreement).
const (
	scoreMax = 1000
	// cacheBonus is worth half a criterion: weights on local disk save a
	// download, but should not outweigh packing or NVLink.
	cacheBonus = scoreMax / 2
)

// shape is what one shard asks of one node. Every shard of a deployment has
// the same shape, and deployments with equal shapes share memoised fits.
type shape struct {
	tp      int
	mem     uint64 // per GPU; 0: whole GPUs
	gpuType string // lower-cased substring of the GPU name; "" any
}

func (s shape) whole() bool { return s.mem == 0 }

// fit is a class's answer to a shape: whether a shard fits, on which GPUs,
// how well, and the counts that explain a refusal.
type fit struct {
	ok   bool
	pos  []int // chosen GPU positions, ascending
	rank int64 // pack + NVLink score, without the per-model cache bonus

	typed    int // GPUs matching the type filter
	mig      int // ... of which MIG-enabled
	faulted  int // ... of which faulted (and not MIG)
	usable   int // ... neither MIG nor faulted
	eligible int // ... usable and free enough for the request
}

// fitFor memoises evaluate per class and shape. A class's state never
// changes, so the memo never goes stale.
func (p *planner) fitFor(c *class, shapeID int32) *fit {
	for i, s := range c.memoShapes {
		if s == shapeID {
			return &c.memoFits[i]
		}
	}
	f := evaluate(c.gpus, p.shapes[shapeID])
	rank := int32(-1)
	if f.ok {
		rank = int32(f.rank)
	}
	c.memoShapes = append(c.memoShapes, shapeID)
	c.memoRanks = append(c.memoRanks, rank)
	c.memoFits = append(c.memoFits, f)
	return &c.memoFits[len(c.memoFits)-1]
}

// rankFor is fitFor's rank alone: -1 when the shape does not fit.
func (p *planner) rankFor(c *class, shapeID int32) int32 {
	for i, s := range c.memoShapes {
		if s == shapeID {
			return c.memoRanks[i]
		}
	}
	p.fitFor(c, shapeID)
	return c.memoRanks[len(c.memoRanks)-1]
}

// evaluate is the GPU part of feasibility (type, MIG, faults, free memory)
// and the node part of ranking (pack, NVLink) for one node state.
func evaluate(gs []gpuState, sh shape) fit {
	var (
		f         fit
		elig      []int
		nodeFree  uint64 // free memory over all usable GPUs
		nodeCap   uint64
		usableAll int
		wholeAll  int // usable GPUs free for a whole-GPU shard
	)
	for i := range gs {
		g := &gs[i]
		if g.usable() {
			usableAll++
			nodeFree = satAdd(nodeFree, g.free())
			nodeCap = satAdd(nodeCap, g.capacity())
			if g.wholeFree() {
				wholeAll++
			}
		}
		if sh.gpuType != "" && !strings.Contains(g.lname, sh.gpuType) {
			continue
		}
		f.typed++
		switch {
		case g.mig:
			f.mig++
			continue
		case g.faulted:
			f.faulted++
			continue
		}
		f.usable++
		if (sh.whole() && g.wholeFree()) || (!sh.whole() && g.free() >= sh.mem) {
			elig = append(elig, i)
		}
	}
	f.eligible = len(elig)
	if len(elig) < sh.tp {
		return f
	}
	f.ok = true
	f.pos = chooseGPUs(gs, elig, sh)
	if sh.whole() {
		f.rank = packScore(uint64(wholeAll-sh.tp), uint64(usableAll))
	} else {
		f.rank = packScore(satSub(nodeFree, satMul(uint64(sh.tp), sh.mem)), nodeCap)
	}
	f.rank += nvlinkScore(gs, f.pos)
	return f
}

// packScore is best fit: the less a node has left after the placement, the
// higher it scores, so small shards fill gaps and whole nodes stay whole
// for large gangs.
func packScore(left, capacity uint64) int64 {
	if capacity == 0 {
		return 0
	}
	left = min(left, capacity)
	hi, lo := bits.Mul64(left, scoreMax)
	q, _ := bits.Div64(hi, lo, capacity) // hi < capacity since left ≤ capacity
	return scoreMax - int64(q)
}

// nvlinkScore is the share of GPU pairs in the set joined by NVLink, for
// tensor parallelism whose all-reduce otherwise crosses PCIe.
func nvlinkScore(gs []gpuState, pos []int) int64 {
	if len(pos) < 2 {
		return 0
	}
	links := 0
	for i, a := range pos {
		for _, b := range pos[i+1:] {
			if b < maxNVLinkGPUs && gs[a].nvlink&(1<<b) != 0 {
				links++
			}
		}
	}
	pairs := len(pos) * (len(pos) - 1) / 2
	return int64(links * scoreMax / pairs)
}

// chooseGPUs picks sh.tp of the eligible positions: the set with the most
// NVLink pairs, then the best fit. Memory shards go to the fullest GPUs that
// still fit; whole-GPU shards go where they break up the fewest free NVLink
// groups.
func chooseGPUs(gs []gpuState, elig []int, sh shape) []int {
	var eligMask uint64
	for _, e := range elig {
		if e < maxNVLinkGPUs {
			eligMask |= 1 << e
		}
	}
	links := func(e int) uint64 {
		if e >= maxNVLinkGPUs {
			return 0
		}
		return gs[e].nvlink & eligMask
	}
	pref := slices.Clone(elig)
	slices.SortStableFunc(pref, func(a, b int) int {
		if sh.whole() {
			return sign(bits.OnesCount64(links(a)) - bits.OnesCount64(links(b)))
		}
		return cmpU64(gs[a].free(), gs[b].free())
	})
	if sh.tp >= len(pref) {
		return sortedInts(pref)
	}
	if sh.tp == 1 || uniformLinks(pref, links, eligMask) {
		return sortedInts(pref[:sh.tp])
	}
	// Greedy from each seed: add the GPU with the most links into the set so
	// far, earlier in preference order on ties. Exact search is exponential;
	// nodes have at most a few dozen GPUs and this finds the full clique on
	// NVSwitch, pair-bridge and hybrid-cube-mesh layouts.
	var best []int
	bestLinks, bestCost := -1, 0
	for _, seed := range pref {
		set := []int{seed}
		setMask := bitOf(seed)
		total := 0
		for len(set) < sh.tp {
			pick, pickLinks := -1, -1
			for _, e := range pref {
				if slices.Contains(set, e) {
					continue
				}
				if l := bits.OnesCount64(links(e) & setMask); l > pickLinks {
					pick, pickLinks = e, l
				}
			}
			set = append(set, pick)
			setMask |= bitOf(pick)
			total += pickLinks
		}
		cost := 0 // lower is better: sum of preference ranks
		for _, e := range set {
			cost += slices.Index(pref, e)
		}
		if total > bestLinks || (total == bestLinks && cost < bestCost) {
			best, bestLinks, bestCost = set, total, cost
		}
	}
	return sortedInts(best)
}

// uniformLinks: every eligible GPU links to all others (NVSwitch) or to
// none (PCIe only), so any subset is as connected as any other.
func uniformLinks(pref []int, links func(int) uint64, eligMask uint64) bool {
	all, none := true, true
	for _, e := range pref {
		l := links(e)
		if l != eligMask&^bitOf(e) || e >= maxNVLinkGPUs {
			all = false
		}
		if l != 0 {
			none = false
		}
	}
	return all || none
}

func bitOf(pos int) uint64 {
	if pos >= maxNVLinkGPUs {
		return 0
	}
	return 1 << pos
}
