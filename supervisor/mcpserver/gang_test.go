package mcpserver

import (
	"strings"
	"testing"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// why_not names a gang member's rank and, while it does not serve, what
// holds the gang back.
func TestExplainGangMember(t *testing.T) {
	w := explain(status.ShardInfo{ShardID: "big-0-s1", Deployment: "big", Node: "n3", GPUs: []int{0}, Status: gossip.ShardStarting,
		Lease: placement.LeaseStarting, Gang: &gossip.GangRecord{Rank: 1, Size: 2, Note: "waiting for rank 0's address (rank 0 on n1)"}})
	if w.Rank == nil || *w.Rank != 1 || w.GangSize != 2 || !strings.Contains(w.Why, "gang rank 1 of 2 on n3: waiting for rank 0's address") {
		t.Errorf("explain = %+v", w)
	}
	w = explain(status.ShardInfo{ShardID: "big-0-s0", Deployment: "big", Node: "n1", Status: gossip.ShardReady, Lease: placement.LeaseValid,
		Gang: &gossip.GangRecord{Rank: 0, Size: 2, Note: "waiting for 1 more rank(s) to connect"}})
	if w.Rank == nil || *w.Rank != 0 || strings.Contains(w.Why, "waiting") {
		t.Errorf("a serving rank 0 explained as %+v", w)
	}
}
