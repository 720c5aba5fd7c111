package supervisor

import (
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/engine"
)

// gangViews gives every assignment of this node that is a member of a
// gang (pipeline_parallel above 1) its gang as this node sees it in this
// pass: where the plan puts every rank (rank 0 is shard index 0, the same
// on every node since the plan is), and what each rank's planned holder
// reports, with the holder judged lost by this node's clock. The runner
// starts, stops and judges gang members from it (see engine/gang.go).
func gangViews(mine []engine.Desired, plan placement.Plan, members []gossip.Member, now time.Time, ttl time.Duration) {
	byName := map[string]gossip.Member{}
	var lost []string
	for _, m := range members {
		byName[m.Name] = m
		if memberLost(m, now, ttl) {
			lost = append(lost, m.Name)
		}
	}
	for i := range mine {
		d := &mine[i]
		size := d.Spec.PipelineParallel
		rank, ok := placement.ShardIndex(d.ShardID, d.ReplicaID)
		if size <= 1 || !ok || rank >= size {
			continue
		}
		pg := plan.GangOf(d.ReplicaID, d.SpecVersion, size)
		g := &engine.Gang{Size: size, Rank: rank, Peers: make([]engine.GangPeer, size), LostNodes: lost}
		for j, node := range pg.Nodes {
			g.Peers[j] = gangPeer(byName, node, placement.ShardID(d.ReplicaID, j, size), d.SpecVersion, now, ttl)
		}
		d.Gang = g
	}
}

// gangPeer is one rank as its holder's record reports it. Lost is the
// holder's own fate (dead, left, leaving, or no renewal within the TTL),
// not a lease that lapsed because the record is of an older boot: that is
// an agent restarting, which adopts its engines and must restart no member.
func gangPeer(byName map[string]gossip.Member, node, shard, spec string, now time.Time, ttl time.Duration) engine.GangPeer {
	p := engine.GangPeer{Node: node}
	if node == "" {
		return p
	}
	m, ok := byName[node]
	if !ok || m.Record == nil {
		p.Lost = !ok
		return p
	}
	p.Lost = memberLost(m, now, ttl)
	for _, s := range m.Record.Shards {
		if s.ShardID == shard && s.SpecVersion == spec {
			p.Held, p.Ready, p.Status = true, s.Ready, s.Status
			if s.Gang != nil {
				p.Gang = *s.Gang
			}
			break
		}
	}
	return p
}

// memberLost: the node is dead or left, says it is leaving, or its
// renewals stopped arriving within the TTL.
func memberLost(m gossip.Member, now time.Time, ttl time.Duration) bool {
	alive := (m.State == gossip.StateAlive || m.State == gossip.StateSuspect) && (m.Record == nil || !m.Record.Leaving)
	return !alive || (m.Record != nil && now.Sub(m.SeenAt) > ttl)
}
