package supervisor

import (
	"sort"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

// BuildView turns this node's copy of the gossip state into placement's
// input, judging every lease by this node's own clock: a lease is valid while
// its holder is alive in memberlist and renewed its record within ttl of now,
// measured from when this node saw the renewal. No clock of another node is
// ever compared with ours. View.Share, GPU sharing, is the caller's: it
// follows the cluster version.
func BuildView(members []gossip.Member, deps []gossip.DeploymentRecord, now time.Time, ttl time.Duration) placement.View {
	var v placement.View
	for _, m := range members {
		if m.Record == nil {
			continue
		}
		alive := m.State == gossip.StateAlive || m.State == gossip.StateSuspect
		fresh := now.Sub(m.SeenAt) <= ttl
		// A record from before the node's current boot: the node restarted
		// and its new record has not arrived yet. What it claimed then is
		// not claimed now (its engines, if they survived, are re-adopted
		// and re-announced by the new agent).
		current := m.Epoch == 0 || m.Record.Version.Epoch >= m.Epoch
		n := placement.Node{
			Name:   m.Name,
			Alive:  alive && !m.Record.Leaving,
			Labels: m.Record.Labels,
			GPUs:   m.Record.GPUs,
		}
		for _, c := range m.Record.CachedModels {
			n.CachedModels = append(n.CachedModels, c.Model)
		}
		for _, s := range m.Record.Shards {
			n.Shards = append(n.Shards, placement.HeldShard{
				ShardID:      s.ShardID,
				SpecVersion:  s.SpecVersion,
				GPUs:         s.GPUs,
				MemoryPerGPU: s.MemoryPerGPU,
				Lease:        JudgeLease(alive && !m.Record.Leaving && current, fresh, s),
				ClaimStamp:   s.ClaimStamp,
				Failing:      s.Failing,
			})
		}
		v.Nodes = append(v.Nodes, n)
	}
	for _, d := range deps {
		if d.Deleted || d.Spec == nil {
			continue
		}
		spec := *d.Spec
		if a := spec.Autoscale; a != nil {
			// The decider's target, where one for this spec is out;
			// until then the spec's replicas (its start).
			if t, ok := gossip.ScaleTargetFor(members, d); ok {
				spec.Replicas = min(max(t.Replicas, a.Min), a.Max)
				// Its use, for GPU sharing (placed only with View.Share):
				// only an idle deployment's entry changes a plan, so
				// only it enters the view (and the plan cache's key).
				if t.Idle {
					if v.Usage == nil {
						v.Usage = map[string]placement.Usage{}
					}
					v.Usage[d.Name] = placement.Usage{Idle: t.Idle, LastRequest: t.LastRequest}
				}
			}
		}
		v.Deployments = append(v.Deployments, spec)
	}
	sort.Slice(v.Nodes, func(i, j int) bool { return v.Nodes[i].Name < v.Nodes[j].Name })
	return v
}

// JudgeLease says how a receiver treats one held shard.
func JudgeLease(holderAlive, renewedWithinTTL bool, s gossip.ShardRecord) placement.LeaseState {
	switch {
	case !holderAlive || !renewedWithinTTL:
		return placement.LeaseLapsed
	case s.Ready:
		return placement.LeaseValid
	case s.Status == gossip.ShardStopping:
		return placement.LeaseLapsed
	default:
		return placement.LeaseStarting
	}
}
