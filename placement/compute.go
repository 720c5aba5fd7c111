package placement

import (
	"cmp"
	"fmt"
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
	p := newPlanner(v, nil)
	plan := p.plan()
	if v.Share {
		plan = share(v, p, plan)
	}
	return plan
}

// newPlanner runs steps 1 to 3 for v. evicted, when set, names replicas
// GPU sharing takes GPUs from (share.go), each with its reason: they are
// neither kept nor placed.
func newPlanner(v View, evicted map[string]string) *planner {
	p := &planner{evicted: evicted}
	if v.Share {
		p.usage = v.Usage
	}
	p.readNodes(v.Nodes)
	p.readDeployments(v.Deployments)
	p.judgeHeld()
	p.placeAll()
	return p
}

// planner holds one Compute call's working state.
type planner struct {
	nodes   []*nodeState // every node of the view, by name
	deps    []*depState  // valid deployments, by name
	invalid []Unplaced
	shards  map[string]*shardState

	// GPU sharing (share.go): the deciders' usage (nil: no sharing) and
	// the replicas it evicts, by replica ID, with their reasons.
	usage   map[string]Usage
	evicted map[string]string

	// Interned inputs of the capacity index.
	labelKeys []string           // label keys deployments ask about, sorted
	labelVals []map[string]int32 // per key: asked-for value → ID
	labelLast []labelMemo        // per key: labelID's one-entry cache
	models    map[string]int32   // deployed model → ID
	shapes    []shape            // by shape ID
	shapeIDs  map[shape]int32    // shape → ID
	lowered   map[string]string  // GPU name → lower case
	lastName  string             // lower's one-entry cache
	lastLower string

	// Placement state and scratch.
	idx       *index     // nil until something needs placing
	gpuBuf    []gpuState // scratch for commit
	cands     []*class   // feasible classes of the current deployment, best first
	rankCount []int      // scratch for sortByRank
	slab      []int      // backing store for the plan's GPU lists
	gangSeq   int32      // stamp for nodeState.exclSeq
	version   int        // bumped on every commit; dates funnels
}

// gang is the missing shards of one replica.
type gang struct {
	rep     *replicaState
	missing []*shardState
}

// placeAll places gangs, larger first (pipeline × tensor parallel × memory
// per GPU), then by deployment name and replica index. All gangs of one
// deployment are therefore placed one after the other, which lets the
// per-deployment scratch (spread counts, candidate list) be set up once
// (twice for a deployment some of whose replicas yield).
func (p *planner) placeAll() {
	var runs []run
	for _, d := range p.deps {
		var now, later []gang
		for _, r := range d.replicas {
			if p.evicted[r.id] != "" {
				continue // its GPUs go to a deployment with demand
			}
			var missing []*shardState
			for _, s := range r.shards {
				if !s.kept.ok() {
					missing = append(missing, s)
				}
			}
			if len(missing) == 0 {
				continue
			}
			if p.yields(r) {
				later = append(later, gang{rep: r, missing: missing})
			} else {
				now = append(now, gang{rep: r, missing: missing})
			}
		}
		if len(now) > 0 {
			runs = append(runs, run{d: d, gangs: now})
		}
		if len(later) > 0 {
			runs = append(runs, run{d: d, gangs: later, yields: true})
		}
	}
	if len(runs) == 0 {
		return // everything is kept: no index needed
	}
	p.ensureIndex()
	for _, d := range p.deps {
		mem := uint64(d.d.GPUMemory)
		if mem == 0 {
			mem = max(p.idx.largestGPU, 1) // a whole GPU weighs as much as the largest
		}
		d.weightHi, d.weightLo = bits.Mul64(uint64(d.d.PipelineParallel*d.d.TensorParallel), mem)
	}
	// Replicas that yield (idle, above their min, with sharing on) come
	// after every other, so that what they would take is offered first
	// to deployments with demand: see share.go.
	slices.SortStableFunc(runs, func(a, b run) int {
		if a.yields != b.yields {
			return cmpBool(a.yields, b.yields)
		}
		if c := cmp.Compare(b.d.weightHi, a.d.weightHi); c != 0 {
			return c
		}
		if c := cmp.Compare(b.d.weightLo, a.d.weightLo); c != 0 {
			return c
		}
		return strings.Compare(a.d.d.Name, b.d.d.Name)
	})
	nextSeq := int32(len(p.deps))
	for _, r := range runs {
		if r.yields && len(r.d.penalized) > 0 {
			// The deployment's other replicas were placed in an earlier
			// run: a fresh stamp sets its scratch up anew.
			nextSeq++
			r.d.seq = nextSeq
		}
		p.beginDeployment(r.d)
		for _, g := range r.gangs {
			p.placeGang(r.d, g)
		}
	}
}

