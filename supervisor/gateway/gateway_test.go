package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/testlog"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/fakeengine"
)

// Bad requests are answered by the gateway, in OpenAI's shape, naming what
// is wrong, and nothing reaches an engine.
func TestBadRequestsNeverReachAnEngine(t *testing.T) {
	u := newUpstream(t, chatOK)
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat", Model: "org/shared"})
	w.deploy(placement.Deployment{Name: "chat2", Model: "org/shared"})
	w.node("n1", gossip.StateAlive)
	w.hold(cp{dep: "chat", node: "n1", url: u.URL})
	w.hold(cp{dep: "chat2", node: "n1", url: u.URL})
	h := newHarness(t, Config{MaxBodyBytes: 1024}, w.snapshot())

	cases := []struct {
		name, path, body string
		status           int
		code, param      string
		says             []string
	}{
		{"unknown model", "/v1/chat/completions", chatBody("nope", false), 404, "model_not_found", "model", []string{`"nope"`, "chat, chat2"}},
		{"ambiguous model id", "/v1/chat/completions", chatBody("org/shared", false), 400, "model_ambiguous", "model", []string{"(chat, chat2)"}},
		{"empty messages", "/v1/chat/completions", `{"model":"chat","messages":[ ]}`, 400, "invalid_value", "messages", []string{"at least one message"}},
		{"messages not a list", "/v1/chat/completions", `{"model":"chat","messages":"hi"}`, 400, "invalid_value", "messages", []string{"a string"}},
		{"no messages", "/v1/chat/completions", `{"model":"chat"}`, 400, "invalid_value", "messages", []string{"messages: required"}},
		{"stream not a boolean", "/v1/chat/completions", `{"model":"chat","stream":"yes","messages":[{}]}`, 400, "invalid_value", "stream", []string{"want a boolean", "a string"}},
		{"model not a string", "/v1/chat/completions", `{"model":7,"messages":[{}]}`, 400, "invalid_value", "model", []string{"a number"}},
		{"no model", "/v1/completions", `{"prompt":"x"}`, 400, "invalid_value", "model", []string{"model: required"}},
		{"no prompt", "/v1/completions", `{"model":"chat"}`, 400, "invalid_value", "prompt", nil},
		{"null input", "/v1/embeddings", `{"model":"chat","input":null}`, 400, "invalid_value", "input", nil},
		{"not JSON", "/v1/chat/completions", `model=chat`, 400, "invalid_value", "", []string{"not a JSON object"}},
		{"truncated JSON", "/v1/chat/completions", `{"model":"chat","messages":[{"role":"user"`, 400, "invalid_value", "", nil},
		{"body over the cap", "/v1/chat/completions", `{"model":"chat","messages":[{"content":"` + strings.Repeat("x", 2000) + `"}]}`, 413, "request_too_large", "", []string{"1024 bytes"}},
		{"unknown endpoint", "/v1/responses", chatBody("chat", false), 404, "unknown_url", "", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := h.post(c.path, c.body)
			e := a.apiError(t)
			if a.status != c.status || e.Error.Code != c.code {
				t.Fatalf("%d %s, want %d %s", a.status, a.body, c.status, c.code)
			}
			if got := ""; e.Error.Param != nil {
				got = *e.Error.Param
				if got != c.param {
					t.Fatalf("param %q, want %q", got, c.param)
				}
			} else if c.param != "" {
				t.Fatalf("no param, want %q", c.param)
			}
			for _, s := range c.says {
				if !strings.Contains(e.Error.Message, s) {
					t.Fatalf("message %q does not say %q", e.Error.Message, s)
				}
			}
		})
	}
	// A body over the cap without Content-Length (chunked) is refused too.
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", struct{ *strings.Reader }{strings.NewReader(strings.Repeat(" ", 4096))})
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Fatalf("chunked body over the cap: %d", resp.StatusCode)
	}
	if n := u.hits.Load(); n != 0 {
		t.Fatalf("%d requests reached the engine", n)
	}
	if a := h.do(context.Background(), http.MethodGet, "/v1/chat/completions", ""); a.status != 405 || a.header.Get("Allow") != "POST" {
		t.Fatalf("GET chat: %+v", a)
	}
}

