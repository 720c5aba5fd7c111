package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
)

func TestKeyLimitsParse(t *testing.T) {
	ks, err := ParseKeys(strings.NewReader("sk-team-a-aaaaaaaaaaaa team a rps=2.5 burst=5 concurrency=3\nsk-team-b-bbbbbbbbbbbb\nsk-team-c-cccccccccccc concurrency=1\n"))
	if err != nil {
		t.Fatal(err)
	}
	a := ks.find("sk-team-a-aaaaaaaaaaaa")
	if a == nil || a.name != "team a" || a.lim != (Limits{RPS: 2.5, Burst: 5, Concurrent: 3}) {
		t.Fatalf("team a: %+v", a)
	}
	if b := ks.find("sk-team-b-bbbbbbbbbbbb"); b == nil || b.lim != (Limits{}) || b.label() == "" || strings.Contains(b.label(), "bbbb") {
		t.Fatalf("team b: %+v (label %q)", b, b.label())
	}
	if c := ks.find("sk-team-c-cccccccccccc"); c == nil || c.name != "" || c.lim.Concurrent != 1 {
		t.Fatalf("team c: %+v", c)
	}
	for line, want := range map[string]string{
		"sk-xxxxxxxxxxxxxxxxxx n rps=0":           "line 1: rps=0: want requests per second",
		"sk-xxxxxxxxxxxxxxxxxx n concurrency=two": "line 1: concurrency=two: want a whole number",
		"sk-xxxxxxxxxxxxxxxxxx n burst=4":         "line 1: burst= without rps=",
		"sk-xxxxxxxxxxxxxxxxxx n limit=4":         `line 1: unknown option "limit=4"`,
	} {
		if _, err := ParseKeys(strings.NewReader(line)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", line, err, want)
		}
	}
}

// A key over its rate gets 429 with Retry-After, and nothing of it reaches
// an engine; other keys are not held back, and the bucket refills with
// time.
func TestKeyRateLimit(t *testing.T) {
	u := newUpstream(t, chatOK)
	h := newHarness(t, Config{}, oneDeployment(u.URL).snapshot())
	ks, err := ParseKeys(strings.NewReader("sk-slow-aaaaaaaaaaaaaa slow rps=1 burst=2\nsk-free-bbbbbbbbbbbbbb free\n"))
	if err != nil {
		t.Fatal(err)
	}
	h.gw.SetKeys(ks)
	slow := []string{"Authorization", "Bearer sk-slow-aaaaaaaaaaaaaa"}
	for i := range 2 {
		if a := h.post("/v1/chat/completions", chatBody("chat", false), slow...); a.status != 200 {
			t.Fatalf("request %d within the burst: %+v", i, a)
		}
	}
	a := h.post("/v1/chat/completions", chatBody("chat", false), slow...)
	if e := a.apiError(t); a.status != 429 || e.Error.Type != "rate_limit_error" || !strings.Contains(e.Error.Message, "slow") || a.header.Get("Retry-After") != "1" {
		t.Fatalf("over the rate: %d %+v Retry-After %q", a.status, e, a.header.Get("Retry-After"))
	}
	if n := u.hits.Load(); n != 2 {
		t.Fatalf("engine saw %d requests, want 2 (the refused one must not reach it)", n)
	}
	if a := h.post("/v1/chat/completions", chatBody("chat", false), "Authorization", "Bearer sk-free-bbbbbbbbbbbbbb"); a.status != 200 {
		t.Fatalf("another key: %+v", a)
	}
	// A reload keeps the drained bucket: a SIGHUP is no way around a limit.
	h.gw.SetKeys(ks)
	if a := h.post("/v1/chat/completions", chatBody("chat", false), slow...); a.status != 429 {
		t.Fatalf("after a reload: %d, want 429", a.status)
	}
	h.clock.Advance(time.Second)
	if a := h.post("/v1/chat/completions", chatBody("chat", false), slow...); a.status != 200 {
		t.Fatalf("a second later: %+v", a)
	}
	if got := value(t, h.gw.m.keyLimited); got != 2 {
		t.Fatalf("limited counter %v, want 2", got)
	}
}

func TestKeyConcurrencyLimit(t *testing.T) {
	hold := make(chan struct{})
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { <-hold; chatOK(w, r) })
	h := newHarness(t, Config{}, oneDeployment(u.URL).snapshot())
	ks, err := ParseKeys(strings.NewReader("sk-one-aaaaaaaaaaaaaaa one concurrency=1\n"))
	if err != nil {
		t.Fatal(err)
	}
	h.gw.SetKeys(ks)
	key := []string{"Authorization", "Bearer sk-one-aaaaaaaaaaaaaaa"}
	var wg sync.WaitGroup
	wg.Go(func() { h.post("/v1/chat/completions", chatBody("chat", false), key...) })
	testwait.Until(t, 5*time.Second, "one request in flight", func() (bool, string) { return u.hits.Load() == 1, "" })
	if a := h.post("/v1/chat/completions", chatBody("chat", false), key...); a.status != 429 || !strings.Contains(a.body, "concurrency=1") {
		t.Fatalf("second at once: %+v", a)
	}
	close(hold)
	wg.Wait()
	if a := h.post("/v1/chat/completions", chatBody("chat", false), key...); a.status != 200 {
		t.Fatalf("after the first ended: %+v", a)
	}
}

// Usage is counted per key from the engines' answers, plain and streamed.
func TestKeyUsageCounted(t *testing.T) {
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Accept")+string(must(r)), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n")
			fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":7,\"total_tokens\":37}}\n\n")
			fmt.Fprint(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"x","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":4,"total_tokens":15}}`)
	})
	h := newHarness(t, Config{}, oneDeployment(u.URL).snapshot())
	ks, err := ParseKeys(strings.NewReader("sk-team-a-aaaaaaaaaaaa team-a\n"))
	if err != nil {
		t.Fatal(err)
	}
	h.gw.SetKeys(ks)
	key := []string{"Authorization", "Bearer sk-team-a-aaaaaaaaaaaa"}
	h.post("/v1/chat/completions", chatBody("chat", false), key...)
	if a := h.post("/v1/chat/completions", chatBody("chat", true), key...); !strings.Contains(a.body, "[DONE]") {
		t.Fatalf("stream: %+v", a)
	}
	// The counts are taken as the handler returns, which a client reading
	// a body of known length may beat.
	testwait.Until(t, 5*time.Second, "usage counted", func() (bool, string) {
		p := value(t, h.gw.m.keyTokens.WithLabelValues("team-a", "", "prompt"))
		c := value(t, h.gw.m.keyTokens.WithLabelValues("team-a", "", "completion"))
		n := value(t, h.gw.m.keyRequests.WithLabelValues("team-a", "", "200"))
		return p == 41 && c == 11 && n == 2, fmt.Sprintf("prompt %v (want 11+30), completion %v (want 4+7), requests %v (want 2)", p, c, n)
	})
}

func must(r *http.Request) []byte {
	b := make([]byte, 4096)
	n, _ := r.Body.Read(b)
	return b[:n]
}
