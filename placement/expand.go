package placement

import (
	"bytes"
	"cmp"
	"encoding/json"
	"slices"
	"strings"
)

// This file reads the view: nodes in a canonical order, deployments
// expanded into replicas and shards, and held shards judged (kept, draining
// or neither).

// nodeState is one node of the view as the planner tracks it.
type nodeState struct {
	name  string
	node  *Node
	alive bool
	key   uint64 // rendezvous half

	// Live nodes only, once the capacity index exists. The class holds the
	// node's state: GPUs, promises, relevant labels, cached models.
	class    *class
	classPos int

	// Scratch for the deployment being placed.
	spreadSeq int32
	spread    int32 // shards of the deployment on this node
	exclSeq   int32 // equals planner.gangSeq while the gang must avoid it
}

func (n *nodeState) spreadOf(seq int32) int32 {
	if n.spreadSeq != seq {
		return 0
	}
	return n.spread
}

// depState is one valid deployment, expanded.
type depState struct {
	d    Deployment // with defaults; a role's shape for a role
	role string     // "" or RolePrefill or RoleDecode
	// sibling is the other role of a disaggregated deployment, and near
	// the nodes near its shards in the current pass (rank.go nearOther).
	sibling  *depState
	near     map[*nodeState]int32
	version  string
	seq      int32 // 1-based, unique per deployment: scratch stamps use it
	shapeID  int32
	model    int32
	labels   []labelReq
	replicas []*replicaState

	// Placement order: larger gangs first.
	weightHi, weightLo uint64

	// removed are serving shards of replicas the deployment no longer has
	// (scaled down), kept draining until every current replica is ready:
	// replicas are numbered, so scaling 3→1 keeps replica 0, and stopping
	// the others at once could leave nothing serving while 0 starts over.
	removed []removedShard

	penalized []*nodeState // nodes holding a shard of it (spread > 0)
	funnelAt  int          // planner.version+1 when funnel is current
	funnel    funnel
	// The last plain gang that failed: when (planner.version+1), its size
	// and why.
	failAt   int
	failNeed int
	failWhy  string
}

type labelReq struct {
	key int   // position in planner.labelKeys
	val int32 // value ID
}

// removedShard is a held shard of a replica beyond the deployment's count.
type removedShard struct {
	replica string
	h       holder
}

type replicaState struct {
	dep    *depState
	id     string
	index  int
	shards []*shardState
	// drains are old-version shards kept serving until every shard of the
	// current version of this replica is ready.
	drains []holder
}

type shardState struct {
	rep  *replicaState
	id   string
	hash uint64
	kept holder // zero when not kept
	// failing is a live claim whose engine keeps crashing. The shard moves
	// if it can; if not, the claim is kept after all.
	failing holder
	exclude []*nodeState // never place here: it keeps failing here
	avoid   []*nodeState // place here only if nothing else fits

	placed *nodeState
	gpus   []int // GPU indices when placed
	reason string
}

// holder is one node's claim on a shard; the zero holder is no claim.
type holder struct {
	node *nodeState
	held *HeldShard
}

func (h holder) ok() bool { return h.node != nil }

// serving says whether the holder is there, serves under a valid lease, and
// has done so long enough that every node has seen it (HeldShard.Settling):
// only then may the copies it replaces stop.
func (h holder) serving() bool {
	return h.ok() && h.held.Lease == LeaseValid && !h.held.Settling
}

// before orders duplicate claims: a copy that serves (valid lease) before
// one still loading, then the earliest claim stamp, then the lower node
// name; the winner keeps the shard and the others stop. Serving first: a
// replacement may load for minutes, and stopping the copy that answers
// for one that does not yet would leave the shard without service. Among
// copies that both serve, the earlier claim wins; a holder whose leases
// lapsed (its agent was gone or frozen longer than the TTL) claims afresh
// when it returns, so the copy that stayed valid is the earlier one.
func (a holder) before(b holder) bool {
	if av, bv := a.held.Lease == LeaseValid, b.held.Lease == LeaseValid; av != bv {
		return av
	}
	if a.held.ClaimStamp != b.held.ClaimStamp {
		return a.held.ClaimStamp < b.held.ClaimStamp
	}
	if a.node.name != b.node.name {
		return a.node.name < b.node.name
	}
	// One node listing the same shard twice: any total order will do.
	return compareHeld(a.held, b.held) < 0
}

