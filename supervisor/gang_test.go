package supervisor

import (
	"slices"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/engine"
)

// Every member of a gang gets the plan's node for every rank and that
// node's report; a holder is lost when dead, leaving or no longer renewing,
// and not when its record is of an older boot (an agent restarting, whose
// engines are adopted: no member may restart for it).
func TestGangViews(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ttl := 3 * time.Second
	spec := placement.Deployment{Name: "big", Model: "m", Engine: "fake", Replicas: 1, PipelineParallel: 3}.WithDefaults()
	v := spec.SpecVersion()
	shard := func(j int, ready bool, g gossip.GangRecord) gossip.ShardRecord {
		return gossip.ShardRecord{ShardID: placement.ShardID("big-0", j, 3), ReplicaID: "big-0", Deployment: "big", SpecVersion: v,
			Status: gossip.ShardReady, Ready: ready, Gang: &g}
	}
	plan := placement.Plan{}
	for j, n := range []string{"n1", "n2", "n3"} {
		plan.Assignments = append(plan.Assignments, placement.Assignment{ShardID: placement.ShardID("big-0", j, 3), ReplicaID: "big-0",
			Deployment: "big", SpecVersion: v, Node: n})
	}
	for _, tc := range []struct {
		name string
		n3   gossip.Member
		lost bool
	}{
		{"alive and renewing", gossip.Member{Name: "n3", State: gossip.StateAlive, SeenAt: now}, false},
		{"an agent restarting (a record of the boot before)", gossip.Member{Name: "n3", State: gossip.StateAlive, SeenAt: now, Epoch: 99}, false},
		{"dead", gossip.Member{Name: "n3", State: gossip.StateDead, SeenAt: now}, true},
		{"renewing no more", gossip.Member{Name: "n3", State: gossip.StateAlive, SeenAt: now.Add(-ttl - time.Second)}, true},
		{"leaving", gossip.Member{Name: "n3", State: gossip.StateAlive, SeenAt: now, Record: &gossip.NodeRecord{Name: "n3", Leaving: true}}, true},
	} {
		n3 := tc.n3
		if n3.Record == nil {
			n3.Record = &gossip.NodeRecord{Name: "n3", Version: gossip.Version{Epoch: 1}}
		}
		n3.Record.Shards = []gossip.ShardRecord{shard(2, true, gossip.GangRecord{Rank: 2, Size: 3, Generation: 5})}
		members := []gossip.Member{
			{Name: "n1", State: gossip.StateAlive, SeenAt: now, Record: &gossip.NodeRecord{Name: "n1",
				Shards: []gossip.ShardRecord{shard(0, true, gossip.GangRecord{Rank: 0, Size: 3, Generation: 5, Addr: "10.0.0.1:9", Members: []string{"n1", "n2", "n3"}})}}},
			{Name: "n2", State: gossip.StateAlive, SeenAt: now, Record: &gossip.NodeRecord{Name: "n2"}},
			n3,
		}
		mine := []engine.Desired{{Assignment: plan.Assignments[1], Spec: spec}}
		gangViews(mine, plan, members, now, ttl)
		g := mine[0].Gang
		if g == nil || g.Size != 3 || g.Rank != 1 || len(g.Peers) != 3 {
			t.Fatalf("%s: gang %+v", tc.name, g)
		}
		if p := g.Peers[0]; p.Node != "n1" || !p.Held || !p.Ready || p.Lost || p.Gang.Generation != 5 || p.Gang.Addr != "10.0.0.1:9" {
			t.Errorf("%s: rank 0 %+v", tc.name, p)
		}
		if p := g.Peers[1]; p.Node != "n2" || p.Held || p.Lost {
			t.Errorf("%s: rank 1 (this node, nothing reported yet) %+v", tc.name, p)
		}
		if p := g.Peers[2]; p.Node != "n3" || !p.Held || p.Lost != tc.lost {
			t.Errorf("%s: rank 2 %+v, want lost=%v", tc.name, p, tc.lost)
		}
		if got := slices.Contains(g.LostNodes, "n3"); got != tc.lost || slices.Contains(g.LostNodes, "n1") {
			t.Errorf("%s: lost nodes %v", tc.name, g.LostNodes)
		}
	}
	// A replica of one shard has no gang.
	single := placement.Deployment{Name: "chat", Model: "m", Engine: "fake", Replicas: 1}.WithDefaults()
	mine := []engine.Desired{{Assignment: placement.Assignment{ShardID: "chat-0", ReplicaID: "chat-0", Node: "n1"}, Spec: single}}
	gangViews(mine, plan, nil, now, ttl)
	if mine[0].Gang != nil {
		t.Errorf("single shard got a gang %+v", mine[0].Gang)
	}
}
