package placement

import (
	"cmp"
	"math/bits"
	"slices"
	"strings"
)

// Feasibility: can a node take a shard, and on which GPUs. The filters, in
// order: live node (only live nodes are indexed), labels, GPU type, MIG and
// faults, free memory or free whole GPUs, enough such GPUs on one node.

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
	// freeAtTP, for a memory-sized shape, is the most each of tp usable
	// GPUs of the node has free: the tp-th largest free memory (0 with
	// fewer usable GPUs). Reasons quote it.
	freeAtTP uint64
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

// candidate evaluates a class for the current deployment once: labels
// (feasibility), then the memoised GPU fit, plus the cache bonus (ranking).
func (p *planner) candidate(c *class, d *depState) {
	if c.candSeq == d.seq {
		return
	}
	c.candSeq, c.candOK, c.inCands = d.seq, false, false
	if len(d.labels) > 0 && !c.matches(d.labels) {
		return
	}
	rank := p.rankFor(c, d.shapeID)
	if rank < 0 {
		return
	}
	c.candOK = true
	c.candRank = int64(rank)
	if len(c.cached) > 0 && c.caches(d.model) {
		c.candRank += cacheBonus
	}
}

// evaluate is the GPU part of feasibility (type, MIG, faults, free memory)
// for one node state, and, when the shard fits, the node's pack and NVLink
// scores: both come out of the same walk over the GPUs and are memoised
// together.
func evaluate(gs []gpuState, sh shape) fit {
	var (
		f         fit
		elig      []int
		nodeFree  uint64 // free memory over all usable GPUs
		nodeCap   uint64
		usableAll int
		wholeAll  int      // usable GPUs free for a whole-GPU shard
		frees     []uint64 // free memory of the usable typed GPUs (memory-sized shapes)
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
		if !sh.whole() {
			frees = append(frees, g.free())
		}
	}
	f.eligible = len(elig)
	if len(frees) >= sh.tp && sh.tp > 0 {
		slices.SortFunc(frees, func(a, b uint64) int { return cmp.Compare(b, a) })
		f.freeAtTP = frees[sh.tp-1]
	}
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
		return cmp.Compare(gs[a].free(), gs[b].free())
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