func compareHeld(a, b *HeldShard) int {
	if c := strings.Compare(a.SpecVersion, b.SpecVersion); c != 0 {
		return c
	}
	if c := strings.Compare(string(a.Lease), string(b.Lease)); c != 0 {
		return c
	}
	if a.Failing != b.Failing {
		return cmpBool(a.Failing, b.Failing)
	}
	if a.MemoryPerGPU != b.MemoryPerGPU {
		return cmp.Compare(a.MemoryPerGPU, b.MemoryPerGPU)
	}
	return slices.Compare(sortedInts(a.GPUs), sortedInts(b.GPUs))
}

// liveLease: the holder is alive and renewing (ready or not yet).
func liveLease(l LeaseState) bool { return l == LeaseValid || l == LeaseStarting }

// readNodes sorts nodes by name. A name listed twice is a bug upstream;
// one copy is kept by a total order on content so that the plan does not
// depend on which copy came first.
func (p *planner) readNodes(in []Node) {
	ptrs := make([]*Node, len(in))
	for i := range in {
		ptrs[i] = &in[i]
	}
	slices.SortFunc(ptrs, func(a, b *Node) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return compareJSON(a, b)
	})
	ptrs = slices.CompactFunc(ptrs, func(a, b *Node) bool { return a.Name == b.Name })
	p.nodes = make([]*nodeState, len(ptrs))
	states := make([]nodeState, len(ptrs)) // one allocation, not one per node
	for i, n := range ptrs {
		states[i] = nodeState{name: n.Name, node: n, alive: n.Alive, key: nodeKey(n.Name)}
		p.nodes[i] = &states[i]
	}
}

// compareJSON is the tie breaker of last resort for duplicates.
func compareJSON(a, b any) int {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Compare(ja, jb)
}

// readDeployments applies defaults, sets aside invalid deployments as
// unplaced, and expands the rest into replicas and shards.
func (p *planner) readDeployments(in []Deployment) {
	ds := make([]Deployment, len(in))
	for i, d := range in {
		ds[i] = d.WithDefaults()
	}
	slices.SortFunc(ds, func(a, b Deployment) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return compareJSON(a, b)
	})
	ds = slices.CompactFunc(ds, func(a, b Deployment) bool { return a.Name == b.Name })

	valid := ds[:0]
	total := 0
	for _, d := range ds {
		if err := d.Validate(); err != nil {
			// There is no sound expansion of an invalid spec, so the whole
			// deployment is one entry, keyed by its name.
			p.invalid = append(p.invalid, Unplaced{
				ShardID: d.Name, Deployment: d.Name,
				Reason: "invalid deployment: " + err.Error(),
			})
			continue
		}
		valid = append(valid, d)
		total += d.Replicas * d.PipelineParallel
	}
	p.shards = make(map[string]*shardState, total)
	for _, whole := range valid {
		roles := whole.Roles()
		if roles == nil {
			roles = []string{""}
		}
		version := whole.SpecVersion()
		for _, role := range roles {
			p.expand(whole.ForRole(role), role, version)
		}
		if len(roles) == 2 {
			a, b := p.deps[len(p.deps)-2], p.deps[len(p.deps)-1]
			a.sibling, b.sibling = b, a
		}
	}
}

// expand adds one deployment, or one role of a disaggregated one, to the
// planner: its replicas and their shards.
func (p *planner) expand(d Deployment, role, version string) {
	dst := &depState{d: d, role: role, version: version, seq: int32(len(p.deps) + 1)}
	pp := d.PipelineParallel
	// One allocation per kind per deployment, not one per shard.
	reps := make([]replicaState, d.Replicas)
	shards := make([]shardState, d.Replicas*pp)
	ptrs := make([]*shardState, d.Replicas*pp)
	dst.replicas = make([]*replicaState, d.Replicas)
	for i := range reps {
		r := &reps[i]
		*r = replicaState{dep: dst, id: RoleReplicaID(d.Name, role, i), index: i, shards: ptrs[i*pp : (i+1)*pp : (i+1)*pp]}
		for j := range pp {
			s := &shards[i*pp+j]
			*s = shardState{rep: r, id: ShardID(r.id, j, pp)}
			s.hash = fnv1a(s.id)
			r.shards[j] = s
			p.shards[s.id] = s
		}
		dst.replicas[i] = r
	}
	p.deps = append(p.deps, dst)
}