// A model id served by one deployment is accepted, and only the body's
// model is rewritten to the deployment name; every other byte is the
// client's.
func TestModelIDIsRewrittenToTheDeploymentName(t *testing.T) {
	u := newUpstream(t, chatOK)
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat", Model: "meta-llama/Llama-3.1-8B"})
	w.node("n1", gossip.StateAlive)
	w.hold(cp{dep: "chat", node: "n1", url: u.URL})
	h := newHarness(t, Config{}, w.snapshot())
	body := "{ \"messages\" : [{\"role\":\"user\",\"content\":\"\\\"model\\\": x\"}],\n \"model\" :\t\"meta-llama/Llama-3.1-8B\" , \"temperature\":0.50}"
	if a := h.post("/v1/chat/completions", body); a.status != 200 {
		t.Fatalf("answer %+v", a)
	}
	want := strings.Replace(body, `"meta-llama/Llama-3.1-8B"`, `"chat"`, 1)
	if got := string(u.lastBody()); got != want {
		t.Fatalf("engine got\n%s\nwant\n%s", got, want)
	}
	// By name, the body is not touched at all.
	body = `{"model":"chat","messages":[{"role":"user","content":"hi"}],"temperature":0.50}`
	h.post("/v1/chat/completions", body)
	if got := string(u.lastBody()); got != body {
		t.Fatalf("engine got %s", got)
	}
}

// With keys set, a request without a valid key gets 401 in OpenAI's shape
// and reaches nothing; a valid key passes, and its name is logged.
func TestKeysEnforced(t *testing.T) {
	u := newUpstream(t, chatOK)
	var log testlog.Buffer
	h := newHarness(t, Config{AccessLog: &log}, oneDeployment(u.URL).snapshot())
	ks, err := ParseKeys(strings.NewReader("# ops\nsk-live-aaaaaaaaaaaaaaaa alice smith\nsk-live-bbbbbbbbbbbbbbbb\n"))
	if err != nil {
		t.Fatal(err)
	}
	h.gw.SetKeys(ks)
	for _, hdr := range [][]string{nil, {"Authorization", "Bearer sk-live-cccccccccccccccc"}, {"Authorization", "Basic sk-live-aaaaaaaaaaaaaaaa"}, {"Authorization", "Bearer "}} {
		a := h.post("/v1/chat/completions", chatBody("chat", false), hdr...)
		if e := a.apiError(t); a.status != 401 || e.Error.Code != "invalid_api_key" {
			t.Fatalf("%v: %+v", hdr, a)
		}
	}
	if a := h.do(context.Background(), http.MethodGet, "/v1/models", ""); a.status != 401 {
		t.Fatalf("models without a key: %d", a.status)
	}
	if n := u.hits.Load(); n != 0 {
		t.Fatalf("%d unauthorised requests reached the engine", n)
	}
	if a := h.post("/v1/chat/completions", chatBody("chat", false), "Authorization", "Bearer sk-live-aaaaaaaaaaaaaaaa"); a.status != 200 {
		t.Fatalf("valid key: %+v", a)
	}
	if a := h.do(context.Background(), http.MethodGet, "/health", ""); a.status != 200 {
		t.Fatalf("health needs no key (load balancers probe it): %d", a.status)
	}
	// Opening the gateway again.
	h.gw.SetKeys(nil)
	if a := h.post("/v1/chat/completions", chatBody("chat", false)); a.status != 200 {
		t.Fatalf("open again: %+v", a)
	}
	h.gw.Shutdown(context.Background())
	if !strings.Contains(log.String(), `key="alice smith"`) || strings.Contains(log.String(), "sk-live") {
		t.Fatalf("access log:\n%s", log.String())
	}
}

