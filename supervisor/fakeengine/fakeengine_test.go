package fakeengine

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/llmgw/llmgw/internal/testwait"
)

// testClock is a settable clock for the startup delay.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func newTestServer(t *testing.T, cfg Config) (*httptest.Server, *Server) {
	t.Helper()
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return ts, s
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, url, body string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// scrape parses /metrics the way llmgw's engine probe does.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/metrics", nil)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

func value(t *testing.T, fams map[string]*dto.MetricFamily, name, modelName string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("metric %s missing; have %v", name, keys(fams))
	}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == LabelModel && l.GetValue() == modelName {
				switch {
				case m.Counter != nil:
					return m.GetCounter().GetValue()
				case m.Gauge != nil:
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("metric %s has no sample with %s=%q", name, LabelModel, modelName)
	return 0
}

func keys(m map[string]*dto.MetricFamily) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestHealthFollowsStartupDelay(t *testing.T) {
	c := &testClock{t: time.Unix(1000, 0)}
	ts, _ := newTestServer(t, Config{Model: "m", StartupDelay: 30 * time.Second, Now: c.Now})
	if code, _ := get(t, ts.URL+"/health"); code != 503 {
		t.Fatalf("health during startup = %d, want 503", code)
	}
	if code, _ := get(t, ts.URL+"/v1/models"); code != 503 {
		t.Fatalf("models during startup = %d, want 503", code)
	}
	c.Advance(30 * time.Second)
	if code, _ := get(t, ts.URL+"/health"); code != 200 {
		t.Fatalf("health after startup = %d, want 200", code)
	}
}

func TestFailHealth(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "m", FailHealth: true})
	if code, _ := get(t, ts.URL+"/health"); code != 503 {
		t.Fatalf("health = %d, want 503", code)
	}
	// The engine still serves; only its health check lies.
	if code, _ := get(t, ts.URL+"/v1/models"); code != 200 {
		t.Fatalf("models = %d, want 200", code)
	}
}

func TestModelsListsServedName(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "llama-8b"})
	code, body := get(t, ts.URL+"/v1/models")
	if code != 200 {
		t.Fatalf("code %d", code)
	}
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	if list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != "llama-8b" || list.Data[0].Object != "model" {
		t.Fatalf("models = %s", body)
	}
}

func TestChatNonStreaming(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "m1"})
	code, _, body := post(t, ts.URL+"/v1/chat/completions",
		`{"model":"m1","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello there"}]}`)
	if code != 200 {
		t.Fatalf("code %d: %s", code, body)
	}
	var resp struct {
		Object  string `json:"object"`
		Model   string `json:"model"`
		Choices []struct {
			Message      struct{ Role, Content string } `json:"message"`
			FinishReason string                         `json:"finish_reason"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatal(err)
	}
	want := "fake m1 reply: hello there"
	if resp.Object != "chat.completion" || resp.Model != "m1" || len(resp.Choices) != 1 ||
		resp.Choices[0].Message.Content != want || resp.Choices[0].Message.Role != "assistant" ||
		resp.Choices[0].FinishReason != "stop" {
		t.Fatalf("response = %s", body)
	}
	// "system\nbe brief\nuser\nhello there\n" is 33 characters: 9 tokens.
	if resp.Usage != (usage{PromptTokens: 9, CompletionTokens: 5, TotalTokens: 14}) {
		t.Fatalf("usage = %+v", resp.Usage)
	}
}

// readSSE returns the data payloads of an SSE body, checking the framing.
func readSSE(t *testing.T, body string) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("line without data: prefix: %q", line)
		}
		out = append(out, data)
	}
	if len(out) == 0 || out[len(out)-1] != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %q", body)
	}
	return out
}

func TestChatStreaming(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "m1"})
	code, hdr, body := post(t, ts.URL+"/v1/chat/completions",
		`{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":[{"type":"text","text":"a b c"}]}]}`)
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("code %d, content type %q", code, hdr.Get("Content-Type"))
	}
	events := readSSE(t, body)
	var text strings.Builder
	var gotUsage *usage
	var finish string
	for _, e := range events[:len(events)-1] {
		var c struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta        struct{ Content string } `json:"delta"`
				FinishReason *string                  `json:"finish_reason"`
			} `json:"choices"`
			Usage *usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatalf("chunk %q: %v", e, err)
		}
		if c.Object != "chat.completion.chunk" {
			t.Fatalf("object = %q", c.Object)
		}
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
		if c.Usage != nil {
			gotUsage = c.Usage
		}
	}
	if text.String() != "fake m1 reply: a b c" || finish != "stop" {
		t.Fatalf("text %q finish %q", text.String(), finish)
	}
	// "user\na b c\n" is 11 characters: 3 tokens.
	if gotUsage == nil || *gotUsage != (usage{PromptTokens: 3, CompletionTokens: 6, TotalTokens: 9}) {
		t.Fatalf("usage = %+v", gotUsage)
	}
}

