package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/supervisor/status"
)

// `llmgw version` prints the build and its protocol range; with --addr the
// cluster version the node there runs at. Without --addr it dials nothing,
// even with LLMGW_ADDR set (node upgrade runs it on a new binary).
func TestVersionPrintsTheRangeAndTheClusterVersion(t *testing.T) {
	t.Setenv("LLMGW_ADDR", "http://127.0.0.1:1")
	out, err := run(t, "version")
	wantBuild := fmt.Sprintf("llmgw %s\nprotocol versions %d-%d\n", version, protocol.Min, protocol.Max)
	if err != nil || out != wantBuild {
		t.Fatalf("version: %v\n%q, want %q", err, out, wantBuild)
	}
	for _, tc := range []struct {
		info status.ClusterInfo
		want []string
	}{
		{status.ClusterInfo{Self: "n1", ActiveVersion: 2}, []string{"cluster version 2 (as n1 sees it)\n"}},
		{status.ClusterInfo{Self: "n1", ActiveVersion: 1, VersionsMixedSince: time.Now().Add(-3 * time.Minute)},
			[]string{"cluster version 1 (as n1 sees it)\n", "nodes have announced different protocol versions for 3m"}},
		{status.ClusterInfo{Self: "old"}, []string{"cluster version 1 (old runs an llmgw from before cluster versions"}},
		{status.ClusterInfo{Self: "n1", ActiveVersion: protocol.Max + 1},
			[]string{fmt.Sprintf("this build cannot speak cluster version %d", protocol.Max+1)}},
	} {
		srv := standIn(t, map[string]any{"/v1/cluster": tc.info})
		out, err := run(t, "version", "--addr", srv.URL)
		if err != nil || !strings.HasPrefix(out, wantBuild) {
			t.Fatalf("version --addr: %v\n%s", err, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("version --addr (%+v) lacks %q:\n%s", tc.info, w, out)
			}
		}
	}
	if _, err := run(t, "version", "--addr", "http://127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "cannot reach") {
		t.Errorf("version --addr at nobody: %v", err)
	}
}

// `llmgw nodes` shows each node's build and protocol range, and says above
// the table which node the cluster refuses and why.
func TestNodesShowsVersionsAndARefusedNode(t *testing.T) {
	srv := standIn(t, map[string]any{
		"/v1/cluster": status.ClusterInfo{Self: "n1", ActiveVersion: 2, Members: []status.MemberInfo{
			{Name: "n1", State: gossip.StateAlive, API: "10.0.0.1:7070", AgentVersion: "v0.3.0", Protocol: protocol.Range{Min: 1, Max: 2}},
			{Name: "n2", State: gossip.StateRefused, Gossip: "10.0.0.2:7946", Protocol: protocol.Range{Min: 1, Max: 1}},
			{Name: "n3", State: gossip.StateUnknown, API: "10.0.0.3:7070"},
		}},
	})
	out, err := run(t, "nodes", "--addr", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(out, "\n")
	if first != "n2 is REFUSED: its build speaks protocol versions 1-1 and the cluster runs at version 2, which never goes down; upgrade it" {
		t.Errorf("first line %q", first)
	}
	for _, re := range []string{
		`(?m)^NAME\s+STATE\s+ADDRESS\s+VERSION\s+GPUS`,
		`(?m)^n1\s+alive\s+10\.0\.0\.1:7070\s+v0\.3\.0 p1-2\s`,
		`(?m)^n2\s+refused\s+- p1-1\s`,
		`(?m)^n3\s+unknown\s+10\.0\.0\.3:7070\s+-\s`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("no match for %s in:\n%s", re, out)
		}
	}
}
