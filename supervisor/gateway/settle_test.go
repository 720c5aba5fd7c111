package gateway

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

// heldHarness is a gateway whose node has just started: its snapshot does
// not say settled and knows no deployment, as a restarted node's first
// one before it heard the cluster. The engine stand-in answers chats.
func heldHarness(t *testing.T) (*harness, *upstream) {
	t.Helper()
	u := newUpstream(t, chatOK)
	early := newWorld()
	early.settling = true
	early.node("n1", gossip.StateAlive)
	return newHarness(t, Config{}, early.snapshot()), u
}

// postAsync sends a chat for model through h and hands back its answer.
func postAsync(h *harness, model string) <-chan answer {
	out := make(chan answer, 1)
	go func() { out <- h.post("/v1/chat/completions", chatBody(model, false)) }()
	return out
}

// held waits until the request whose answer comes on got is held: it
// waits on the hold's timer (the only timer of these gateways). A request
// answered instead fails the test, with its answer. It hands back got.
func held(t *testing.T, h *harness, got <-chan answer) <-chan answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	waiting := make(chan error, 1)
	go func() { waiting <- h.clock.BlockUntilContext(ctx, 1) }()
	select {
	case a := <-got:
		t.Fatalf("answered %d %s before the node settled, want the request held", a.status, a.body)
	case err := <-waiting:
		if err != nil {
			t.Fatalf("request not held: %v", err)
		}
	}
	return got
}

// A restarted node's gateway never answers 404 for a deployment the
// cluster has and the node has not heard of yet: the request is held
// until the node settles, then served; /health says 503 meanwhile. Today's
// code answered 404 "model_not_found" at once.
func TestUnsettledGatewayHoldsThenServes(t *testing.T) {
	h, u := heldHarness(t)
	got := held(t, h, postAsync(h, "chat"))
	if a := h.do(context.Background(), http.MethodGet, "/health", ""); a.status != 503 || a.header.Get("Retry-After") == "" ||
		a.apiError(t).Error.Code != "node_settling" {
		t.Fatalf("health before the node settled: %+v, want 503 node_settling with Retry-After", a)
	}
	settled := oneDeployment(u.URL)
	h.gw.Update(settled.snapshot())
	if a := <-got; a.status != 200 || a.header.Get("Llmgw-Replica") != "chat-0" {
		t.Fatalf("held request once settled: %d %s, want it served", a.status, a.body)
	}
	if a := h.do(context.Background(), http.MethodGet, "/health", ""); a.status != 200 {
		t.Fatalf("health once settled: %d %s", a.status, a.body)
	}
	// Settled, a model the cluster lacks is unknown at once.
	if a := h.post("/v1/chat/completions", chatBody("nope", false)); a.status != 404 || a.apiError(t).Error.Code != "model_not_found" {
		t.Fatalf("unknown model once settled: %+v", a)
	}
}

// A table that is not settled yet routes what it can at once (the node's
// own ready engines: it adopted them), and holds only what it cannot.
// A table built before settling that names the deployment but has no ready
// replica of it holds too, and a settled one that still lacks it answers
// 404: the model is unknown only once the node has heard the cluster.
func TestUnsettledGatewayRoutesWhatItCan(t *testing.T) {
	h, u := heldHarness(t)
	early := oneDeployment(u.URL)
	early.settling = true
	h.gw.Update(early.snapshot())
	if a := h.post("/v1/chat/completions", chatBody("chat", false)); a.status != 200 {
		t.Fatalf("a route the unsettled table has: %d %s, want it served at once", a.status, a.body)
	}

	noReplica := newWorld()
	noReplica.settling = true
	noReplica.deploy(placement.Deployment{Name: "chat"})
	noReplica.node("n1", gossip.StateAlive)
	h.gw.Update(noReplica.snapshot())
	got := held(t, h, postAsync(h, "chat"))
	empty := newWorld()
	empty.node("n1", gossip.StateAlive)
	h.gw.Update(empty.snapshot())
	if a := <-got; a.status != 404 || a.apiError(t).Error.Code != "model_not_found" {
		t.Fatalf("once a settled table lacks the model: %+v, want 404", a)
	}
}

// A node that has not settled within the hold's bound answers 503 with
// Retry-After, never 404; one that starts to stop answers its held
// requests so at once.
func TestHoldBoundAndStopAnswer503(t *testing.T) {
	h, _ := heldHarness(t)
	got := held(t, h, postAsync(h, "chat"))
	h.clock.Advance(DefaultSettleHold)
	if a := <-got; a.status != 503 || a.header.Get("Retry-After") != "1" || a.apiError(t).Error.Code != "node_settling" {
		t.Fatalf("past the hold's bound: %+v, want 503 node_settling with Retry-After", a)
	}

	got = held(t, h, postAsync(h, "chat"))
	h.gw.Drain()
	if a := <-got; a.status != 503 || a.header.Get("Retry-After") != "1" || a.apiError(t).Error.Code != "node_stopping" || !a.close {
		t.Fatalf("held when the node stops: %+v, want 503 node_stopping with Retry-After and Connection: close", a)
	}
}