// replicaOf finds the replica a held shard ID belongs to under any
// pipeline_parallel, old or current: the ID is "<replica>" or
// "<replica>-s<j>", and the replica's shards today are "<replica>" or
// "<replica>-s0"... Replica IDs end in "-<digits>" and shard suffixes in
// "-s<digits>", so the two cannot be confused.
func (p *planner) replicaOf(shardID string) *replicaState {
	if s := p.shards[shardID]; s != nil {
		return s.rep
	}
	replica := replicaPart(shardID)
	if s := p.shards[replica]; s != nil && s.rep.id == replica {
		return s.rep
	}
	if s := p.shards[replica+"-s0"]; s != nil {
		return s.rep
	}
	return nil
}

// replicaPart is the replica ID of a shard ID: "<replica>-s<j>" or, with
// one shard per replica, the ID itself.
func replicaPart(shardID string) string {
	if i := strings.LastIndex(shardID, "-s"); i >= 0 && allDigits(shardID[i+2:]) {
		return shardID[:i]
	}
	return shardID
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// judgeHeld decides, for every shard a node lists, whether it is kept,
// kept draining, or neither (its supervisor then stops it).
//
// Kept: the current spec version on a live node with a valid or starting
// lease, not failing, on GPUs without recent faults; among duplicates a
// serving copy wins, then the earliest claim (see holder.before). Stability beats optimality: a kept shard stays even
// where placement would not put it today (labels changed, foreign memory
// grew).
//
// Draining (serving, valid lease, until its replacement is ready and
// settled, see HeldShard.Settling):
//   - an older spec version of a replica that still exists, until every
//     current-version shard of that replica is ready (per replica, not per
//     shard: a pipeline is only useful whole);
//   - a current-version copy on a GPU with recent driver faults, likewise;
//   - a shard of a replica the deployment no longer has (scaled down),
//     until every remaining replica is ready, or at once if a remaining
//     replica cannot be placed (see fail).
func (p *planner) judgeHeld() {
	for _, n := range p.nodes {
		for i := range n.node.Shards {
			h := holder{node: n, held: &n.node.Shards[i]}
			p.judgeOne(h)
		}
	}
	p.evict()
	p.moveFailingGangs()
	// A current-version copy on a faulted GPU drains only while no healthy
	// copy of its shard serves: beside a kept copy with a valid lease (a
	// duplicate holder after a partition) it is the loser of a duplicate,
	// stopped like any other.
	for _, d := range p.deps {
		for _, r := range d.replicas {
			r.drains = slices.DeleteFunc(r.drains, func(h holder) bool {
				s := p.shards[h.held.ShardID]
				return h.held.SpecVersion == d.version && s != nil && s.kept.serving()
			})
		}
	}
	serving := func(r *replicaState) bool {
		for _, s := range r.shards {
			if !s.kept.serving() {
				return false
			}
		}
		return true
	}
	allServing := func(d *depState) bool {
		for _, r := range d.replicas {
			if !serving(r) {
				return false
			}
		}
		return true
	}
	for _, d := range p.deps {
		allReady := allServing(d)
		// The roles of a disaggregated deployment replace their old
		// version as one unit: a prefill pairs only with a decode of its
		// own spec version (two builds refuse each other's KV), so an old
		// replica of either role drains until every replica of both roles
		// serves the new version, never leaving an old decode without an
		// old prefill while the new one loads.
		unitReady := allReady && (d.sibling == nil || allServing(d.sibling))
		for _, r := range d.replicas {
			if serving(r) && (d.sibling == nil || unitReady) {
				r.drains = nil
			}
			slices.SortFunc(r.drains, func(a, b holder) int { return strings.Compare(a.held.ShardID, b.held.ShardID) })
		}
		if allReady {
			d.removed = nil
		}
		slices.SortFunc(d.removed, func(a, b removedShard) int {
			return cmp.Or(strings.Compare(a.h.held.ShardID, b.h.held.ShardID), strings.Compare(a.h.held.SpecVersion, b.h.held.SpecVersion))
		})
	}
}

func (p *planner) judgeOne(h holder) {
	hs := h.held
	s := p.shards[hs.ShardID]
	if s != nil && hs.SpecVersion == s.rep.dep.version {
		live := h.node.alive && liveLease(hs.Lease)
		faulted := live && onFaultedGPU(h)
		switch {
		case live && (hs.Failing || faulted):
			// Restarting it elsewhere may help; if nothing else fits,
			// placeGang keeps it here after all.
			if !s.failing.ok() || h.before(s.failing) {
				s.failing = h
			}
			s.exclude = appendUnique(s.exclude, h.node)
			if faulted && !hs.Failing && hs.Lease == LeaseValid {
				// A GPU with recent Xid faults may still answer /health
				// (vLLM's does): move the shard, but keep this copy
				// serving until the new one is ready, as a rolling update
				// would.
				s.rep.drains = append(s.rep.drains, h)
			}
		case hs.Failing:
			s.avoid = appendUnique(s.avoid, h.node)
		case live:
			if !s.kept.ok() || h.before(s.kept) {
				s.kept = h
			}
		}
		return
	}
	r := p.replicaOf(hs.ShardID)
	if r == nil {
		p.judgeRemoved(h)
		return
	}
	if hs.SpecVersion == r.dep.version {
		return // not a shard ID of ours
	}
	if !h.node.alive || !liveLease(hs.Lease) {
		return
	}
	if r.dep.d.Update == UpdateRecreate {
		// Recreate: the old version is not kept at all, so its
		// supervisors stop it, and the new one takes its GPUs once they
		// are free (held shards reserve theirs until then).
		return
	}
	if s != nil {
		// Surge onto another node if one fits: an old and a new engine of
		// one shard ID on one node are harder on its supervisor.
		s.avoid = appendUnique(s.avoid, h.node)
	}
	if hs.Lease != LeaseValid {
		return // not serving: nothing to keep it for
	}
	// A valid lease means it serves now, even if it crashed often before
	// (Failing clears only after a stable stretch): it drains like any.
	for i := range r.drains {
		if r.drains[i].held.ShardID == hs.ShardID {
			if h.before(r.drains[i]) {
				r.drains[i] = h
			}
			return
		}
	}
	r.drains = append(r.drains, h)
}

// evict lets go of the replicas GPU sharing takes GPUs from (share.go):
// none of their shards is kept, so their holders stop them, and each is
// explained by its reason.
func (p *planner) evict() {
	for _, d := range p.deps {
		for _, r := range d.replicas {
			why := p.evicted[r.id]
			if why == "" {
				continue
			}
			r.drains = nil
			for _, s := range r.shards {
				s.kept, s.failing, s.reason = holder{}, holder{}, why
			}
		}
	}
}

// onFaultedGPU reports whether a held shard sits on a GPU its node marks
// faulted (recent Xid errors) or no longer has.
func onFaultedGPU(h holder) bool {
	gpus := h.node.node.GPUs
	for _, idx := range h.held.GPUs {
		i := slices.IndexFunc(gpus, func(g GPU) bool { return g.Index == idx })
		if i < 0 || gpus[i].Faulted {
			return true
		}
	}
	return false
}

// judgeRemoved keeps a serving shard of a replica the deployment no longer
// has, draining (see depState.removed). Shards of deleted deployments, and
// IDs that are not ours, are simply not kept.
func (p *planner) judgeRemoved(h holder) {
	hs := h.held
	if !h.node.alive || hs.Lease != LeaseValid || hs.Failing {
		return
	}
	replica := replicaPart(hs.ShardID)
	name, role, _, ok := ParseReplicaID(replica)
	if !ok {
		return
	}
	k, found := slices.BinarySearchFunc(p.deps, name, func(d *depState, name string) int { return strings.Compare(d.d.Name, name) })
	if !found {
		return
	}
	// The roles of one deployment sit side by side, prefill first.
	for k < len(p.deps) && p.deps[k].d.Name == name && p.deps[k].role != role {
		k++
	}
	if k == len(p.deps) || p.deps[k].d.Name != name {
		return
	}
	d := p.deps[k]
	for j := range d.removed {
		if d.removed[j].h.held.ShardID == hs.ShardID && d.removed[j].h.held.SpecVersion == hs.SpecVersion {
			if h.before(d.removed[j].h) {
				d.removed[j].h = h
			}
			return
		}
	}
	d.removed = append(d.removed, removedShard{replica: replica, h: h})
}

func appendUnique(ns []*nodeState, n *nodeState) []*nodeState {
	if slices.Contains(ns, n) {
		return ns
	}
	return append(ns, n)
}
