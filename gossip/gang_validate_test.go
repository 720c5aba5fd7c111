package gossip

import (
	"strings"
	"testing"
	"time"
)

// A gang's rendezvous comes from gossip, and members dial what it says:
// it is checked like API input, and a record that points members at
// another host, or claims a rank its shard is not, is refused whole.
func TestGangRecordsAreChecked(t *testing.T) {
	now := time.Now()
	rec := func(rank int, mut func(g *GangRecord)) NodeRecord {
		shard := "big-0-s0"
		if rank == 1 {
			shard = "big-0-s1"
		}
		g := &GangRecord{Rank: rank, Size: 2, Generation: 42}
		if rank == 0 {
			g.Addr, g.Members = "10.0.0.5:8200", []string{"peer", "n2"}
		}
		if mut != nil {
			mut(g)
		}
		return NodeRecord{Name: "peer", Version: Version{Epoch: now.UnixNano(), Seq: 1}, API: "10.0.0.5:7070", Gossip: "10.0.1.5:7946",
			Shards: []ShardRecord{{ShardID: shard, ReplicaID: "big-0", Deployment: "big", SpecVersion: "abc", Status: ShardStarting, Gang: g}}}
	}
	for why, r := range map[string]NodeRecord{
		"rank 0 with its rendezvous":  rec(0, nil),
		"rank 0 before it started":    rec(0, func(g *GangRecord) { g.Addr, g.Members, g.Generation = "", nil, 0 }),
		"rank 1 running":              rec(1, nil),
		"rank 1 waiting, with a note": rec(1, func(g *GangRecord) { g.Generation, g.Note = 0, "waiting for rank 0's address" }),
	} {
		if _, err := checkNode(r, now); err != nil {
			t.Errorf("%s: refused: %v", why, err)
		}
	}
	for _, c := range []struct {
		why, field string
		r          NodeRecord
	}{
		{"rendezvous at another host", "gang.addr", rec(0, func(g *GangRecord) { g.Addr = "203.0.113.9:8200" })},
		{"rendezvous at a wildcard", "gang.addr", rec(0, func(g *GangRecord) { g.Addr = "0.0.0.0:8200" })},
		{"rendezvous without a port", "gang.addr", rec(0, func(g *GangRecord) { g.Addr = "10.0.0.5" })},
		{"rendezvous port out of range", "gang.addr", rec(0, func(g *GangRecord) { g.Addr = "10.0.0.5:70000" })},
		{"rank 1 publishing a rendezvous", "gang.addr", rec(1, func(g *GangRecord) { g.Addr = "10.0.0.5:8200" })},
		{"a rank that is not the shard's", "gang.rank", rec(1, func(g *GangRecord) { g.Rank = 0 })},
		{"a rank past the size", "gang.rank", rec(1, func(g *GangRecord) { g.Rank = 2 })},
		{"a gang of one", "gang.size", rec(0, func(g *GangRecord) { g.Size = 1 })},
		{"a gang too large", "gang.size", rec(0, func(g *GangRecord) { g.Size = 65 })},
		{"a negative generation", "gang.generation", rec(0, func(g *GangRecord) { g.Generation = -1 })},
		{"members not one per rank", "gang.members", rec(0, func(g *GangRecord) { g.Members = []string{"peer"} })},
		{"a member that is no node name", "gang.members", rec(0, func(g *GangRecord) { g.Members = []string{"peer", "a/b"} })},
		{"a note too long", "gang.note", rec(1, func(g *GangRecord) { g.Note = strings.Repeat("x", 301) })},
		{"a note with control characters", "gang.note", rec(1, func(g *GangRecord) { g.Note = "a\x1b[2Jb" })},
	} {
		reason, err := checkNode(c.r, now)
		if err == nil || reason != DropInvalidNode || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %s %v, want invalid_node naming %s", c.why, reason, err, c.field)
		}
	}
}
