package placement

import (
	"cmp"
	"math/bits"
	"slices"
	"strings"
)

// Compute returns placement's answer for a view. It is deterministic: equal
// views, whatever the order of their nodes, GPUs, shards and deployments,
// give plans that marshal to identical bytes. It does not modify v.
//
// Steps:
//  1. Expand valid deployments into replicas and shards (invalid ones are
//     reported unplaced with the validation error; replicas 0 places
//     nothing).
//  2. Keep what runs and drain old versions (see judgeHeld).
//  3. Place the missing shards of each replica as a gang, larger gangs
//     first: every missing shard on a distinct node, distinct from the
//     replica's kept shards too, or none of them.
//  4. Explain every shard left unplaced.
func Compute(v View) Plan {
	p := &planner{}
	p.readNodes(v.Nodes)
	p.readDeployments(v.Deployments)
	p.judgeHeld()
	p.placeAll()
	return p.plan()
}

// planner holds one Compute call's working state.
type planner struct {
	nodes   []*nodeState // every node of the view, by name
	deps    []*depState  // valid deployments, by name
	invalid []Unplaced
	shards  map[string]*shardState

	// Interned inputs of the capacity index.
	labelKeys []string           // label keys deployments ask about, sorted
	labelVals []map[string]int32 // per key: asked-for value → ID
	models    map[string]int32   // deployed model → ID
	shapes    []shape            // by shape ID
	shapeIDs  map[shape]int32    // shape → ID
	lowered   map[string]string  // GPU name → lower case
	lastName  string             // lower's one-entry cache
	lastLower string
	idx       *index     // nil until something needs placing
	gpuBuf    []gpuState // scratch for commit
	cands     []*class   // feasible classes of the current deployment, best first
	rankCount []int      // scratch for sortByRank
	gangSeq   int32      // stamp for nodeState.exclSeq
	version   int        // bumped on every commit; dates funnels
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

// gang is the missing shards of one replica.
type gang struct {
	rep     *replicaState
	missing []*shardState
}

// placeAll places gangs, larger first (pipeline × tensor parallel × memory
// per GPU), then by deployment name and replica index. All gangs of one
// deployment are therefore placed one after the other, which lets the
// per-deployment scratch (spread counts, candidate list) be set up once.
func (p *planner) placeAll() {
	order := slices.Clone(p.deps)
	var wholeWeight uint64 // a whole GPU weighs as much as the largest GPU
	for _, n := range p.nodes {
		if n.alive {
			for i := range n.node.GPUs {
				wholeWeight = max(wholeWeight, n.node.GPUs[i].MemoryTotal)
			}
		}
	}
	for _, d := range order {
		mem := uint64(d.d.GPUMemory)
		if mem == 0 {
			mem = max(wholeWeight, 1)
		}
		d.weightHi, d.weightLo = bits.Mul64(uint64(d.d.PipelineParallel*d.d.TensorParallel), mem)
	}
	slices.SortStableFunc(order, func(a, b *depState) int {
		if c := cmp.Compare(b.weightHi, a.weightHi); c != 0 {
			return c
		}
		if c := cmp.Compare(b.weightLo, a.weightLo); c != 0 {
			return c
		}
		return strings.Compare(a.d.Name, b.d.Name)
	})
	for _, d := range order {
		var gangs []gang
		for _, r := range d.replicas {
			var missing []*shardState
			for _, s := range r.shards {
				if !s.kept.ok() {
					missing = append(missing, s)
				}
			}
			if len(missing) > 0 {
				gangs = append(gangs, gang{rep: r, missing: missing})
			}
		}
		if len(gangs) == 0 {
			continue
		}
		p.ensureIndex()
		p.beginDeployment(d)
		for _, g := range gangs {
			p.placeGang(d, g)
		}
	}
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

// nodeLabels appends the node's value ID for each label key deployments
// ask about.
func (p *planner) nodeLabels(out []int32, n *Node) []int32 {
	for i, k := range p.labelKeys {
		id := int32(-1) // absent, or a value no deployment asks for
		if v, ok := n.Labels[k]; ok {
			if vid, ok := p.labelVals[i][v]; ok {
				id = vid
			}
		}
		out = append(out, id)
	}
	return out
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

// beginDeployment sets up the per-deployment scratch: spread counts from
// the shards it already has, and the feasible classes sorted by rank.
func (p *planner) beginDeployment(d *depState) {
	d.penalized = d.penalized[:0]
	for _, r := range d.replicas {
		for _, s := range r.shards {
			if s.kept.ok() {
				p.addSpread(d, s.kept.node)
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

// maxRank bounds a class's rank for a deployment: pack and NVLink scores
// plus the cache bonus.
const maxRank = 2*scoreMax + cacheBonus

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

// addSpread counts one more shard of d on n.
func (p *planner) addSpread(d *depState, n *nodeState) {
	if n.spreadOf(d.seq) == 0 {
		n.spreadSeq, n.spread = d.seq, 0
		d.penalized = append(d.penalized, n)
		if n.class != nil {
			n.class.addPenal(d.seq, 1)
		}
	}
	n.spread++
}

// placeGang finds a distinct node for every missing shard of a replica, or
// places none. Shards of one gang have one shape, and choosing a node only
// changes that node, which the rest of the gang must avoid anyway; so nodes
// can be chosen first and committed after, with nothing to roll back.
func (p *planner) placeGang(d *depState, g gang) {
	p.gangSeq++
	for _, s := range g.rep.shards {
		if s.kept.ok() {
			s.kept.node.exclSeq = p.gangSeq
		}
	}
	picks := make([]*nodeState, 0, len(g.missing))
	for _, s := range g.missing {
		n := p.pick(d, s)
		if n == nil {
			reason := p.explain(d, g, len(picks))
			for _, s := range g.missing {
				if s.failing.ok() {
					s.kept = s.failing // could not move it: better failing than nothing
					continue
				}
				s.reason = reason
			}
			return
		}
		n.exclSeq = p.gangSeq
		picks = append(picks, n)
	}
	for i, s := range g.missing {
		p.commit(d, s, picks[i])
	}
}

// pick ranks the feasible nodes for one shard: fewest shards of the same
// deployment (spread), then the class rank (pack + NVLink + cache), then the
// rendezvous hash. Classes are visited best rank first; within the first
// rank group that has an unpenalised node, the hash decides.
func (p *planner) pick(d *depState, s *shardState) *nodeState {
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
				if n.spreadOf(d.seq) > 0 || n.exclSeq == p.gangSeq || slices.Contains(s.avoid, n) || slices.Contains(s.exclude, n) {
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

// commit puts shard s on node n: the GPUs its class chose are reserved, the
// node moves to the class of its new state, and the spread counts grow.
func (p *planner) commit(d *depState, s *shardState, n *nodeState) {
	old := n.class
	f := p.fitFor(old, d.shapeID)
	s.placed = n
	s.gpus = make([]int, len(f.pos))
	p.gpuBuf = append(p.gpuBuf[:0], old.gpus...)
	for i, pos := range f.pos {
		s.gpus[i] = p.gpuBuf[pos].index
		p.gpuBuf[pos].reserve(uint64(d.d.GPUMemory))
	}
	if n.spreadOf(d.seq) > 0 {
		old.addPenal(d.seq, -1)
	}
	p.idx.leave(n)
	next := p.idx.classFor(p.gpuBuf, old.labels, old.cached)
	p.idx.join(n, next)
	p.addSpread(d, n)
	if n.spread > 1 {
		next.addPenal(d.seq, 1) // addSpread counted it only on the first shard
	}
	p.version++

	p.candidate(next, d)
	if next.candOK && !next.inCands {
		next.inCands = true
		at, _ := slices.BinarySearchFunc(p.cands, next.candRank, func(c *class, r int64) int { return cmp.Compare(r, c.candRank) })
		p.cands = slices.Insert(p.cands, at, next)
	}
}