func TestLoadKeys(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "keys")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ks, err := LoadKeys(write("\n# comment\n  sk-0123456789abcdef   ci runner  \nsk-fedcba9876543210\n"))
	if err != nil || ks.Len() != 2 {
		t.Fatalf("%v, %v", ks, err)
	}
	if name, ok := ks.Check("sk-0123456789abcdef"); !ok || name != "ci runner" {
		t.Fatalf("check: %q %v", name, ok)
	}
	if name, ok := ks.Check("sk-fedcba9876543210"); !ok || name != "" {
		t.Fatalf("check unnamed: %q %v", name, ok)
	}
	if _, ok := ks.Check("sk-0123456789abcdeX"); ok {
		t.Fatal("a wrong key passed")
	}
	for _, c := range []struct{ file, want string }{
		{"sk-0123456789abcdef\n\nshort\n", "line 3: key is 5 characters; want at least 16"},
		{"sk-0123456789abcdef a\nsk-0123456789abcdef b\n", "line 2: the key of line 1 again"},
		{"# nothing\n\n", "no key"},
	} {
		_, err := LoadKeys(write(c.file))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), dir) {
			t.Fatalf("%q: %v, want %q with the path", c.file, err, c.want)
		}
	}
	if _, err := LoadKeys(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

// Suspect nodes are routed to only when nothing else is routable.
func TestSuspectOnlyWhenNothingElse(t *testing.T) {
	a, b := newUpstream(t, chatOK), newUpstream(t, chatOK)
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat", Replicas: 2})
	w.node("n1", gossip.StateSuspect)
	w.node("n2", gossip.StateAlive)
	w.hold(cp{dep: "chat", replica: 0, node: "n1", url: a.URL})
	w.hold(cp{dep: "chat", replica: 1, node: "n2", url: b.URL})
	h := newHarness(t, Config{}, w.snapshot())
	for range 4 {
		h.post("/v1/chat/completions", chatBody("chat", false))
	}
	if a.hits.Load() != 0 || b.hits.Load() != 4 {
		t.Fatalf("suspect got %d, alive %d", a.hits.Load(), b.hits.Load())
	}
	w = newWorld()
	w.deploy(placement.Deployment{Name: "chat"})
	w.node("n1", gossip.StateSuspect)
	w.hold(cp{dep: "chat", node: "n1", url: a.URL})
	h.gw.Update(w.snapshot())
	if r := h.post("/v1/chat/completions", chatBody("chat", false)); r.status != 200 || a.hits.Load() != 1 {
		t.Fatalf("suspect only: %+v", r)
	}
}

// A route whose lease lapsed since the table was built is skipped at
// request time, and the answer says why and when to retry.
func TestLapsedAtRequestTimeIsSkipped(t *testing.T) {
	u := newUpstream(t, chatOK)
	h := newHarness(t, Config{}, oneDeployment(u.URL).snapshot())
	if a := h.post("/v1/chat/completions", chatBody("chat", false)); a.status != 200 {
		t.Fatalf("%+v", a)
	}
	h.clock.Advance(ttl + time.Millisecond)
	a := h.post("/v1/chat/completions", chatBody("chat", false))
	if a.status != 503 || a.header.Get("Retry-After") == "" || a.apiError(t).Error.Code != "no_routable_replica" || u.hits.Load() != 1 {
		t.Fatalf("%+v, hits %d", a, u.hits.Load())
	}
	models := h.do(context.Background(), http.MethodGet, "/v1/models", "")
	if !strings.Contains(models.body, `"data":[]`) {
		t.Fatalf("models %s, want none", models.body)
	}
}

// A known deployment with nothing routable answers 503 with placement's
// reason and Retry-After.
func TestNoRoutableReplicaSaysWhy(t *testing.T) {
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat"})
	w.unplaced("chat", 0, "needs 1 whole GPU; best node n3 has 0")
	h := newHarness(t, Config{}, w.snapshot())
	a := h.post("/v1/chat/completions", chatBody("chat", false))
	if a.status != 503 || a.header.Get("Retry-After") != "5" || !strings.Contains(a.apiError(t).Error.Message, "chat-0: needs 1 whole GPU; best node n3 has 0") {
		t.Fatalf("%+v", a)
	}
}

// /v1/models lists the deployments with a routable replica, in OpenAI's
// list shape.
func TestModelsListsRoutableDeployments(t *testing.T) {
	u := newUpstream(t, chatOK)
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat", Model: "org/chat"})
	w.deploy(placement.Deployment{Name: "idle"})
	w.node("n1", gossip.StateAlive)
	w.hold(cp{dep: "chat", node: "n1", url: u.URL})
	h := newHarness(t, Config{}, w.snapshot())
	a := h.do(context.Background(), http.MethodGet, "/v1/models", "")
	var list struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}
	if err := json.Unmarshal([]byte(a.body), &list); err != nil || list.Object != "list" || len(list.Data) != 1 {
		t.Fatalf("%s: %v", a.body, err)
	}
	if c := list.Data[0]; c.ID != "chat" || c.Object != "model" || c.Root != "org/chat" || c.Created != t0.Unix() || c.OwnedBy != "llmgw" {
		t.Fatalf("card %+v", c)
	}
}

