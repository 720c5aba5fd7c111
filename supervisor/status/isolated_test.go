package status

import (
	"testing"

	"github.com/llmgw/llmgw/gossip"
)

// Only the answering node's own row says it is isolated: what it shows of
// the others is its last view, not their state.
func TestIsolatedMarksOnlyTheSelfRow(t *testing.T) {
	members := []gossip.Member{{Name: "n1", State: gossip.StateSuspect}, {Name: "n3", State: gossip.StateAlive}}
	s := Build(Input{Self: "n3", Now: t0, TTL: ttl, Members: members, Isolated: t0.Add(-ttl)})
	for _, m := range s.Members() {
		want := m.Name == "n3"
		if m.Isolated != want || m.IsolatedSince.IsZero() == want {
			t.Errorf("%s: isolated %v since %v, want isolated %v", m.Name, m.Isolated, m.IsolatedSince, want)
		}
	}
	for _, m := range Build(Input{Self: "n3", Now: t0, TTL: ttl, Members: members}).Members() {
		if m.Isolated {
			t.Errorf("%s isolated without Input.Isolated", m.Name)
		}
	}
}
