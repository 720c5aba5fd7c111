package fakeengine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/llmgw/llmgw/internal/freeport"
	"github.com/llmgw/llmgw/internal/testwait"
)

// counterValue reads a counter without a scrape (a hung engine answers
// none).
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// running is the scheduler's batch now.
func (s *Server) runningNow() (running, waiting int) {
	r, w, _ := s.sched.load()
	return r, w
}

// vLLM binds its port only once its engine core is up: until the startup
// delay (held by Sleep here) has passed, a connection is refused, whether
// the fake was given a port or a bound listener.
func TestVLLMRefusesConnectionsWhileLoading(t *testing.T) {
	for _, viaListener := range []bool{false, true} {
		t.Run(fmt.Sprintf("listener=%v", viaListener), func(t *testing.T) {
			asked := make(chan struct{}, 1)
			release := make(chan struct{})
			cfg := Config{Model: "m", Personality: PersonalityVLLM, StartupDelay: time.Hour,
				Sleep: func(ctx context.Context, d time.Duration) bool {
					if d != time.Hour {
						return true
					}
					asked <- struct{}{}
					select {
					case <-release:
						return true
					case <-ctx.Done():
						return false
					}
				}}
			var addr string
			if viaListener {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				cfg.Listener, addr = ln, ln.Addr().String()
			} else {
				port, err := freeport.Loopback()
				if err != nil {
					t.Fatal(err)
				}
				cfg.Host, cfg.Port = "127.0.0.1", port
				addr = net.JoinHostPort(cfg.Host, fmt.Sprint(port))
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run after cancel = %v", err)
				}
			}()
			select {
			case <-asked:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not wait out the startup delay")
			}
			if c, err := net.Dial("tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) {
				if c != nil {
					c.Close()
				}
				t.Fatalf("dial while loading: %v, want connection refused", err)
			}
			close(release)
			testwait.Until(t, 10*time.Second, "the engine serves once loaded", func() (bool, string) {
				resp, err := http.Get("http://" + addr + "/health")
				if err != nil {
					return false, err.Error()
				}
				resp.Body.Close()
				return resp.StatusCode == 200, resp.Status
			})
		})
	}
}

// Under vLLM every request, /health, /v1/models and /metrics included,
// first waits HealthDelayPerRunning for each request running when it
// arrives: with 6 running and the default 0.5 s, 3 s, as asked of Sleep.
func TestVLLMSlowsEveryRequestByTheRunningOnes(t *testing.T) {
	for _, tc := range []struct {
		perRunning, want time.Duration
	}{{0, 3 * time.Second}, {100 * time.Millisecond, 600 * time.Millisecond}} {
		t.Run(tc.perRunning.String(), func(t *testing.T) {
			var rec recorder
			ts, srv := newTestServer(t, Config{Model: "m", Personality: PersonalityVLLM, TokenDelay: time.Hour,
				HealthDelayPerRunning: tc.perRunning,
				Sleep: func(ctx context.Context, d time.Duration) bool {
					if d == time.Hour {
						// The requests run until their clients leave.
						<-ctx.Done()
						return false
					}
					return rec.Sleep(ctx, d)
				}})
			ctx, cancel := context.WithCancel(context.Background())
			var a async
			for range 6 {
				a.post(ctx, ts.URL+"/v1/completions", `{"model":"m","prompt":"x","max_tokens":3}`)
			}
			testwait.Until(t, 10*time.Second, "6 running", func() (bool, string) {
				r, w := srv.runningNow()
				return r == 6, fmt.Sprintf("running %d waiting %d", r, w)
			})
			rec.take()
			for _, path := range []string{"/health", "/v1/models", "/metrics"} {
				if code, _ := get(t, ts.URL+path); code != 200 {
					t.Errorf("%s = %d", path, code)
				}
				if got := rec.take(); !slices.Equal(got, []time.Duration{tc.want}) {
					t.Errorf("%s with 6 running waited %v, want [%v]", path, got, tc.want)
				}
			}
			cancel()
			a.wait()
			testwait.Until(t, 10*time.Second, "none running", func() (bool, string) {
				r, _ := srv.runningNow()
				return r == 0, fmt.Sprintf("running %d", r)
			})
			rec.take()
			if code, _ := get(t, ts.URL+"/health"); code != 200 {
				t.Errorf("/health idle = %d", code)
			}
			if got := rec.take(); len(got) != 0 {
				t.Errorf("/health idle waited %v, want nothing", got)
			}
		})
	}
}

