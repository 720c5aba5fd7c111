package gateway

import (
	"testing"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

// A gang is routed to through rank 0, the only member with a URL, and only
// while every member is ready in rank 0's generation: a member still in
// the generation before (rank 0 restarted the gang, the member's record has
// not caught up) leaves the gang unroutable, and so does a member whose
// lease lapsed while rank 0 still answers.
func TestTableRoutesAWholeGangOnly(t *testing.T) {
	for _, tc := range []struct {
		name    string
		gen1    int64
		lease1  placement.LeaseState
		routed  bool
		r0Addr  string
		r0Gen   int64
		members []string
	}{
		{"every member in rank 0's generation", 7, placement.LeaseValid, true, "n1:9000", 7, []string{"n1", "n2"}},
		{"a member of the generation before", 6, placement.LeaseValid, false, "n1:9000", 7, []string{"n1", "n2"}},
		{"a member whose lease lapsed", 7, placement.LeaseLapsed, false, "n1:9000", 7, []string{"n1", "n2"}},
	} {
		w := newWorld()
		w.deploy(placement.Deployment{Name: "big", Replicas: 1, PipelineParallel: 2})
		w.node("n1", gossip.StateAlive)
		w.node("n2", gossip.StateAlive)
		w.hold(cp{dep: "big", shard: 0, node: "n1", url: "http://n1:8100",
			gang: &gossip.GangRecord{Rank: 0, Size: 2, Generation: tc.r0Gen, Addr: tc.r0Addr, Members: tc.members}})
		w.hold(cp{dep: "big", shard: 1, node: "n2", lease: tc.lease1, status: gossip.ShardReady,
			gang: &gossip.GangRecord{Rank: 1, Size: 2, Generation: tc.gen1}})
		rs := BuildTable(w.snapshot(), t0).Routes("big")
		if got := len(rs) == 1; got != tc.routed {
			t.Errorf("%s: routes %v, want routed=%v", tc.name, routeIDs(rs), tc.routed)
			continue
		}
		if tc.routed && (rs[0].ShardID != "big-0-s0" || rs[0].URL != "http://n1:8100") {
			t.Errorf("%s: route %+v, want rank 0's", tc.name, rs[0])
		}
	}
}