func TestCompletions(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "m1"})
	code, _, body := post(t, ts.URL+"/v1/completions", `{"model":"m1","prompt":"one two three","max_tokens":2}`)
	if code != 200 {
		t.Fatalf("code %d: %s", code, body)
	}
	var resp struct {
		Object  string `json:"object"`
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Object != "text_completion" || resp.Choices[0].Text != "fake m1" || resp.Choices[0].FinishReason != "length" {
		t.Fatalf("response = %s", body)
	}

	code, _, body = post(t, ts.URL+"/v1/completions", `{"model":"m1","prompt":[1,2,3],"stream":true}`)
	if code != 200 {
		t.Fatalf("stream code %d", code)
	}
	events := readSSE(t, body)
	var text strings.Builder
	for _, e := range events[:len(events)-1] {
		var c struct {
			Choices []struct{ Text string } `json:"choices"`
		}
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatal(err)
		}
		text.WriteString(c.Choices[0].Text)
	}
	if text.String() != "fake m1 reply:" {
		t.Fatalf("streamed text %q", text.String())
	}
}

// vllmError is vLLM's error body (since v0.10.1).
type vllmError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

func TestBadRequests(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "m1"})
	for _, tc := range []struct{ path, body, want string }{
		{"/v1/chat/completions", `{"model":`, "invalid JSON"},
		{"/v1/chat/completions", `{"model":"m1","messages":[]}`, "at least one message"},
		{"/v1/chat/completions", `{"model":"m1","stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}`, "only be defined when `stream=True`"},
		{"/v1/completions", `{"model":"m1"}`, "prompt"},
		{"/v1/completions", `not json`, "invalid JSON"},
		{"/v1/completions", `{"model":"m1","prompt":"x","stream_options":{"include_usage":true}}`, "only be defined when `stream=True`"},
		{"/v1/embeddings", `{"model":"m1"}`, "input"},
		{"/v1/embeddings", `{"model":"m1","input":[]}`, "input"},
		{"/v1/embeddings", `{"model":"m1","input":[[1],[]]}`, "empty list of token ids"},
		{"/v1/embeddings", `{"model":"m1","input":"x","encoding_format":"int8"}`, "encoding_format"},
		{"/v1/embeddings", `{"model":"m1","input":"x","dimensions":8}`, "matryoshka"},
	} {
		code, _, body := post(t, ts.URL+tc.path, tc.body)
		var e vllmError
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			t.Fatalf("%s %s: error body %q: %v", tc.path, tc.body, body, err)
		}
		if code != 400 || e.Error.Code != 400 || e.Error.Type != "BadRequestError" || !strings.Contains(e.Error.Message, tc.want) {
			t.Errorf("%s %s: code %d body %s, want 400 mentioning %q", tc.path, tc.body, code, body, tc.want)
		}
	}
	if code, _ := get(t, ts.URL+"/v1/chat/completions"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET chat = %d", code)
	}
}

