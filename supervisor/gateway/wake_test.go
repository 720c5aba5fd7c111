package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

// scaledToZero is deployment "chat", autoscaled with min 0, at zero.
func scaledToZero() *world {
	w := newWorld()
	d := w.deploy(placement.Deployment{Name: "chat", Autoscale: &placement.Autoscale{Min: 0, Max: 2}})
	d.Replicas = 0 // deploy makes a missing count 1
	w.specs["chat"] = d
	w.node("n1", gossip.StateAlive)
	return w
}

// woken is chat with one ready replica at url, still scaling to zero.
func woken(url string) *world {
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat", Replicas: 1, Autoscale: &placement.Autoscale{Min: 0, Max: 2}})
	w.node("n1", gossip.StateAlive)
	w.hold(cp{dep: "chat", replica: 0, node: "n1", url: url})
	return w
}

func modelStates(t *testing.T, h *harness) map[string]string {
	t.Helper()
	a := h.do(context.Background(), http.MethodGet, "/v1/models", "")
	var list struct {
		Data []struct{ ID, State string }
	}
	if err := json.Unmarshal([]byte(a.body), &list); err != nil {
		t.Fatalf("/v1/models: %v: %s", err, a.body)
	}
	out := map[string]string{}
	for _, m := range list.Data {
		out[m.ID] = m.State
	}
	return out
}

// A deployment at zero is listed scaled_to_zero; a request to it is held
// (not 503), counts in the rates the node publishes, which is what wakes
// it, and is served once a replica is routable. Today's code answered 503
// no_routable_replica at once.
func TestScaledToZeroHoldsUntilAReplicaWakes(t *testing.T) {
	u := newUpstream(t, chatOK)
	h := newHarness(t, Config{}, scaledToZero().snapshot())
	if s := modelStates(t, h); s["chat"] != StateScaledToZero {
		t.Errorf("/v1/models states %v, want chat scaled_to_zero", s)
	}
	got := held(t, h, postAsync(h, "chat"))
	if r := h.gw.Rates()["chat"]; r <= 0 {
		t.Errorf("a held request is not in the published rates: %v", h.gw.Rates())
	}
	if n := h.gw.Held()["chat"]; n != 1 {
		t.Errorf("held %d, want 1", n)
	}
	h.gw.Update(woken(u.URL).snapshot())
	if a := <-got; a.status != 200 || a.header.Get("Llmgw-Replica") != "chat-0" {
		t.Fatalf("held request once woken: %d %s", a.status, a.body)
	}
	if n := h.gw.Held()["chat"]; n != 0 {
		t.Errorf("still held after it was served: %d", n)
	}
	if s := modelStates(t, h); s["chat"] != StateReady {
		t.Errorf("/v1/models states %v once woken, want ready", s)
	}
}

// A held stream gets its 200 and a comment at once, a comment every few
// seconds while it waits, then the engine's events; time to first byte is
// the engine's, not the comment's.
func TestHeldStreamGetsCommentsThenTheAnswer(t *testing.T) {
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		streamStart("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n", "data: [DONE]\n\n")(w)
	})
	h := newHarness(t, Config{}, scaledToZero().snapshot())
	out := make(chan answer, 1)
	go func() { out <- h.post("/v1/chat/completions", chatBody("chat", true)) }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.clock.BlockUntilContext(ctx, 2); err != nil { // the hold's timer and the comments' ticker
		t.Fatal(err)
	}
	h.clock.Advance(wakeComment)
	h.gw.Update(woken(u.URL).snapshotAt(h.clock.Now()))
	a := <-out
	if a.status != 200 || !strings.HasPrefix(a.body, ": chat is starting from zero") || !strings.Contains(a.body, ": waiting for a replica of chat to start (5s)") ||
		!strings.HasSuffix(a.body, "data: [DONE]\n\n") || !strings.Contains(a.body, `"content":"hi"`) {
		t.Fatalf("held stream: %d %q", a.status, a.body)
	}
}

// The bounds: past the hold a plain request gets 503 with Retry-After and
// a held stream a final error event; past the queue, 429; a stopping
// gateway answers its held requests at once.
func TestWakeHoldBounds(t *testing.T) {
	h := newHarness(t, Config{WakeHold: time.Minute, WakeQueue: 1}, scaledToZero().snapshot())
	got := held(t, h, postAsync(h, "chat"))
	if a := h.post("/v1/chat/completions", chatBody("chat", false)); a.status != 429 || a.apiError(t).Error.Code != "wake_queue_full" || a.header.Get("Retry-After") == "" {
		t.Errorf("a second request past the queue of 1: %+v", a)
	}
	h.clock.Advance(time.Minute)
	if a := <-got; a.status != 503 || a.header.Get("Retry-After") == "" || !strings.Contains(a.apiError(t).Error.Message, "no replica was ready within 1m0s") {
		t.Errorf("past the hold: %+v", a)
	}

	out := make(chan answer, 1)
	go func() { out <- h.post("/v1/chat/completions", chatBody("chat", true)) }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.clock.BlockUntilContext(ctx, 2); err != nil {
		t.Fatal(err)
	}
	h.gw.Drain()
	if a := <-out; a.status != 200 || !strings.Contains(a.body, `data: {"error":{"message":"node stopping`) {
		t.Errorf("a held stream when the gateway stops: %d %q, want its 200 and a final error event", a.status, a.body)
	}
}
