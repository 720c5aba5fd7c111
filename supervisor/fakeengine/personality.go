package fakeengine

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Personality makes the fake engine behave like one real engine where
// llmgw's supervisor and gateway can tell the difference: how it loads,
// what its /health costs, its metric names and which paths its key
// guards. The zero Personality is the plain fake: vLLM's surface with a
// cheap /health.
type Personality string

// The personalities. Each one's behaviour is described on its constant;
// the command line each parses is in cmdline.go.
const (
	// PersonalityNone is the plain fake engine, unchanged.
	PersonalityNone Personality = ""
	// PersonalityVLLM opens no port while loading and serves every
	// request, /health, /v1/models and /metrics included, on one loop that
	// the running requests slow down: each request first waits
	// HealthDelayPerRunning for every request running when it arrives (a
	// /health answered in 30-40 s under heavy load: vllm PR #38157). vLLM
	// binds its socket before the engine starts (setup_server in
	// vllm/entrypoints/openai/api_server.py: bind, no listen) and uvicorn
	// listens on it only once the engine core is up (build_and_serve), so
	// a connection is refused while it loads; the fake, which cannot bind
	// without listening, closes its port instead.
	PersonalityVLLM Personality = "vllm"
	// PersonalitySGLang listens at once and answers 503 on /health (and,
	// as the plain fake, on the model endpoints) for the whole
	// StartupDelay. SGLang itself listens only once its scheduler has
	// loaded the weights (python/sglang/srt/entrypoints/http_server.py
	// launch_server runs uvicorn after engine.py's _launch_subprocesses
	// has waited "for the model to finish loading"), then answers 503 on
	// /health alone while ServerStatus is Starting, until its warmup
	// request returns; the fake folds both phases into one 503 window.
	// Once loaded, /health is SGLang's health_generate (same file): a
	// one-token generation in the same scheduler as real requests, then a
	// poll once a second until some output arrives (its own, or any
	// other request's), up to SGLangHealthTimeout, else 503. With
	// SGLangCheapHealth (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0, which
	// llmgw's profile sets) /health answers 200 at once once started;
	// /health_generate still generates. Metrics are SGLang's
	// (sglang:num_running_reqs, ...), and the key guards every path but
	// /health* and /metrics* (add_api_key_middleware,
	// python/sglang/srt/utils.py).
	PersonalitySGLang Personality = "sglang"
	// PersonalityLlamaCpp listens at once, as llama-server starts its HTTP
	// server before it loads the model (tools/server/server.cpp), and
	// answers every path with 503 "Loading model" while loading
	// (middleware_server_state, tools/server/server-http.cpp; there "/"
	// and *.html get the 503 loading page instead, in builds with the web
	// UI, and some releases let /models, /v1/models and /api/tags
	// through). Its metrics are llama-server's
	// (llamacpp:requests_processing, ...; no KV-cache gauge, which
	// llama.cpp removed), served only with --metrics (NoMetrics otherwise),
	// and its key guards every path but /health, /v1/health, /models,
	// /v1/models, /api/tags and / (middleware_validate_api_key, same file;
	// the newest releases drop /api/tags and open the web UI's assets).
	PersonalityLlamaCpp Personality = "llamacpp"
)

// Personalities lists the personalities a command line may name.
func Personalities() []Personality {
	return []Personality{PersonalityVLLM, PersonalitySGLang, PersonalityLlamaCpp}
}

// ParsePersonality reads a personality's name.
func ParsePersonality(name string) (Personality, error) {
	for _, p := range Personalities() {
		if string(p) == name {
			return p, nil
		}
	}
	return "", fmt.Errorf("fake engine: unknown personality %q: want vllm, sglang or llamacpp", name)
}

// Defaults of the personalities' own knobs.
const (
	// DefaultHealthDelayPerRunning is the vllm personality's default
	// slowdown of every request per running request.
	DefaultHealthDelayPerRunning = 500 * time.Millisecond
	// DefaultSGLangHealthTimeout is SGLang's SGLANG_HEALTH_CHECK_TIMEOUT
	// default.
	DefaultSGLangHealthTimeout = 20 * time.Second
	// sglangHealthPoll is how often SGLang's health_generate looks for
	// output (its asyncio.sleep(1)).
	sglangHealthPoll = time.Second
)

