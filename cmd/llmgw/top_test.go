package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/muesli/termenv"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/overview"
	"github.com/llmgw/llmgw/supervisor/status"
)

// At 80 columns no line is wider than the screen (a long reason is cut
// with an ellipsis), a shard that moved has one row, and each load
// reading says its age.
func TestTopFitsTheTerminal(t *testing.T) {
	now := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	snap := topSnapshot{
		cluster: status.ClusterInfo{Self: "gpu-node-with-a-long-name-1", Members: []status.MemberInfo{
			{Name: "gpu-node-with-a-long-name-1", State: gossip.StateAlive, Runtime: "containerd"},
			{Name: "n2", State: gossip.StateSuspect},
		}},
		models: []status.DeploymentInfo{{Deployment: placement.Deployment{Name: "llama", Replicas: 2}, Ready: 1,
			Why: []string{"llama-1: no node has 2 GPUs of type H100 with 70 GiB free each; gpu-node-with-a-long-name-1 has 1, n2 is suspect"}}},
		shards: []status.ShardInfo{
			{ShardID: "llama-0", SpecVersion: "v1", Deployment: "llama", Node: "n2", Lease: placement.LeaseLapsed, Status: gossip.ShardReady, Reason: "lease lapsed"},
			{ShardID: "llama-0", SpecVersion: "v1", Deployment: "llama", Node: "gpu-node-with-a-long-name-1", Lease: placement.LeaseValid, Status: gossip.ShardReady,
				Load: gossip.ShardLoad{Running: 1, ScrapedAt: now.Add(-12 * time.Second)}},
			{ShardID: "llama-0", SpecVersion: "v2", Deployment: "llama", Node: "n2", Lease: placement.LeaseStarting, Status: gossip.ShardStarting},
		},
		gatewayErr: errNoGatewayForTest,
	}
	var b bytes.Buffer
	renderTop(&b, "http://10.0.0.1:7070", snap, now, 80, overview.Plain())
	out := b.String()
	for _, l := range strings.Split(out, "\n") {
		if lipgloss.Width(l) > 80 {
			t.Errorf("line wider than 80 columns (%d): %q", lipgloss.Width(l), l)
		}
	}
	if !strings.Contains(out, "…") || !strings.Contains(out, "nodes 1/2 alive  models 1  shards 1/2 ready") || !strings.Contains(out, "FAULTS/15m") || !strings.Contains(out, "LOAD AGE") || !strings.Contains(out, "12s") {
		t.Errorf("frame:\n%s", out)
	}
	if n := strings.Count(out, "\nllama-0 "); n != 2 {
		t.Errorf("%d rows for llama-0 (want one for v1, whichever node it moved to, and one for v2):\n%s", n, out)
	}
	if !strings.Contains(out, "RESTARTS") {
		t.Errorf("the shard table lost its last column at 80 columns:\n%s", out)
	}
	if strings.Contains(out, "lapsed") {
		t.Errorf("the old holder's row of the moved shard is shown:\n%s", out)
	}
	// Colour: states are drawn in colour on a terminal, and the width
	// still holds.
	b.Reset()
	renderTop(&b, "http://10.0.0.1:7070", snap, now, 80, coloredForTest())
	for _, l := range strings.Split(b.String(), "\n") {
		if lipgloss.Width(l) > 80 {
			t.Errorf("coloured line wider than 80: %q", l)
		}
	}
	if !strings.Contains(b.String(), "\x1b[") {
		t.Errorf("no colour in the coloured frame")
	}
}

var errNoGatewayForTest = &gatewayTestErr{}

type gatewayTestErr struct{}

func (*gatewayTestErr) Error() string { return "GET /v1/gateway/stats: 404 Not Found" }

// coloredForTest is the terminal styles with colour forced on (the test's
// output is not a terminal).
func coloredForTest() overview.Styles {
	r := lipgloss.NewRenderer(&bytes.Buffer{})
	r.SetColorProfile(termenv.ANSI)
	return overview.StylesFor(r)
}