// Over the in-flight bound, requests get 429 with Retry-After.
func TestMaxInflight(t *testing.T) {
	hold := make(chan struct{})
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { <-hold; chatOK(w, r) })
	h := newHarness(t, Config{MaxInflight: 2}, oneDeployment(u.URL).snapshot())
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { h.post("/v1/chat/completions", chatBody("chat", false)) })
	}
	testwait.Until(t, 5*time.Second, "two requests in flight", func() (bool, string) { return u.hits.Load() == 2, "" })
	a := h.post("/v1/chat/completions", chatBody("chat", false))
	if a.status != 429 || a.header.Get("Retry-After") != "1" || a.apiError(t).Error.Code != "gateway_overloaded" {
		t.Fatalf("%+v", a)
	}
	close(hold)
	wg.Wait()
	if a := h.post("/v1/chat/completions", chatBody("chat", false)); a.status != 200 {
		t.Fatalf("after: %+v", a)
	}
}

// Shutdown drains: /health says 503 at once, new requests are still
// served (not refused), with Connection: close, and it waits for those in
// flight. A context that ends first cuts what is still in flight with an
// answer, and is reported.
func TestShutdownDrains(t *testing.T) {
	hold := make(chan struct{})
	var release sync.Once
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(bodyText(r), "slow") {
			<-hold
		}
		chatOK(w, r)
	})
	h := newHarness(t, Config{}, oneDeployment(u.URL).snapshot())
	// Before the harness's cleanup, which waits for the request held.
	t.Cleanup(func() { release.Do(func() { close(hold) }) })
	inflight := make(chan answer, 1)
	go func() { inflight <- h.post("/v1/chat/completions", slowChat()) }()
	testwait.Until(t, 5*time.Second, "request in flight", func() (bool, string) { return u.hits.Load() == 1, "" })
	stopped := make(chan error, 1)
	go func() { stopped <- h.gw.Shutdown(context.Background()) }()
	testwait.Until(t, 5*time.Second, "draining", func() (bool, string) {
		a := h.do(context.Background(), http.MethodGet, "/health", "")
		return a.status == 503 && a.apiError(t).Error.Code == "node_stopping" && a.header.Get("Retry-After") == "1", a.body
	})
	if a := h.post("/v1/chat/completions", chatBody("chat", false)); a.status != 200 || !a.close {
		t.Fatalf("a request to a draining gateway: %d (close %v) %s, want it served with Connection: close", a.status, a.close, a.body)
	}
	select {
	case err := <-stopped:
		t.Fatalf("Shutdown returned (%v) with a request in flight", err)
	default:
	}
	release.Do(func() { close(hold) })
	if a := <-inflight; a.status != 200 || !a.close {
		t.Fatalf("in-flight request: %d (close %v), want 200 with Connection: close (its answer began after the drain)", a.status, a.close)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}

	// A context that ends first is reported, and the request still in
	// flight is answered 503 with Retry-After, not left without an answer.
	hold2 := make(chan struct{})
	defer close(hold2)
	u2 := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hold2:
		case <-r.Context().Done():
		}
	})
	h2 := newHarness(t, Config{}, oneDeployment(u2.URL).snapshot())
	done := make(chan answer, 1)
	go func() { done <- h2.post("/v1/chat/completions", chatBody("chat", false)) }()
	testwait.Until(t, 5*time.Second, "request in flight", func() (bool, string) { return u2.hits.Load() == 1, "" })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := h2.gw.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want the deadline", err)
	}
	if a := <-done; a.status != 503 || a.header.Get("Retry-After") != "1" || a.apiError(t).Error.Code != "node_stopping" {
		t.Fatalf("request cut at the drain's end: %+v", a)
	}
}