// metricNames are one engine's names for the load the fake exports; an
// empty name is a metric the engine does not have.
type metricNames struct {
	running, waiting, kvUsage, prompt, generation string
	// modelLabel is the label carrying the served model name; empty: the
	// engine labels nothing (llama.cpp).
	modelLabel string
	// vllmExtras adds vLLM's prefix-cache counters and cache_config_info.
	vllmExtras bool
}

// SGLang's and llama.cpp's metric names, as llmgw's profiles read them.
const (
	MetricSGLangRunning          = "sglang:num_running_reqs"
	MetricSGLangWaiting          = "sglang:num_queue_reqs"
	MetricSGLangTokenUsage       = "sglang:token_usage"
	MetricSGLangPromptTokens     = "sglang:prompt_tokens_total"
	MetricSGLangGenerationTokens = "sglang:generation_tokens_total"

	MetricLlamaCppRunning          = "llamacpp:requests_processing"
	MetricLlamaCppWaiting          = "llamacpp:requests_deferred"
	MetricLlamaCppPromptTokens     = "llamacpp:prompt_tokens_total"
	MetricLlamaCppGenerationTokens = "llamacpp:tokens_predicted_total"
)

func (p Personality) metricNames(legacyKV bool) metricNames {
	switch p {
	case PersonalitySGLang:
		return metricNames{running: MetricSGLangRunning, waiting: MetricSGLangWaiting, kvUsage: MetricSGLangTokenUsage,
			prompt: MetricSGLangPromptTokens, generation: MetricSGLangGenerationTokens, modelLabel: LabelModel}
	case PersonalityLlamaCpp:
		return metricNames{running: MetricLlamaCppRunning, waiting: MetricLlamaCppWaiting,
			prompt: MetricLlamaCppPromptTokens, generation: MetricLlamaCppGenerationTokens}
	}
	kv := MetricKVCache
	if legacyKV {
		kv = MetricKVCacheLegacy
	}
	return metricNames{running: MetricRunning, waiting: MetricWaiting, kvUsage: kv,
		prompt: MetricPromptTokens, generation: MetricGenerationTokens, modelLabel: LabelModel, vllmExtras: true}
}

// ownedBy is the owned_by of the engine's /v1/models entry.
func (p Personality) ownedBy() string {
	switch p {
	case PersonalitySGLang:
		return "sglang"
	case PersonalityLlamaCpp:
		return "llamacpp"
	}
	return "vllm"
}

// guarded reports whether path needs the API key under p.
func (p Personality) guarded(r *http.Request) bool {
	path := r.URL.Path
	switch p {
	case PersonalitySGLang:
		// utils.add_api_key_middleware: everything but CORS preflights,
		// /health* and /metrics*.
		return r.Method != http.MethodOptions && !strings.HasPrefix(path, "/health") && !strings.HasPrefix(path, "/metrics")
	case PersonalityLlamaCpp:
		// middleware_validate_api_key (tools/server): everything but
		// these public paths and the web UI's root; /metrics is guarded.
		switch path {
		case "/health", "/v1/health", "/models", "/v1/models", "/api/tags", "/":
			return false
		}
		return r.Method != http.MethodOptions
	}
	// vLLM's AuthenticationMiddleware
	// (vllm/entrypoints/serve/utils/server_utils.py) guards every path that
	// starts with /v1 (newer releases also /v2, /inference and /cohere,
	// which the fake does not serve), OPTIONS excepted; the plain fake,
	// which scenarios rely on, keeps to /v1 and /v1/..., whatever the
	// method.
	return path == "/v1" || strings.HasPrefix(path, "/v1/")
}

