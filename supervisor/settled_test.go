package supervisor

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// A node's snapshots say whether it had heard the cluster when they were
// built, whatever its runner (here none: the claim-only runner has no
// Settle of its own), and the first one that says so already holds the
// cluster's deployments: the gateway answers 404 for a model only from
// such a snapshot. The node alone settles at once; the node that joins it
// settles once it heard it.
func TestSnapshotsSaySettledOnceTheClusterIsHeard(t *testing.T) {
	h := newHarness(t)
	a := h.start("a")
	testwait.Until(t, 10*time.Second, "a, alone, settles", func() (bool, string) {
		return a.Status().Settled(), "not settled"
	})
	if _, err := a.Place(context.Background(), placement.Deployment{Name: "chat", Model: "m/tiny", Engine: "fake", Replicas: 1}); err != nil {
		t.Fatal(err)
	}

	b := h.start("b", h.gossipAddr("a"))
	has := func(s *status.Snapshot) bool {
		for _, d := range s.Deployments(s.BuiltAt()) {
			if d.Name == "chat" {
				return true
			}
		}
		return false
	}
	// b's snapshots read as they are published (one published between
	// two reads is not seen): none says settled without chat.
	deadline := time.After(15 * time.Second) // a bound for the test, not a synchronisation
	for {
		next := b.Published()
		snap := b.Status()
		if snap.Settled() {
			if !has(snap) {
				t.Fatalf("b's snapshot of %v says settled but lacks chat", snap.BuiltAt())
			}
			break
		}
		select {
		case <-next:
		case <-deadline:
			t.Fatal("b never settled")
		}
	}
}

// A node whose peers do not answer is not settled: its gateway holds what
// it cannot route, and its /health says 503.
func TestSnapshotsSayNotSettledWhileNoPeerAnswers(t *testing.T) {
	h := newHarness(t)
	lone := h.start("lone", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	// Two passes after its start, well within the settle bound.
	for range 2 {
		next := lone.Published()
		select {
		case <-next:
		case <-time.After(5 * time.Second): // a bound for the test
			t.Fatal("no snapshot published")
		}
	}
	if lone.Status().Settled() {
		t.Fatal("a node that reached no peer says settled within the settle bound")
	}
}
