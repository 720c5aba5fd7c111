package supervisor

import (
	"testing"
	"time"

	"github.com/llmgw/llmgw/placement"
)

func TestHandoverSettlesAPeriodAfterFirstSeenValid(t *testing.T) {
	const period = time.Second
	t0 := time.Unix(1_700_000_000, 0)
	view := func(lease placement.LeaseState, claim int64) placement.View {
		return placement.View{Nodes: []placement.Node{{Name: "n1", Alive: true, Shards: []placement.HeldShard{
			{ShardID: "a-0", SpecVersion: "v2", Lease: lease, ClaimStamp: claim},
		}}}}
	}
	var h handover
	step := func(at time.Duration, lease placement.LeaseState, claim int64, settling bool, next time.Duration) {
		t.Helper()
		v := view(lease, claim)
		h.mark(&v, t0.Add(at), period)
		if got := v.Nodes[0].Shards[0].Settling; got != settling {
			t.Fatalf("at %v (%s, claim %d): settling %v, want %v", at, lease, claim, got, settling)
		}
		wantNext := time.Time{}
		if next >= 0 {
			wantNext = t0.Add(next)
		}
		if !h.next.Equal(wantNext) {
			t.Fatalf("at %v: next %v, want %v", at, h.next, wantNext)
		}
	}
	step(0, placement.LeaseStarting, 1, false, -1) // loading: nothing to settle
	step(200*time.Millisecond, placement.LeaseValid, 1, true, 1200*time.Millisecond)
	step(700*time.Millisecond, placement.LeaseValid, 1, true, 1200*time.Millisecond)
	step(1200*time.Millisecond, placement.LeaseValid, 1, false, -1)
	step(5*time.Second, placement.LeaseValid, 1, false, -1)
	// It lapsed and claimed afresh: the cluster must see it valid again.
	step(6*time.Second, placement.LeaseLapsed, 1, false, -1)
	step(7*time.Second, placement.LeaseValid, 1, true, 8*time.Second)
	step(8*time.Second, placement.LeaseValid, 2, true, 9*time.Second)
	step(9*time.Second, placement.LeaseValid, 2, false, -1)
	if len(h.since) != 1 {
		t.Fatalf("%d claims remembered, want only the current one", len(h.since))
	}
}
