package supervisor

import (
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

func TestLeaseJudgement(t *testing.T) {
	now := time.Unix(1000, 0)
	ttl := 10 * time.Second
	ready := gossip.ShardRecord{ShardID: "a-0", Ready: true, Status: gossip.ShardReady}
	starting := gossip.ShardRecord{ShardID: "a-0", Status: gossip.ShardStarting}
	rec := func(epoch int64, s gossip.ShardRecord) *gossip.NodeRecord {
		return &gossip.NodeRecord{Name: "n1", Version: gossip.Version{Epoch: epoch, Seq: 3}, Shards: []gossip.ShardRecord{s}}
	}
	cases := []struct {
		name string
		m    gossip.Member
		want placement.LeaseState
	}{
		{"ready, renewed, alive", gossip.Member{Name: "n1", State: gossip.StateAlive, SeenAt: now.Add(-time.Second), Record: rec(1, ready)}, placement.LeaseValid},
		{"suspect still holds", gossip.Member{Name: "n1", State: gossip.StateSuspect, SeenAt: now.Add(-time.Second), Record: rec(1, ready)}, placement.LeaseValid},
		{"not ready yet", gossip.Member{Name: "n1", State: gossip.StateAlive, SeenAt: now, Record: rec(1, starting)}, placement.LeaseStarting},
		{"not renewed within TTL", gossip.Member{Name: "n1", State: gossip.StateAlive, SeenAt: now.Add(-11 * time.Second), Record: rec(1, ready)}, placement.LeaseLapsed},
		{"holder dead", gossip.Member{Name: "n1", State: gossip.StateDead, SeenAt: now, Record: rec(1, ready)}, placement.LeaseLapsed},
		{"record from the previous boot", gossip.Member{Name: "n1", State: gossip.StateAlive, SeenAt: now, Epoch: 2, Record: rec(1, ready)}, placement.LeaseLapsed},
		{"record of the current boot", gossip.Member{Name: "n1", State: gossip.StateAlive, SeenAt: now, Epoch: 2, Record: rec(2, ready)}, placement.LeaseValid},
	}
	for _, c := range cases {
		v := BuildView([]gossip.Member{c.m}, nil, now, ttl)
		if got := v.Nodes[0].Shards[0].Lease; got != c.want {
			t.Errorf("%s: lease %s, want %s", c.name, got, c.want)
		}
	}
	leaving := gossip.Member{Name: "n1", State: gossip.StateAlive, SeenAt: now, Record: rec(1, ready)}
	leaving.Record.Leaving = true
	if v := BuildView([]gossip.Member{leaving}, nil, now, ttl); v.Nodes[0].Alive || v.Nodes[0].Shards[0].Lease != placement.LeaseLapsed {
		t.Errorf("a leaving node still holds: %+v", v.Nodes[0])
	}
}