func TestMetricsCountTokens(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "m1"})
	fams := scrape(t, ts.URL)
	if v := value(t, fams, MetricPromptTokens, "m1"); v != 0 {
		t.Fatalf("prompt tokens before = %v", v)
	}
	post(t, ts.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"a b"}]}`)        // 3 + 5
	post(t, ts.URL+"/v1/completions", `{"model":"m1","prompt":"x y z","stream":true}`)                           // 2 + 6
	post(t, ts.URL+"/v1/chat/completions", `{"model":"wrong","messages":[{"role":"user","content":"a b c d"}]}`) // not served
	fams = scrape(t, ts.URL)
	if v := value(t, fams, MetricPromptTokens, "m1"); v != 5 {
		t.Errorf("prompt tokens = %v, want 5", v)
	}
	if v := value(t, fams, MetricGenerationTokens, "m1"); v != 11 {
		t.Errorf("generation tokens = %v, want 11", v)
	}
	for _, name := range []string{MetricRunning, MetricWaiting, MetricKVCache} {
		if v := value(t, fams, name, "m1"); v != 0 {
			t.Errorf("%s = %v at rest", name, v)
		}
	}
	if _, ok := fams[MetricKVCacheLegacy]; ok {
		t.Errorf("legacy KV metric exported without LegacyKVMetric")
	}
	if f := fams[MetricPromptTokens]; f.GetType() != dto.MetricType_COUNTER {
		t.Errorf("%s type %v", MetricPromptTokens, f.GetType())
	}
}

func TestLegacyKVMetric(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "m1", LegacyKVMetric: true})
	fams := scrape(t, ts.URL)
	value(t, fams, MetricKVCacheLegacy, "m1")
	if _, ok := fams[MetricKVCache]; ok {
		t.Errorf("new KV metric exported with LegacyKVMetric")
	}
}

// TestLoadShowsInGauges holds one request in flight with MaxRunning 1 and
// checks that a second one waits.
func TestLoadShowsInGauges(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "m1", MaxRunning: 1, TokenDelay: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions", strings.NewReader(`{"model":"m1","prompt":"x"}`))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	gauges := func() (r, w, kv float64) {
		fams := scrape(t, ts.URL)
		return value(t, fams, MetricRunning, "m1"), value(t, fams, MetricWaiting, "m1"), value(t, fams, MetricKVCache, "m1")
	}
	// One block of 16 tokens of the 8192 is held.
	testwait.Until(t, 10*time.Second, "one running, one waiting, one block held", func() (bool, string) {
		r, w, kv := gauges()
		return r == 1 && w == 1 && kv == 1.0/8192, fmt.Sprintf("running %v waiting %v kv %v, want 1 1 1/8192", r, w, kv)
	})
	cancel()
	wg.Wait()
	testwait.Until(t, 10*time.Second, "gauges back to 0 after the clients left", func() (bool, string) {
		r, w, kv := gauges()
		return r == 0 && w == 0 && kv == 0, fmt.Sprintf("running %v waiting %v kv %v", r, w, kv)
	})
}

func TestRunServesAndStops(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, Config{Model: "m", Listener: ln}) }()
	if code, _ := get(t, "http://"+ln.Addr().String()+"/health"); code != 200 {
		t.Fatalf("health = %d", code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestRunCrashes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	err = Run(context.Background(), Config{Model: "m", Listener: ln, CrashAfter: 20 * time.Millisecond, ExitCode: 42})
	if !errors.Is(err, ErrCrash) || ExitCode(err) != 42 {
		t.Fatalf("Run = %v (exit %d), want ErrCrash with 42", err, ExitCode(err))
	}
	if ExitCode(nil) != 0 || ExitCode(errors.New("x")) != 1 {
		t.Fatal("ExitCode mapping")
	}
}

func TestRunRejectsMissingModel(t *testing.T) {
	if err := Run(context.Background(), Config{Port: 0}); err == nil {
		t.Fatal("Run without a model succeeded")
	}
}

// An unknown model is a 404 in vLLM's error shape, on every endpoint that
// names one: a gateway tells a stale route from a bad request by it.
func TestUnknownModelIs404(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "m1"})
	for path, body := range map[string]string{
		"/v1/chat/completions": `{"model":"other","messages":[{"role":"user","content":"x"}]}`,
		"/v1/completions":      `{"model":"other","prompt":"x","stream":true}`,
		"/v1/embeddings":       `{"model":"other","input":"x"}`,
	} {
		code, _, got := post(t, ts.URL+path, body)
		var e vllmError
		if err := json.Unmarshal([]byte(got), &e); err != nil {
			t.Fatalf("%s: error body %q: %v", path, got, err)
		}
		if code != 404 || e.Error.Code != 404 || e.Error.Type != "NotFoundError" || e.Error.Param == nil || *e.Error.Param != "model" ||
			e.Error.Message != "The model `other` does not exist." {
			t.Errorf("%s: code %d body %s, want vLLM's 404", path, code, got)
		}
	}
}

func do(t *testing.T, method, url, key, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// With an API key, every /v1/* path (an unknown one too) answers 401
// without it, with vLLM's body, and serves with it; /health and /metrics
// stay open, as vLLM's do, so probes and scrapers need no key.
func TestAPIKeyGuardsV1Only(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "m1", APIKey: "k-123"})
	chat := `{"model":"m1","messages":[{"role":"user","content":"x"}]}`
	for _, tc := range []struct {
		method, path, auth, body string
		want                     int
	}{
		{"GET", "/v1/models", "", "", 401},
		{"GET", "/v1/models", "Bearer wrong", "", 401},
		{"GET", "/v1/models", "Bearer k-123x", "", 401},
		{"GET", "/v1/models", "Basic k-123", "", 401},
		{"GET", "/v1/models", "k-123", "", 401},
		{"GET", "/v1/models", "Bearer k-123", "", 200},
		{"GET", "/v1/models", "bearer k-123", "", 200}, // the scheme is case-insensitive
		{"POST", "/v1/chat/completions", "", chat, 401},
		{"POST", "/v1/chat/completions", "Bearer k-123", chat, 200},
		{"POST", "/v1/completions", "", `{"model":"m1","prompt":"x"}`, 401},
		{"POST", "/v1/embeddings", "", `{"model":"m1","input":"x"}`, 401},
		{"POST", "/v1/embeddings", "Bearer k-123", `{"model":"m1","input":"x"}`, 200},
		{"GET", "/v1/no-such-path", "", "", 401},
		{"GET", "/health", "", "", 200},
		{"GET", "/metrics", "", "", 200},
	} {
		code, body := do(t, tc.method, ts.URL+tc.path, tc.auth, tc.body)
		if code != tc.want {
			t.Errorf("%s %s with %q = %d %s, want %d", tc.method, tc.path, tc.auth, code, body, tc.want)
		}
		if code == 401 && strings.TrimSpace(body) != `{"error":"Unauthorized"}` {
			t.Errorf("%s %s: 401 body %s, want vLLM's", tc.method, tc.path, body)
		}
	}
	// Without a key configured, nothing is guarded.
	open, _ := newTestServer(t, Config{Model: "m1"})
	if code, body := do(t, "GET", open.URL+"/v1/models", "", ""); code != 200 {
		t.Errorf("keyless engine: /v1/models = %d %s", code, body)
	}
}

// chunk is one streamed event, as OpenAI's chunk format has it.
type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int               `json:"index"`
		Delta        map[string]string `json:"delta"`
		Text         *string           `json:"text"`
		FinishReason *string           `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

