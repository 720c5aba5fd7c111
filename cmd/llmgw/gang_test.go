package main

import (
	"testing"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// llmgw shards shows a gang member's rank and, while it does not serve,
// what holds the gang back.
func TestShardsGangColumns(t *testing.T) {
	waiting := status.ShardInfo{ShardID: "big-0-s1", Node: "n3", Lease: placement.LeaseStarting,
		Gang: &gossip.GangRecord{Rank: 1, Size: 2, Note: "waiting for rank 0's address (rank 0 on n1)"}}
	if got := gangRank(waiting); got != "1/2" {
		t.Errorf("rank %q", got)
	}
	if got, want := gangNote(waiting), "rank 1 on n3: waiting for rank 0's address (rank 0 on n1)"; got != want {
		t.Errorf("note %q, want %q", got, want)
	}
	serving := waiting
	serving.Lease = placement.LeaseValid
	if got := gangNote(serving); got != "" {
		t.Errorf("a serving member notes %q", got)
	}
	if got := gangRank(status.ShardInfo{ShardID: "chat-0"}); got != "-" {
		t.Errorf("single shard rank %q", got)
	}
}
