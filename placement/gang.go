package placement

import (
	"slices"
	"strconv"
	"strings"
)

// ShardIndex is a shard's position in its replica: 0 for a replica of one
// shard, j for "<replica>-s<j>". It is the shard's rank in its gang.
func ShardIndex(shard, replica string) (int, bool) {
	if shard == replica {
		return 0, true
	}
	rest, ok := strings.CutPrefix(shard, replica+"-s")
	if !ok || rest == "" || (len(rest) > 1 && rest[0] == '0') {
		return 0, false
	}
	j, err := strconv.Atoi(rest)
	if err != nil || j < 0 {
		return 0, false
	}
	return j, true
}

// Gang is the members of one replica's spec version as a plan places them,
// by rank. Rank 0 is the shard with index 0: the one that serves HTTP and
// hosts the rendezvous. Every node computes the same plan from the same
// view, so every node names the same rank 0 without electing anyone.
type Gang struct {
	ReplicaID   string
	SpecVersion string
	// Nodes[j] is the node the plan gives rank j; empty when the plan has
	// no assignment for it (a draining gang whose member already stopped).
	Nodes []string
}

// Rank0 is the node of the gang's rank 0 ("" when unplaced).
func (g Gang) Rank0() string {
	if len(g.Nodes) == 0 {
		return ""
	}
	return g.Nodes[0]
}

// GangOf returns the gang of replica at spec version in p, sized size
// (the deployment's pipeline_parallel). Assignments whose shard ID is not
// a shard of the replica, or whose index is out of range, are ignored.
func (p Plan) GangOf(replica, spec string, size int) Gang {
	g := Gang{ReplicaID: replica, SpecVersion: spec, Nodes: make([]string, max(size, 0))}
	for _, a := range p.Assignments {
		if a.ReplicaID != replica || a.SpecVersion != spec {
			continue
		}
		j, ok := ShardIndex(a.ShardID, replica)
		if !ok || j >= size {
			continue
		}
		// Two assignments of one shard cannot come from Compute; keep the
		// lower node name so the answer is still a function of the plan.
		if g.Nodes[j] == "" || a.Node < g.Nodes[j] {
			g.Nodes[j] = a.Node
		}
	}
	return g
}

// Equal reports whether two gangs name the same nodes for the same ranks.
func (g Gang) Equal(o Gang) bool {
	return g.ReplicaID == o.ReplicaID && g.SpecVersion == o.SpecVersion && slices.Equal(g.Nodes, o.Nodes)
}

// moveFailingGangs re-places a gang as a whole when one of its members
// keeps crashing: a gang lives and dies together, so its crashes are
// counted on the member that restarts it (rank 0), and moving that member
// alone would leave the rest on nodes that may be the cause. Every kept
// member becomes a failing claim, excluded from its node: the whole gang
// moves if it fits elsewhere, and if it does not, fail keeps every member
// where it is after all.
func (p *planner) moveFailingGangs() {
	for _, d := range p.deps {
		if d.d.PipelineParallel <= 1 {
			continue
		}
		for _, r := range d.replicas {
			failing := false
			for _, s := range r.shards {
				failing = failing || (s.failing.ok() && s.failing.held.Failing)
			}
			if !failing {
				continue
			}
			for _, s := range r.shards {
				if s.kept.ok() && !s.failing.ok() {
					s.failing, s.kept = s.kept, holder{}
					s.exclude = appendUnique(s.exclude, s.failing.node)
				}
			}
		}
	}
}
