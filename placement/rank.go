package placement

import (
	"cmp"
	"math/bits"
	"slices"
)

// Ranking: among feasible nodes, which one. Spread first (fewest shards of
// the same deployment), then the sum of normalised integer scores (pack,
// NVLink, cached weights), then a rendezvous hash of shard and node.

// Scores are integers in [0, scoreMax] per criterion, added up (Nomad
// normalises and averages; integers keep every architecture in agreement).
const (
	scoreMax = 1000
	// cacheBonus is worth half a criterion: weights on local disk save a
	// download, but should not outweigh packing or NVLink.
	cacheBonus = scoreMax / 2
)

// maxRank bounds a class's rank for a deployment: pack and NVLink scores
// plus the cache bonus.
const maxRank = 2*scoreMax + cacheBonus

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

// beginDeployment sets up the per-deployment scratch: spread counts from
// the shards it already has, and the feasible classes sorted by rank.
func (p *planner) beginDeployment(d *depState) {
	d.penalized = d.penalized[:0]
	d.near = p.nearOther(d)
	for _, r := range d.replicas {
		for _, s := range r.shards {
			switch {
			case s.kept.ok():
				p.addSpread(d, s.kept.node)
			case s.placed != nil: // by an earlier run of the deployment
				p.addSpread(d, s.placed)
			}
		}
	}
	live := p.idx.live[:0]
	p.cands = p.cands[:0]
	for _, c := range p.idx.live {
		if len(c.members) == 0 {
			c.live = false
			continue
		}
		live = append(live, c)
		p.candidate(c, d)
		if c.candOK {
			c.inCands = true
			p.cands = append(p.cands, c)
		}
	}
	clear(p.idx.live[len(live):])
	p.idx.live = live
	p.cands = sortByRank(p.cands, &p.rankCount)
}

// sortByRank orders classes best rank first. Ranks are small integers, so a
// counting sort does it in linear time; thousands of classes are sorted for
// every deployment in a large, varied cluster. Order within a rank does not
// matter: pick compares all classes of a rank.
func sortByRank(cs []*class, count *[]int) []*class {
	if len(cs) < 2 {
		return cs
	}
	if *count == nil {
		*count = make([]int, maxRank+2)
	}
	n := *count
	clear(n)
	for _, c := range cs {
		n[maxRank-c.candRank+1]++
	}
	for i := 1; i < len(n); i++ {
		n[i] += n[i-1]
	}
	out := make([]*class, len(cs))
	for _, c := range cs {
		at := &n[maxRank-c.candRank]
		out[*at] = c
		*at++
	}
	return out
}

// pick ranks the feasible nodes for one shard: fewest shards of the same
// deployment (spread), then the class rank (pack + NVLink + cache), then the
// rendezvous hash. Classes are visited best rank first; within the first
// rank group that has an unpenalised node, the hash decides.
func (p *planner) pick(d *depState, s *shardState) *nodeState {
	if d.near != nil {
		// A role of a disaggregated deployment: the other role's nodes
		// first, then nodes of their transfer domain, then any.
		for tier := int32(2); tier >= 1; tier-- {
			if n := p.pickWhere(d, s, func(n *nodeState) bool { return d.near[n] >= tier }); n != nil {
				return n
			}
		}
	}
	return p.pickWhere(d, s, nil)
}

// pickWhere is pick among the nodes ok accepts (nil: all), falling back
// to pickPenalized only when ok is nil.
func (p *planner) pickWhere(d *depState, s *shardState, ok func(*nodeState) bool) *nodeState {
	for i := 0; i < len(p.cands); {
		if len(p.cands[i].members) == 0 {
			p.cands[i].inCands = false
			p.cands = slices.Delete(p.cands, i, i+1)
			continue
		}
		j := i + 1
		for j < len(p.cands) && p.cands[j].candRank == p.cands[i].candRank {
			j++
		}
		var best *nodeState
		var bestH uint64
		for _, c := range p.cands[i:j] {
			if int32(len(c.members)) == c.penalized(d.seq) {
				continue
			}
			for _, n := range c.members {
				if n.spreadOf(d.seq) > 0 || n.exclSeq == p.gangSeq || slices.Contains(s.avoid, n) || slices.Contains(s.exclude, n) || (ok != nil && !ok(n)) {
					continue
				}
				h := rendezvous(s.hash, n.key)
				if best == nil || h > bestH || (h == bestH && n.name < best.name) {
					best, bestH = n, h
				}
			}
		}
		if best != nil {
			return best
		}
		i = j
	}
	if ok != nil {
		return nil
	}
	return p.pickPenalized(d, s)
}

// pickPenalized is the fallback when every feasible node already holds a
// shard of the deployment or is to be avoided for this shard: the fewest
// shards of the deployment, then not avoided, then rank, then hash.
func (p *planner) pickPenalized(d *depState, s *shardState) *nodeState {
	var best *nodeState
	var bestKey [4]uint64 // compared lexicographically, smaller is better
	consider := func(n *nodeState) {
		if !n.alive || n.class == nil || n.exclSeq == p.gangSeq || slices.Contains(s.exclude, n) {
			return
		}
		p.candidate(n.class, d)
		if !n.class.candOK {
			return
		}
		avoided := uint64(0)
		if slices.Contains(s.avoid, n) {
			avoided = 1
		}
		key := [4]uint64{
			uint64(n.spreadOf(d.seq)),
			avoided,
			uint64(1<<62 - n.class.candRank),
			^rendezvous(s.hash, n.key),
		}
		if best == nil || cmpKey(key, bestKey) < 0 || (cmpKey(key, bestKey) == 0 && n.name < best.name) {
			best, bestKey = n, key
		}
	}
	for _, n := range d.penalized {
		consider(n)
	}
	for _, n := range s.avoid {
		consider(n)
	}
	return best
}

func cmpKey(a, b [4]uint64) int {
	for i := range a {
		if c := cmp.Compare(a[i], b[i]); c != 0 {
			return c
		}
	}
	return 0
}

// nearOther is, for a role of a disaggregated deployment, the nodes near
// the other role's shards (kept, or placed in this pass): 2 for a node
// holding one, 1 for a node of the same transfer domain (the value of the
// label transfer.domain names). Nil for a deployment without roles, or
// while the other role has no shard anywhere.
func (p *planner) nearOther(d *depState) map[*nodeState]int32 {
	o := d.sibling
	if o == nil {
		return nil
	}
	var near map[*nodeState]int32
	var domains map[string]bool
	key := ""
	if t := d.d.Transfer; t != nil && t.Domain != "" {
		key, domains = t.Domain, map[string]bool{}
	}
	for _, r := range o.replicas {
		for _, s := range r.shards {
			n := s.placed
			if s.kept.ok() {
				n = s.kept.node
			}
			if n == nil {
				continue
			}
			if near == nil {
				near = map[*nodeState]int32{}
			}
			near[n] = 2
			if v, ok := n.node.Labels[key]; ok && key != "" {
				domains[v] = true
			}
		}
	}
	if len(domains) > 0 {
		for _, n := range p.nodes {
			if v, ok := n.node.Labels[key]; ok && domains[v] && near[n] == 0 {
				near[n] = 1
			}
		}
	}
	return near
}