// presentedKey is the key r carries as the engine reads it, and whether it
// carries one in the engine's form.
func (p Personality) presentedKey(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	switch p {
	case PersonalitySGLang:
		// An exact comparison with "Bearer " + key: the scheme's case
		// matters.
		key, ok := strings.CutPrefix(h, "Bearer ")
		return key, ok
	case PersonalityLlamaCpp:
		// Authorization, else Anthropic's X-Api-Key, either with or
		// without "Bearer ", as the newest middleware_validate_api_key
		// reads it (tools/server/server-http.cpp; older releases took
		// only "Bearer KEY" in Authorization, or the bare key in
		// X-Api-Key).
		if h == "" {
			h = r.Header.Get("X-Api-Key")
		}
		return strings.TrimPrefix(h, "Bearer "), h != ""
	}
	// vLLM: the scheme is case-insensitive (AuthenticationMiddleware's
	// verify_token).
	scheme, key, _ := strings.Cut(h, " ")
	return key, strings.EqualFold(scheme, "bearer")
}

// unauthorized answers a request without the key as the engine does.
func (p Personality) unauthorized(w http.ResponseWriter) {
	if p == PersonalityLlamaCpp {
		writeJSON(w, http.StatusUnauthorized, map[string]any{
			"error": map[string]any{"message": "Invalid API Key", "type": "authentication_error", "code": http.StatusUnauthorized},
		})
		return
	}
	// vLLM's and SGLang's middlewares answer exactly this, not their
	// usual error shape.
	writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "Unauthorized"})
}

// keyMatches compares digests, so the comparison's time depends on neither
// the key nor its length.
func keyMatches(got, want string) bool {
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

// llamaLoading is llama-server's answer to every request while it loads.
func llamaLoading(w http.ResponseWriter) {
	writeJSON(w, http.StatusServiceUnavailable, map[string]any{
		"error": map[string]any{"code": http.StatusServiceUnavailable, "message": "Loading model", "type": "unavailable_error"},
	})
}

// metricsOff answers /metrics of an engine started without its metrics
// flag.
func (p Personality) metricsOff(w http.ResponseWriter) {
	switch p {
	case PersonalityLlamaCpp:
		writeJSON(w, http.StatusNotImplemented, map[string]any{"error": map[string]any{
			"code": http.StatusNotImplemented, "type": "not_supported_error",
			"message": "This server does not support metrics endpoint. Start it with `--metrics`",
		}})
	default:
		// SGLang without --enable-metrics mounts no /metrics: FastAPI's
		// 404.
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
	}
}

// sglangHealth is SGLang's health_generate (see PersonalitySGLang).
func (s *Server) sglangHealth(w http.ResponseWriter, r *http.Request) {
	switch {
	case s.cfg.FailHealth, !s.loaded(), s.cfg.Healthy != nil && !s.cfg.Healthy():
		// SGLang answers 503 with no body while starting.
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	case s.cfg.SGLangCheapHealth && r.URL.Path == "/health":
		w.WriteHeader(http.StatusOK)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	tic := s.outputs.Load()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.generateOne(ctx)
	}()
	// The probe's generation ends with the probe, as SGLang cancels its
	// task, and never outlives the request.
	defer func() { cancel(); <-done }()
	polls := int((s.cfg.SGLangHealthTimeout + sglangHealthPoll - 1) / sglangHealthPoll)
	for range max(1, polls) {
		if !s.sleep(ctx, sglangHealthPoll) {
			return
		}
		// Any output since the probe began proves the scheduler turns:
		// SGLang compares the tokenizer manager's last receive time.
		if s.outputs.Load() > tic {
			w.WriteHeader(http.StatusOK)
			return
		}
	}
	s.logf("health check failed: no output from the scheduler for %s", s.cfg.SGLangHealthTimeout)
	w.WriteHeader(http.StatusServiceUnavailable)
}

// generateOne runs SGLang's health-check request: one prompt token (input
// id 0), one output token, through the scheduler like any request. As in
// SGLang (log_metrics=False) it moves no token counter, so a probe never
// passes for progress.
func (s *Server) generateOne(ctx context.Context) {
	q := s.sched.admit(ctx, 1)
	if q == nil {
		return
	}
	defer q.release()
	if !s.sleep(ctx, s.prefillTime(1)) || !s.step(ctx) {
		return
	}
	q.grow(1)
	s.outputs.Add(1)
}