// slowChat is a chat the upstreams of the drain tests hold until told.
func slowChat() string {
	return `{"model":"chat","messages":[{"role":"user","content":"slow"}]}`
}

// bodyText is the request body's text, restored for the next reader.
func bodyText(r *http.Request) string {
	b, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(b))
	return string(b)
}

// One access-log line per request, with model, replica, node, status and
// sizes, and never the prompt.
func TestAccessLog(t *testing.T) {
	u := newUpstream(t, chatOK)
	var log testlog.Buffer
	h := newHarness(t, Config{AccessLog: &log}, oneDeployment(u.URL).snapshot())
	h.post("/v1/chat/completions", `{"model":"chat","messages":[{"role":"user","content":"the secret prompt"}]}`)
	h.post("/v1/chat/completions", chatBody("nope", false))
	h.gw.Shutdown(context.Background())
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("log:\n%s", log.String())
	}
	for _, want := range []string{"model=chat", "replica=chat-0", "node=n1", "status=200", "bytes_in=", "bytes_out=", "duration="} {
		if !strings.Contains(lines[0], want) {
			t.Fatalf("line %q lacks %q", lines[0], want)
		}
	}
	if !strings.Contains(lines[1], "model=(unknown) status=404") || strings.Contains(log.String(), "secret") {
		t.Fatalf("log:\n%s", log.String())
	}
}

// A writer that blocks costs log lines, counted, never a request.
func TestAccessLogNeverBlocks(t *testing.T) {
	u := newUpstream(t, chatOK)
	pw := &blockingWriter{release: make(chan struct{})}
	h := newHarness(t, Config{AccessLog: pw, AccessLogQueue: 2}, oneDeployment(u.URL).snapshot())
	for range 10 {
		if a := h.post("/v1/chat/completions", chatBody("chat", false)); a.status != 200 {
			t.Fatalf("%+v", a)
		}
	}
	if n := value(t, h.gw.m.logDropped); n < 7 {
		t.Fatalf("dropped %v lines, want at least 7 of 10 (one being written, two queued)", n)
	}
	close(pw.release)
}

type blockingWriter struct{ release chan struct{} }

func (b *blockingWriter) Write(p []byte) (int, error) { <-b.release; return len(p), nil }

// The gateway registers as one collector: every series, in-flight by
// replica included, and no duplicate descriptions.
func TestMetricsRegister(t *testing.T) {
	hold := make(chan struct{})
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { <-hold; chatOK(w, r) })
	h := newHarness(t, Config{}, oneDeployment(u.URL).snapshot())
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(h.gw)
	done := make(chan answer, 1)
	go func() { done <- h.post("/v1/chat/completions", chatBody("chat", false)) }()
	testwait.Until(t, 5*time.Second, "in flight", func() (bool, string) { return u.hits.Load() == 1, "" })
	get := func(name string) float64 {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == name {
				var sum float64
				for _, m := range f.GetMetric() {
					sum += m.GetGauge().GetValue() + m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
				}
				return sum
			}
		}
		return -1
	}
	if n := get("llmgw_gateway_requests_in_flight"); n != 1 {
		t.Fatalf("in flight %v", n)
	}
	close(hold)
	<-done
	if n := get("llmgw_gateway_requests_total"); n != 1 {
		t.Fatalf("requests %v", n)
	}
	for _, name := range []string{"llmgw_gateway_request_duration_seconds", "llmgw_gateway_time_to_first_byte_seconds"} {
		if n := get(name); n != 1 {
			t.Fatalf("%s: %v observations", name, n)
		}
	}
}