func chunks(t *testing.T, body string) []chunk {
	t.Helper()
	events := readSSE(t, body) // checks the framing and the final [DONE]
	out := make([]chunk, 0, len(events)-1)
	for _, e := range events[:len(events)-1] {
		var c chunk
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatalf("chunk %q: %v", e, err)
		}
		out = append(out, c)
	}
	return out
}

// Streams follow OpenAI's chunk format: one id, object, created and model
// across the stream; a chat opens with the assistant role; the finish
// reason comes once, last among the choices; usage comes only when
// stream_options.include_usage asks for it, alone in a last chunk with no
// choices, right before data: [DONE].
func TestStreamingChunkFormatAndUsage(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "m1"})
	for _, tc := range []struct {
		name, path, body, object string
		chat, withUsage          bool
		// "user\na b\n" is 3 tokens, "a b" 1.
		promptTokens int
	}{
		{"chat", "/v1/chat/completions", `{"model":"m1","stream":true,"messages":[{"role":"user","content":"a b"}]}`, "chat.completion.chunk", true, false, 3},
		{"chat with usage", "/v1/chat/completions", `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"a b"}]}`, "chat.completion.chunk", true, true, 3},
		{"completion", "/v1/completions", `{"model":"m1","stream":true,"prompt":"a b"}`, "text_completion", false, false, 1},
		{"completion with usage", "/v1/completions", `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"prompt":"a b"}`, "text_completion", false, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, hdr, body := post(t, ts.URL+tc.path, tc.body)
			if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("code %d, content type %q", code, hdr.Get("Content-Type"))
			}
			cs := chunks(t, body)
			first := cs[0]
			if first.ID == "" || first.Created == 0 || first.Model != "m1" || first.Object != tc.object {
				t.Fatalf("first chunk %+v", first)
			}
			if tc.chat && (len(first.Choices) != 1 || first.Choices[0].Delta["role"] != "assistant") {
				t.Errorf("chat stream does not open with the assistant role: %+v", first)
			}
			finishes, usages := 0, 0
			for i, c := range cs {
				if c.ID != first.ID || c.Object != first.Object || c.Created != first.Created || c.Model != first.Model {
					t.Errorf("chunk %d %+v differs from the first in id, object, created or model", i, c)
				}
				for _, ch := range c.Choices {
					if ch.FinishReason != nil {
						finishes++
						if *ch.FinishReason != "stop" {
							t.Errorf("finish reason %q", *ch.FinishReason)
						}
					}
				}
				if c.Usage != nil {
					usages++
					if i != len(cs)-1 || len(c.Choices) != 0 {
						t.Errorf("usage in chunk %d of %d with %d choices; want it alone in the last", i, len(cs), len(c.Choices))
					}
					if *c.Usage != (usage{PromptTokens: tc.promptTokens, CompletionTokens: 5, TotalTokens: tc.promptTokens + 5}) {
						t.Errorf("usage %+v", *c.Usage)
					}
				}
			}
			if finishes != 1 {
				t.Errorf("%d finish reasons, want 1", finishes)
			}
			if want := map[bool]int{true: 1, false: 0}[tc.withUsage]; usages != want {
				t.Errorf("%d usage chunks, want %d", usages, want)
			}
		})
	}
}