// run is gangs of one deployment placed one after the other.
type run struct {
	d      *depState
	gangs  []gang
	yields bool
}

// placeGang finds a distinct node for every missing shard of a replica, or
// places none. Shards of one gang have one shape, and choosing a node only
// changes that node, which the rest of the gang must avoid anyway; so nodes
// can be chosen first and committed after, with nothing to roll back.
func (p *planner) placeGang(d *depState, g gang) {
	// A plain gang (nothing kept, nothing to avoid) that failed left the
	// state as it was, so until the next commit every plain gang of the
	// deployment at least as large fails the same way. Skipping them keeps
	// an oversubscribed cluster from searching once per unplaceable replica.
	plain := g.plain()
	if plain && d.failAt == p.version+1 && len(g.missing) >= d.failNeed {
		p.fail(g, d.failWhy)
		return
	}
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
			why := p.explain(d, g, len(picks))
			if plain {
				d.failAt, d.failNeed, d.failWhy = p.version+1, len(g.missing), why
			}
			p.fail(g, why)
			return
		}
		n.exclSeq = p.gangSeq
		picks = append(picks, n)
	}
	for i, s := range g.missing {
		p.commit(d, s, picks[i])
	}
}

// plain: no shard of the gang is kept, failing or to be avoided anywhere.
func (g gang) plain() bool {
	if len(g.missing) != len(g.rep.shards) {
		return false
	}
	for _, s := range g.missing {
		if s.failing.ok() || len(s.exclude) > 0 || len(s.avoid) > 0 {
			return false
		}
	}
	return true
}

// fail leaves a gang unplaced, except that a shard failing where it runs is
// kept there after all: better a crashing engine than none.
func (p *planner) fail(g gang, why string) {
	for _, h := range g.rep.drains {
		if h.held.SpecVersion != g.rep.dep.version {
			why = fmt.Sprintf("new version %s: %s; version %s keeps serving meanwhile",
				g.rep.dep.version, why, h.held.SpecVersion)
			// A surge needs room for two copies at once; say how to do
			// without rather than wait for room silently.
			why += "; if the old version holds the room it needs, update: recreate stops the old version first (a planned gap)"
			break
		}
	}
	if d := g.rep.dep; len(d.removed) > 0 {
		// Replicas scaled away drain only while the ones asked for can be
		// placed: when they hold the capacity a remaining replica needs,
		// they go now (a moment with fewer copies beats never having the
		// one asked for).
		d.removed = nil
		why += "; replicas scaled away are stopped to make room"
	}
	for _, s := range g.missing {
		if s.failing.ok() {
			s.kept = s.failing
			// Kept where it is after all: no copy of this shard at this
			// version is also a drain (a copy on a faulted GPU is one, and
			// so is a duplicate holder on another faulted GPU).
			g.rep.drains = slices.DeleteFunc(g.rep.drains, func(h holder) bool {
				return h.held.ShardID == s.id && h.held.SpecVersion == g.rep.dep.version
			})
			continue
		}
		s.reason = why
	}
}

// commit puts shard s on node n: the GPUs its class chose are reserved, the
// node moves to the class of its new state, and the spread counts grow.
func (p *planner) commit(d *depState, s *shardState, n *nodeState) {
	old := n.class
	f := p.fitFor(old, d.shapeID)
	s.placed = n
	var idx [8]int // GPU indices; most shards have at most 8
	gpus := idx[:0]
	p.gpuBuf = append(p.gpuBuf[:0], old.gpus...)
	for _, pos := range f.pos {
		gpus = append(gpus, p.gpuBuf[pos].index)
		p.gpuBuf[pos].reserve(uint64(d.d.GPUMemory))
	}
	s.gpus = p.gpuList(gpus)
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
