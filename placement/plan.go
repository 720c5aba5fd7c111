package placement

import (
	"cmp"
	"slices"
	"strings"
)

// plan assembles the output: one assignment per kept, draining or newly
// placed shard, one unplaced entry per shard without a current-version
// assignment, both sorted so that equal views marshal to equal bytes.
func (p *planner) plan() Plan {
	out := Plan{Assignments: make([]Assignment, 0, len(p.shards)), Unplaced: slices.Clone(p.invalid)}
	if out.Unplaced == nil {
		out.Unplaced = []Unplaced{}
	}
	// Walking replicas in the order of their IDs as strings ("d-0", "d-1",
	// "d-10", "d-2") makes the final sort nearly a no-op.
	for _, d := range p.deps {
		for _, rm := range d.removed {
			out.Assignments = append(out.Assignments, Assignment{
				ShardID: rm.h.held.ShardID, ReplicaID: rm.replica, Deployment: d.d.Name, Role: d.role,
				SpecVersion: rm.h.held.SpecVersion, Node: rm.h.node.name,
				GPUs: p.gpuList(rm.h.held.GPUs), MemoryPerGPU: rm.h.held.MemoryPerGPU,
				Kept: true, Draining: true,
			})
		}
		for _, i := range lexOrder(len(d.replicas)) {
			r := d.replicas[i]
			for _, h := range r.drains {
				a := p.heldAssignment(r, h)
				a.Draining = true
				out.Assignments = append(out.Assignments, a)
			}
			for _, s := range r.shards {
				switch {
				case s.kept.ok():
					out.Assignments = append(out.Assignments, p.heldAssignment(r, s.kept))
				case s.placed != nil:
					out.Assignments = append(out.Assignments, Assignment{
						ShardID: s.id, ReplicaID: r.id, Deployment: d.d.Name, Role: d.role,
						SpecVersion: d.version, Node: s.placed.name,
						GPUs: s.gpus, MemoryPerGPU: uint64(d.d.GPUMemory),
					})
				default:
					reason := s.reason
					if reason == "" {
						reason = "not placed" // unreachable: every gang failure is explained
					}
					if p.yields(r) && p.evicted[r.id] == "" {
						reason += "; idle, it gives way to deployments with demand (GPU sharing)"
					}
					out.Unplaced = append(out.Unplaced, Unplaced{
						ShardID: s.id, ReplicaID: r.id, Deployment: d.d.Name, Reason: reason,
					})
				}
			}
		}
	}
	slices.SortFunc(out.Assignments, func(a, b Assignment) int {
		if c := strings.Compare(a.ShardID, b.ShardID); c != 0 {
			return c
		}
		if c := strings.Compare(a.SpecVersion, b.SpecVersion); c != 0 {
			return c
		}
		return strings.Compare(a.Node, b.Node)
	})
	slices.SortFunc(out.Unplaced, func(a, b Unplaced) int {
		return cmp.Or(
			strings.Compare(a.ShardID, b.ShardID),
			strings.Compare(a.Deployment, b.Deployment),
			strings.Compare(a.Reason, b.Reason),
		)
	})
	return out
}

// heldAssignment keeps a held shard where it is, with what it was placed
// with. For the current spec version the memory per GPU is the spec's (the
// version fixes it): a holder that lost the figure, an agent restarted from
// an older state file, gets it back instead of keeping whole GPUs forever.
func (p *planner) heldAssignment(r *replicaState, h holder) Assignment {
	mem := h.held.MemoryPerGPU
	if h.held.SpecVersion == r.dep.version {
		mem = uint64(r.dep.d.GPUMemory)
	}
	return Assignment{
		ShardID: h.held.ShardID, ReplicaID: r.id, Deployment: r.dep.d.Name, Role: r.dep.role,
		SpecVersion: h.held.SpecVersion, Node: h.node.name,
		GPUs: p.gpuList(h.held.GPUs), MemoryPerGPU: mem,
		Kept: true,
	}
}

// gpuList copies GPU indices, sorted and without repeats, into the plan.
// Lists are carved from shared chunks (one allocation per few thousand
// shards instead of one each), each capped so an append cannot run into
// its neighbour. The input is never aliased: the plan outlives the view.
func (p *planner) gpuList(in []int) []int {
	if len(in) == 0 {
		return []int{} // marshal the same whether the record had nil or []
	}
	if len(in) > cap(p.slab)-len(p.slab) {
		p.slab = make([]int, 0, max(4096, len(in)))
	}
	start := len(p.slab)
	p.slab = append(p.slab, in...)
	out := p.slab[start:len(p.slab):len(p.slab)]
	if !strictlySorted(out) {
		slices.Sort(out)
		out = slices.Compact(out)
		p.slab = p.slab[:start+len(out)]
		out = out[:len(out):len(out)]
	}
	return out
}

// ForNode returns the assignments of one node, in plan order.
func (p Plan) ForNode(name string) []Assignment {
	var out []Assignment
	for _, a := range p.Assignments {
		if a.Node == name {
			out = append(out, a)
		}
	}
	return out
}

// lexOrder lists 0..n-1 in the order of their decimal strings.
func lexOrder(n int) []int {
	out := make([]int, 0, n)
	var walk func(x int)
	walk = func(x int) {
		out = append(out, x)
		for c := x * 10; c < x*10+10 && c < n; c++ {
			walk(c)
		}
	}
	if n > 0 {
		out = append(out, 0)
	}
	for first := 1; first <= 9 && first < n; first++ {
		walk(first)
	}
	return out
}