// SGLang answers 503 with no body on /health, and 503 on the model
// endpoints, while it loads; then 200.
func TestSGLangIs503WhileLoading(t *testing.T) {
	c := &testClock{t: time.Unix(1000, 0)}
	ts, _ := newTestServer(t, Config{Model: "m", Personality: PersonalitySGLang, StartupDelay: 30 * time.Second, Now: c.Now, SGLangCheapHealth: true})
	if code, body := get(t, ts.URL+"/health"); code != 503 || body != "" {
		t.Errorf("/health while loading = %d %q, want 503 with no body", code, body)
	}
	if code, _ := get(t, ts.URL+"/v1/models"); code != 503 {
		t.Errorf("/v1/models while loading = %d, want 503", code)
	}
	if code, _, _ := post(t, ts.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`); code != 503 {
		t.Errorf("chat while loading = %d, want 503", code)
	}
	c.Advance(30 * time.Second)
	if code, _ := get(t, ts.URL+"/health"); code != 200 {
		t.Errorf("/health once loaded = %d, want 200", code)
	}
}

// probeSleep is the Sleep of the SGLang health tests: it holds the
// hour-long prefill until release is closed, counts the one-second health
// polls and the largest queue seen in them, and lets a poll's second pass
// only once something has happened, as a real second passes while the
// engine works (within a deadline): with waitQueued, once a request
// queues; with waitOutput, once the scheduler produced output.
type probeSleep struct {
	srv        *Server
	release    chan struct{}
	waitQueued atomic.Bool
	waitOutput atomic.Bool
	baseline   atomic.Uint64
	polls      atomic.Int64
	maxQueued  atomic.Int64
}

func (p *probeSleep) Sleep(ctx context.Context, d time.Duration) bool {
	switch d {
	case time.Hour:
		select {
		case <-p.release:
			return true
		case <-ctx.Done():
			return false
		}
	case time.Second:
		p.polls.Add(1)
		deadline := time.Now().Add(10 * time.Second)
		for ctx.Err() == nil && time.Now().Before(deadline) {
			_, w := p.srv.runningNow()
			if int64(w) > p.maxQueued.Load() {
				p.maxQueued.Store(int64(w))
			}
			switch {
			case p.waitQueued.Load() && w == 0:
			case p.waitOutput.Load() && p.srv.outputs.Load() <= p.baseline.Load():
			default:
				return true
			}
			time.Sleep(time.Millisecond)
		}
		return ctx.Err() == nil
	}
	return true
}

// SGLang's /health is a one-token generation through the scheduler: while
// the batch is full and makes no output, the probe's generation queues and
// /health gives up after SGLANG_HEALTH_CHECK_TIMEOUT (one poll a second);
// once the scheduler turns, it answers 200 at the first poll. The probe
// moves no token counter.
func TestSGLangHealthWaitsForAGeneration(t *testing.T) {
	ps := &probeSleep{release: make(chan struct{})}
	ts, srv := newTestServer(t, Config{Model: "m", Personality: PersonalitySGLang, MaxRunning: 1,
		PrefillBase: time.Hour, SGLangHealthTimeout: 3 * time.Second, Sleep: ps.Sleep})
	ps.srv = srv
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var a async
	// It takes the one place and stays in its prefill: no output.
	a.post(ctx, ts.URL+"/v1/completions", `{"model":"m","prompt":"x","max_tokens":2}`)
	testwait.Until(t, 10*time.Second, "the request running", func() (bool, string) {
		r, w := srv.runningNow()
		return r == 1, fmt.Sprintf("running %d waiting %d", r, w)
	})
	ps.waitQueued.Store(true)
	if code, _ := get(t, ts.URL+"/health"); code != 503 {
		t.Errorf("/health with the scheduler stuck = %d, want 503", code)
	}
	if n := ps.polls.Load(); n != 3 {
		t.Errorf("/health polled %d times, want 3 (a 3 s timeout, one poll a second)", n)
	}
	if q := ps.maxQueued.Load(); q != 1 {
		t.Errorf("queue during the probe = %d, want 1: the probe's generation waits behind the running request", q)
	}
	testwait.Until(t, 10*time.Second, "the failed probe's generation left the queue", func() (bool, string) {
		r, w := srv.runningNow()
		return r == 1 && w == 0, fmt.Sprintf("running %d waiting %d", r, w)
	})

	ps.waitQueued.Store(false)
	close(ps.release)
	if codes := a.wait(); !slices.Equal(codes, []int{200}) {
		t.Fatalf("the request ended %v", codes)
	}
	gen := counterValue(t, srv.m.generation)
	ps.polls.Store(0)
	ps.baseline.Store(srv.outputs.Load())
	ps.waitOutput.Store(true)
	for _, path := range []string{"/health", "/health_generate"} {
		if code, _ := get(t, ts.URL+path); code != 200 {
			t.Errorf("%s with the scheduler free = %d, want 200", path, code)
		}
		if n := ps.polls.Swap(0); n != 1 {
			t.Errorf("%s polled %d times, want 1", path, n)
		}
		ps.baseline.Store(srv.outputs.Load())
	}
	if g := counterValue(t, srv.m.generation); g != gen {
		t.Errorf("generation tokens %v after the probes, want %v: a probe is no progress", g, gen)
	}
}

// With SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0, /health answers at
// once and generates nothing; /health_generate still generates.
func TestSGLangCheapHealth(t *testing.T) {
	ps := &probeSleep{release: make(chan struct{})}
	ts, srv := newTestServer(t, Config{Model: "m", Personality: PersonalitySGLang, SGLangCheapHealth: true, Sleep: ps.Sleep})
	ps.srv = srv
	ps.waitOutput.Store(true)
	if code, _ := get(t, ts.URL+"/health"); code != 200 {
		t.Errorf("/health = %d, want 200", code)
	}
	if n, out := ps.polls.Load(), srv.outputs.Load(); n != 0 || out != 0 {
		t.Errorf("the cheap /health polled %d times and generated %d tokens, want neither", n, out)
	}
	if code, _ := get(t, ts.URL+"/health_generate"); code != 200 {
		t.Errorf("/health_generate = %d, want 200", code)
	}
	if n, out := ps.polls.Load(), srv.outputs.Load(); n != 1 || out != 1 {
		t.Errorf("/health_generate polled %d times and generated %d tokens, want 1 and 1", n, out)
	}
}

// llama-server answers every path with its "Loading model" error while it
// loads, before it checks the key.
func TestLlamaCppIs503OnEveryPathWhileLoading(t *testing.T) {
	c := &testClock{t: time.Unix(1000, 0)}
	ts, _ := newTestServer(t, Config{Model: "m", Personality: PersonalityLlamaCpp, StartupDelay: time.Minute, Now: c.Now, APIKey: "k"})
	const want = `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`
	for _, path := range []string{"/health", "/v1/models", "/models", "/metrics", "/v1/completions", "/props", "/"} {
		code, body := get(t, ts.URL+path)
		if code != 503 || strings.TrimSpace(body) != want {
			t.Errorf("%s while loading = %d %s, want 503 %s", path, code, body, want)
		}
	}
	if code, _, body := post(t, ts.URL+"/v1/chat/completions", `{"model":"m","messages":[]}`); code != 503 || strings.TrimSpace(body) != want {
		t.Errorf("chat while loading = %d %s", code, body)
	}
	c.Advance(time.Minute)
	if code, body := get(t, ts.URL+"/health"); code != 200 || strings.TrimSpace(body) != `{"status":"ok"}` {
		t.Errorf("/health once loaded = %d %s, want 200 {\"status\":\"ok\"}", code, body)
	}
}

// Each personality exports its engine's metric names, and none of the
// others'.
func TestPersonalityMetricNames(t *testing.T) {
	all := []string{MetricRunning, MetricWaiting, MetricKVCache, MetricPromptTokens, MetricGenerationTokens, MetricPrefixCacheHits,
		MetricSGLangRunning, MetricSGLangWaiting, MetricSGLangTokenUsage, MetricSGLangPromptTokens, MetricSGLangGenerationTokens,
		MetricLlamaCppRunning, MetricLlamaCppWaiting, MetricLlamaCppPromptTokens, MetricLlamaCppGenerationTokens,
		"llamacpp:kv_cache_usage_ratio"}
	for _, tc := range []struct {
		p         Personality
		want      []string
		generated string
		label     bool
	}{
		{PersonalityNone, []string{MetricRunning, MetricWaiting, MetricKVCache, MetricPromptTokens, MetricGenerationTokens, MetricPrefixCacheHits}, MetricGenerationTokens, true},
		{PersonalityVLLM, []string{MetricRunning, MetricWaiting, MetricKVCache, MetricPromptTokens, MetricGenerationTokens, MetricPrefixCacheHits}, MetricGenerationTokens, true},
		{PersonalitySGLang, []string{MetricSGLangRunning, MetricSGLangWaiting, MetricSGLangTokenUsage, MetricSGLangPromptTokens, MetricSGLangGenerationTokens}, MetricSGLangGenerationTokens, true},
		{PersonalityLlamaCpp, []string{MetricLlamaCppRunning, MetricLlamaCppWaiting, MetricLlamaCppPromptTokens, MetricLlamaCppGenerationTokens}, MetricLlamaCppGenerationTokens, false},
	} {
		t.Run(string(tc.p), func(t *testing.T) {
			ts, _ := newTestServer(t, Config{Model: "m", Personality: tc.p})
			if u := completion(t, ts.URL, "hello there", 3); u.CompletionTokens != 3 {
				t.Fatalf("usage %+v", u)
			}
			fams := scrape(t, ts.URL)
			for _, name := range all {
				_, has := fams[name]
				if want := slices.Contains(tc.want, name); has != want {
					t.Errorf("%s exported: %v, want %v", name, has, want)
				}
			}
			f := fams[tc.generated]
			if f == nil || len(f.GetMetric()) != 1 || f.GetMetric()[0].GetCounter().GetValue() != 3 {
				t.Fatalf("%s = %v, want one sample of 3", tc.generated, f)
			}
			labels := f.GetMetric()[0].GetLabel()
			if tc.label && (len(labels) != 1 || labels[0].GetName() != LabelModel || labels[0].GetValue() != "m") {
				t.Errorf("%s labels %v, want model_name=m", tc.generated, labels)
			}
			if !tc.label && len(labels) != 0 {
				t.Errorf("%s labels %v, want none (llama.cpp labels nothing)", tc.generated, labels)
			}
		})
	}
	// Without their metrics flags SGLang serves no /metrics (404) and
	// llama.cpp refuses it (501).
	for p, want := range map[Personality]int{PersonalitySGLang: 404, PersonalityLlamaCpp: 501} {
		ts, _ := newTestServer(t, Config{Model: "m", Personality: p, NoMetrics: true})
		if code, body := get(t, ts.URL+"/metrics"); code != want {
			t.Errorf("%s /metrics without its flag = %d %s, want %d", p, code, body, want)
		}
	}
}

// Each personality's key guards what its engine's middleware guards, read
// as that middleware reads it, and refuses in its shape.
func TestPersonalityKeyRules(t *testing.T) {
	const (
		vllm401  = `{"error":"Unauthorized"}`
		llama401 = `{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}`
	)
	type check struct {
		method, path string
		header       [2]string // name, value; empty: no key
		want         int
	}
	bearer := [2]string{"Authorization", "Bearer k"}
	for _, tc := range []struct {
		p      Personality
		body   string
		checks []check
	}{
		{PersonalityVLLM, vllm401, []check{
			{"GET", "/health", [2]string{}, 200},
			{"GET", "/metrics", [2]string{}, 200},
			{"POST", "/reset_prefix_cache", [2]string{}, 200},
			{"GET", "/v1/models", [2]string{}, 401},
			{"GET", "/v1/models", bearer, 200},
			{"GET", "/v1/models", [2]string{"Authorization", "bearer k"}, 200},
			{"GET", "/v1/nope", [2]string{}, 401},
		}},
		{PersonalitySGLang, vllm401, []check{
			{"GET", "/health", [2]string{}, 200},
			{"GET", "/metrics", [2]string{}, 200},
			{"GET", "/v1/models", [2]string{}, 401},
			{"GET", "/v1/models", bearer, 200},
			// An exact comparison: the scheme's case counts.
			{"GET", "/v1/models", [2]string{"Authorization", "bearer k"}, 401},
			// Every path but /health* and /metrics*.
			{"POST", "/reset_prefix_cache", [2]string{}, 401},
			{"GET", "/get_model_info", [2]string{}, 401},
		}},
		{PersonalityLlamaCpp, llama401, []check{
			{"GET", "/health", [2]string{}, 200},
			{"GET", "/v1/models", [2]string{}, 200},
			{"GET", "/models", [2]string{}, 200},
			{"GET", "/metrics", [2]string{}, 401},
			{"GET", "/metrics", bearer, 200},
			{"GET", "/metrics", [2]string{"X-Api-Key", "k"}, 200},
			{"GET", "/metrics", [2]string{"Authorization", "k"}, 200},
			{"GET", "/metrics", [2]string{"Authorization", "Bearer nope"}, 401},
			{"POST", "/v1/chat/completions", [2]string{}, 401},
		}},
	} {
		t.Run(string(tc.p), func(t *testing.T) {
			ts, _ := newTestServer(t, Config{Model: "m", Personality: tc.p, APIKey: "k", SGLangCheapHealth: true})
			for _, c := range tc.checks {
				req, _ := http.NewRequest(c.method, ts.URL+c.path, nil)
				if c.header[0] != "" {
					req.Header.Set(c.header[0], c.header[1])
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != c.want {
					t.Errorf("%s %s with %q = %d %s, want %d", c.method, c.path, c.header, resp.StatusCode, b, c.want)
				}
				if c.want == 401 && strings.TrimSpace(string(b)) != tc.body {
					t.Errorf("%s %s refused with %s, want %s", c.method, c.path, b, tc.body)
				}
			}
		})
	}
}

// An unknown personality is refused, naming it.
func TestUnknownPersonalityRefused(t *testing.T) {
	_, err := NewServer(Config{Model: "m", Personality: "tgi"})
	if err == nil || !strings.Contains(err.Error(), `"tgi"`) {
		t.Fatalf("NewServer with personality tgi: %v", err)
	}
}