// A non-streamed answer carries its usage.
func TestCompletionUsage(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "m1"})
	code, _, body := post(t, ts.URL+"/v1/completions", `{"model":"m1","prompt":"one two three"}`)
	var resp struct {
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil || code != 200 {
		t.Fatalf("code %d body %s: %v", code, body, err)
	}
	// 13 characters: 4 tokens.
	if resp.Usage != (usage{PromptTokens: 4, CompletionTokens: 6, TotalTokens: 10}) {
		t.Fatalf("usage %+v", resp.Usage)
	}
}

type embeddingResponse struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Model  string `json:"model"`
	Data   []struct {
		Index     int             `json:"index"`
		Object    string          `json:"object"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Usage usage `json:"usage"`
}

func embeddings(t *testing.T, url, body string) embeddingResponse {
	t.Helper()
	code, _, got := post(t, url+"/v1/embeddings", body)
	if code != 200 {
		t.Fatalf("embeddings %s: %d %s", body, code, got)
	}
	var r embeddingResponse
	if err := json.Unmarshal([]byte(got), &r); err != nil {
		t.Fatalf("embeddings body %s: %v", got, err)
	}
	return r
}

func floats(t *testing.T, raw json.RawMessage) []float32 {
	t.Helper()
	var v []float32
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("embedding %s: %v", raw, err)
	}
	return v
}

// Embeddings come in vLLM's shape, one per input in order, of unit length,
// the same from every engine of a model and different across inputs and
// models; base64 is the same vector as little-endian float32.
func TestEmbeddings(t *testing.T) {
	a, _ := newTestServer(t, Config{Model: "m1"})
	b, _ := newTestServer(t, Config{Model: "m1"})
	other, _ := newTestServer(t, Config{Model: "m2"})

	r := embeddings(t, a.URL, `{"model":"m1","input":["hello world","bye"]}`)
	if r.Object != "list" || r.Model != "m1" || !strings.HasPrefix(r.ID, "embd-") || len(r.Data) != 2 {
		t.Fatalf("response %+v", r)
	}
	// "hello world" is 3 tokens, "bye" 1.
	if r.Usage != (usage{PromptTokens: 4, TotalTokens: 4}) {
		t.Errorf("usage %+v, want 4 prompt tokens and no completion", r.Usage)
	}
	var vs [][]float32
	for i, d := range r.Data {
		if d.Index != i || d.Object != "embedding" {
			t.Errorf("data[%d] = index %d object %q", i, d.Index, d.Object)
		}
		v := floats(t, d.Embedding)
		if len(v) != EmbeddingDims {
			t.Fatalf("data[%d] has %d dimensions, want %d", i, len(v), EmbeddingDims)
		}
		var norm float64
		for _, x := range v {
			norm += float64(x) * float64(x)
		}
		if math.Abs(norm-1) > 1e-5 {
			t.Errorf("data[%d] has squared norm %v, want 1", i, norm)
		}
		vs = append(vs, v)
	}
	if slices.Equal(vs[0], vs[1]) {
		t.Error("two inputs embed alike")
	}
	same := floats(t, embeddings(t, b.URL, `{"model":"m1","input":"hello world"}`).Data[0].Embedding)
	if !slices.Equal(same, vs[0]) {
		t.Error("another engine of the same model embeds the same input differently")
	}
	if diff := floats(t, embeddings(t, other.URL, `{"model":"m2","input":"hello world"}`).Data[0].Embedding); slices.Equal(diff, vs[0]) {
		t.Error("another model embeds alike")
	}

	var s string
	if err := json.Unmarshal(embeddings(t, a.URL, `{"model":"m1","input":"hello world","encoding_format":"base64"}`).Data[0].Embedding, &s); err != nil {
		t.Fatalf("base64 embedding is not a string: %v", err)
	}
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(raw) != 4*EmbeddingDims {
		t.Fatalf("base64 embedding: %d bytes, %v", len(raw), err)
	}
	for i := range vs[0] {
		if x := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])); x != vs[0][i] {
			t.Fatalf("base64[%d] = %v, float = %v", i, x, vs[0][i])
		}
	}

	ids := embeddings(t, a.URL, `{"model":"m1","input":[[1,2,3],[4]]}`)
	if len(ids.Data) != 2 || ids.Usage.PromptTokens != 4 {
		t.Errorf("token-id input: %d vectors, %d prompt tokens; want 2 and 4", len(ids.Data), ids.Usage.PromptTokens)
	}
	if v := value(t, scrape(t, a.URL), MetricPromptTokens, "m1"); v != 4+3+4 {
		t.Errorf("prompt tokens counted %v, want 11 (4 + 3 + 4 on this engine)", v)
	}
}
