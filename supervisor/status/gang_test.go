package status

import (
	"slices"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

// A gang's members carry their ranks into the read model, and the member
// that holds the gang back says why in its deployment's reasons; a member
// that serves says nothing there.
func TestGangMembersAndWhatHoldsThemBack(t *testing.T) {
	c := newCluster(2)
	c.hold("n1", "chat-0-s0", placement.LeaseStarting, t0, gossip.ShardRecord{Status: gossip.ShardStarting,
		Gang: &gossip.GangRecord{Rank: 0, Size: 2, Generation: 7, Addr: "10.0.0.1:8200", Members: []string{"n1", "n3"}, Note: "waiting for 1 more rank(s) to connect"}})
	c.hold("n3", "chat-0-s1", placement.LeaseStarting, t0, gossip.ShardRecord{Status: gossip.ShardStarting,
		Gang: &gossip.GangRecord{Rank: 1, Size: 2, Note: "waiting for rank 0's address (rank 0 on n1)"}})
	snap := c.build()
	rows := snap.Shards(t0)
	if len(rows) != 2 || rows[0].Gang == nil || rows[0].Gang.Rank != 0 || rows[1].Gang == nil || rows[1].Gang.Rank != 1 || rows[0].Gang.Generation != 7 {
		t.Fatalf("shards %+v", rows)
	}
	why := snap.Deployments(t0)[0].Why
	want := []string{"chat-0-s0 (rank 0) on n1: waiting for 1 more rank(s) to connect", "chat-0-s1 (rank 1) on n3: waiting for rank 0's address (rank 0 on n1)"}
	if !slices.Equal(why, want) {
		t.Errorf("why = %q, want %q", why, want)
	}

	// Serving, the gang has nothing to say.
	c = newCluster(2)
	c.hold("n1", "chat-0-s0", placement.LeaseValid, t0, gossip.ShardRecord{Ready: true, Gang: &gossip.GangRecord{Rank: 0, Size: 2, Generation: 7, Note: "waiting for 1 more rank(s) to connect"}})
	c.hold("n3", "chat-0-s1", placement.LeaseValid, t0, gossip.ShardRecord{Ready: true, Gang: &gossip.GangRecord{Rank: 1, Size: 2, Generation: 7}})
	d := c.build().Deployments(t0)[0]
	if len(d.Why) != 0 || d.Ready != 1 {
		t.Errorf("serving gang: ready %d, why %q", d.Ready, d.Why)
	}
	for _, w := range d.Why {
		if strings.Contains(w, "rank") {
			t.Errorf("a serving gang explains itself: %q", w)
		}
	}
}
