package page

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/supervisor/status"
)

// The page shows each node's protocol range, a refused node as refused, and
// warns once versions have been mixed for more than VersionsMixedWarnAfter:
// not during an upgrade's first minutes.
func TestPageWarnsWhenVersionsStayMixed(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	members := []gossip.Member{
		{Name: "n1", State: gossip.StateAlive, Protocol: protocol.Range{Min: 1, Max: 2}, Record: &gossip.NodeRecord{Name: "n1", AgentVersion: "v0.3.0"}},
		{Name: "n2", State: gossip.StateAlive, Protocol: protocol.Range{Min: 1, Max: 1}, Record: &gossip.NodeRecord{Name: "n2", AgentVersion: "v0.2.0"}},
		{Name: "n3", State: gossip.StateRefused, Protocol: protocol.Range{Min: 3, Max: 3}},
	}
	draw := func(mixedFor time.Duration) string {
		t.Helper()
		in := status.Input{Self: "n1", Now: now, TTL: 3 * time.Second, Members: members, ActiveVersion: 1}
		if mixedFor > 0 {
			in.VersionsMixedSince = now.Add(-mixedFor)
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, build(status.Build(in), now, nil, false)); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	for _, tc := range []struct {
		mixedFor time.Duration
		warns    bool
	}{{0, false}, {VersionsMixedWarnAfter - time.Second, false}, {VersionsMixedWarnAfter + time.Minute, true}} {
		page := draw(tc.mixedFor)
		warned := strings.Contains(page, `id="versions-mixed"`)
		if warned != tc.warns {
			t.Errorf("mixed for %v: warned %v, want %v", tc.mixedFor, warned, tc.warns)
		}
		if warned && !strings.Contains(page, "different protocol versions for 11m: the cluster runs version 1") {
			t.Errorf("the warning does not say for how long and at which version:\n%s", page)
		}
		for _, want := range []string{"v0.3.0 · protocol 1-2", "v0.2.0 · protocol 1-1", "protocol 3-3", `<td class="bad">refused</td>`} {
			if !strings.Contains(page, want) {
				t.Errorf("mixed for %v: page lacks %q", tc.mixedFor, want)
			}
		}
	}
}
