package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/supervisor/status"
)

// `llmgw nodes` asked of an isolated node says so above the table, and on
// its row: what it lists is its last view.
func TestNodesSaysTheAnsweringNodeIsIsolated(t *testing.T) {
	srv := standIn(t, map[string]any{
		"/v1/cluster": status.ClusterInfo{Self: "n3", Members: []status.MemberInfo{
			{Name: "n1", State: gossip.StateSuspect, API: "10.0.0.1:7070"},
			{Name: "n3", State: gossip.StateAlive, API: "10.0.0.3:7070", Isolated: true, IsolatedSince: time.Now().Add(-42 * time.Second)},
		}},
	})
	out, err := run(t, "nodes", "--addr", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(out, "\n")
	if !regexp.MustCompile(`^n3 is ISOLATED: it has heard no peer for 4[2-4]s, so this list is its last view; its shards' leases lapse elsewhere within the lease TTL$`).MatchString(first) {
		t.Errorf("first line %q", first)
	}
	if !regexp.MustCompile(`(?m)^n3\s+alive, isolated\s+10\.0\.0\.3:7070`).MatchString(out) || strings.Contains(out, "suspect, isolated") {
		t.Errorf("rows:\n%s", out)
	}
}