// Stats reports each deployment's recent rate and time-to-first-byte
// quantiles.
func TestStats(t *testing.T) {
	s := newStats(10 * time.Second)
	for i := range 100 {
		s.record("chat", t0.Add(time.Duration(i)*50*time.Millisecond), time.Duration(i+1)*time.Millisecond, 200)
	}
	s.record("chat", t0, 0, 502)
	s.record("old", t0.Add(-time.Minute), time.Millisecond, 200)
	got := s.snapshot(t0.Add(5 * time.Second))
	if len(got) != 2 || got[0].Model != "chat" || got[1].Model != "old" {
		t.Fatalf("%+v", got)
	}
	c := got[0]
	if c.Requests != 101 || c.Errors != 1 || c.TTFBP50 != 50*time.Millisecond || c.TTFBP99 != 99*time.Millisecond {
		t.Fatalf("%+v", c)
	}
	if c.Rate < 10 || c.Rate > 10.2 {
		t.Fatalf("rate %v, want 101 per 10 s", c.Rate)
	}
	if got[1].Requests != 0 {
		t.Fatalf("old requests counted: %+v", got[1])
	}
}

// fakeEngineGateway runs the real fake engine (deployment "chat", model
// org/fake, a token every delay) behind a gateway on the real clock.
func fakeEngineGateway(t *testing.T, delay time.Duration) *harness {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() {
		ran <- fakeengine.Run(ctx, fakeengine.Config{Model: "chat", Listener: ln, TokenDelay: delay})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Error(err)
		}
	})
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat", Engine: "fake", Model: "org/fake"})
	w.node("n1", gossip.StateAlive)
	w.hold(cp{dep: "chat", node: "n1", url: "http://" + ln.Addr().String()})
	h := newHarness(t, Config{Clock: clock.Real()}, w.snapshot())
	// The real clock: leases were judged at t0, long ago; rebuild at now.
	h.gw.Update(w.snapshotAt(time.Now()))
	return h
}

// Through the real fake engine: a streamed chat completion with usage, and
// a plain one, with the engine's key passed upstream.
func TestThroughTheFakeEngine(t *testing.T) {
	h := fakeEngineGateway(t, time.Millisecond)
	a := h.post("/v1/chat/completions", `{"model":"org/fake","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"one two three"}]}`)
	if a.status != 200 || !strings.HasSuffix(a.body, "data: [DONE]\n\n") || !strings.Contains(a.body, `"usage":{"prompt_tokens":5`) { // "user\none two three\n", 4 characters a token
		t.Fatalf("%d %s", a.status, a.body)
	}
	a = h.post("/v1/completions", `{"model":"chat","prompt":"hello"}`)
	if a.status != 200 || !strings.Contains(a.body, `"text":"fake chat reply: hello"`) {
		t.Fatalf("%d %s", a.status, a.body)
	}
	// The gateway scraped the engine's load meanwhile.
	testwait.Until(t, 5*time.Second, "a load scrape", func() (bool, string) {
		r := &h.gw.routing.Load().routes["chat"][0].rep.load
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.haveValue, fmt.Sprint(r.scrapedAt)
	})
	if st := h.gw.Stats(); len(st) != 1 || st[0].Requests != 2 || st[0].TTFBP50 <= 0 {
		t.Fatalf("stats %+v", st)
	}
}
