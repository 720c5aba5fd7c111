package fakeengine

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmgw/llmgw/internal/clock"
)

// maxBody bounds a request body; the fake never needs large prompts.
const maxBody = 1 << 20

// Server is the fake engine's HTTP handler. Use it directly with httptest;
// Run wraps it in a listener and the scripted crash.
type Server struct {
	cfg     Config
	now     func() time.Time
	started time.Time
	m       *metrics
	sched   *scheduler
	// cache is nil with NoPrefixCaching.
	cache   *prefixCache
	nextID  atomic.Uint64
	mux     *http.ServeMux
	metrics http.Handler
	// outputs counts tokens the scheduler produced, health probes' too:
	// SGLang's health check waits for it to move.
	outputs atomic.Uint64
	// hung is closed by Hang, stopped by stop; stuck counts the requests
	// blocked by the hang (tests wait for it).
	hung     chan struct{}
	hangOnce sync.Once
	stopped  chan struct{}
	stopOnce sync.Once
	stuck    atomic.Int64
	// loras are the registered adapters; loraInfo, vLLM's LoRA gauge, is
	// nil without LoRA or under another engine's metrics.
	loras    *loraRegistry
	loraInfo *loraInfo
	// kv is the engine's side of disaggregation (kv.go); decoding the
	// sequences a prefill slows (Config.StepInterference).
	kv       kvState
	decoding interference
}

// NewServer checks cfg and builds the handler. The startup delay is measured
// from this call.
func NewServer(cfg Config) (*Server, error) {
	if strings.TrimSpace(cfg.Model) == "" {
		return nil, errors.New("fake engine: a model name is required")
	}
	if err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	sched := newScheduler(cfg.MaxRunning, cfg.KVCacheBlocks, cfg.BlockSize)
	if cfg.EnableLoRA {
		sched.maxLoRAs = cfg.MaxLoRAs
		// vLLM skips a request whose adapter does not fit; SGLang stops
		// there and counts the base model as an adapter.
		sched.loraSkip = cfg.Personality != PersonalitySGLang
		sched.baseCounts = cfg.Personality == PersonalitySGLang
	}
	s := &Server{
		cfg:     cfg,
		now:     now,
		started: now(),
		m:       newMetrics(cfg, sched),
		sched:   sched,
		mux:     http.NewServeMux(),
		hung:    make(chan struct{}),
		stopped: make(chan struct{}),
		loras:   &loraRegistry{},
	}
	if cfg.EnableLoRA && cfg.Personality.metricNames(false).vllmExtras {
		s.loraInfo = newLoRAInfo(cfg.MaxLoRAs, cfg.LoRAInfoSplit, now)
		s.m.reg.MustRegister(s.loraInfo)
		sched.changed = func() { s.loraInfo.record(sched.loraState()) }
	}
	s.startKV()
	if cfg.KV.active() {
		s.m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricKVHeldRequests, Help: "Finished prefills holding their blocks for a decode to read (fake engine).",
			ConstLabels: prometheus.Labels{LabelModel: cfg.Model},
		}, func() float64 { return float64(s.HeldKVRequests()) }))
	}
	if err := s.loadStaticLoRAs(); err != nil {
		s.Close()
		return nil, err
	}
	if !cfg.NoPrefixCaching {
		s.cache = newPrefixCache(cfg.KVCacheBlocks)
	}
	s.metrics = promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{})
	switch cfg.Personality {
	case PersonalitySGLang:
		s.mux.HandleFunc("/health", s.sglangHealth)
		s.mux.HandleFunc("/health_generate", s.sglangHealth)
	case PersonalityLlamaCpp:
		s.mux.HandleFunc("/health", s.health)
		s.mux.HandleFunc("/models", s.models)
	default:
		s.mux.HandleFunc("/health", s.health)
		s.handleUnguardedVLLM()
	}
	s.handleLoRA()
	s.mux.HandleFunc("/v1/models", s.models)
	s.mux.HandleFunc("/v1/chat/completions", s.chat)
	s.mux.HandleFunc("/v1/completions", s.completions)
	s.mux.HandleFunc("/v1/embeddings", s.embeddings)
	s.mux.HandleFunc("/reset_prefix_cache", s.resetPrefixCache)
	s.mux.HandleFunc("/metrics", s.serveMetrics)
	return s, nil
}

// withDefaults fills the zero knobs and refuses negative ones, naming the
// flag that sets each.
func (cfg *Config) withDefaults() error {
	if cfg.Personality != PersonalityNone {
		if _, err := ParsePersonality(string(cfg.Personality)); err != nil {
			return err
		}
	}
	for _, f := range []struct {
		flag string
		v    int64
	}{
		{"--max-num-seqs", int64(cfg.MaxRunning)}, {"--block-size", int64(cfg.BlockSize)},
		{"--num-gpu-blocks-override", int64(cfg.KVCacheBlocks)}, {"--token-delay", int64(cfg.TokenDelay)},
		{"--prefill-base", int64(cfg.PrefillBase)}, {"--prefill-per-1k-tokens", int64(cfg.PrefillPer1KTokens)},
		{"--startup-delay", int64(cfg.StartupDelay)}, {"--hang-after", int64(cfg.HangAfter)},
		{"--max-model-len", int64(cfg.MaxModelLen)},
		{"FAKE_ENGINE_HEALTH_DELAY_PER_RUNNING", int64(cfg.HealthDelayPerRunning)},
		{"SGLANG_HEALTH_CHECK_TIMEOUT", int64(cfg.SGLangHealthTimeout)},
	} {
		if f.v < 0 {
			return fmt.Errorf("fake engine: %s must not be negative (0 means the default)", f.flag)
		}
	}
	cfg.MaxRunning = cmp.Or(cfg.MaxRunning, 256)
	cfg.BlockSize = cmp.Or(cfg.BlockSize, 16)
	cfg.KVCacheBlocks = cmp.Or(cfg.KVCacheBlocks, 8192)
	cfg.MaxModelLen = cmp.Or(cfg.MaxModelLen, 4096)
	if err := cfg.loraDefaults(); err != nil {
		return err
	}
	if err := cfg.KV.defaults(); err != nil {
		return err
	}
	cfg.HealthDelayPerRunning = cmp.Or(cfg.HealthDelayPerRunning, DefaultHealthDelayPerRunning)
	cfg.SGLangHealthTimeout = cmp.Or(cfg.SGLangHealthTimeout, DefaultSGLangHealthTimeout)
	if cfg.Sleep == nil {
		cfg.Sleep = clock.SleepReal
	}
	return nil
}

// ResetPrefixCache empties the prefix cache, as POST /reset_prefix_cache
// does; a benchmark calls it between runs so none starts warm.
func (s *Server) ResetPrefixCache() {
	if s.cache != nil {
		s.cache.reset()
	}
}

// resetPrefixCache is vLLM's development endpoint of the same name (served
// there with VLLM_SERVER_DEV_MODE=1). It is outside /v1, so, as in vLLM,
// the API key does not guard it.
func (s *Server) resetPrefixCache(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "use POST", badRequest, "")
		return
	}
	s.ResetPrefixCache()
	w.WriteHeader(http.StatusOK)
}

// ServeHTTP runs what a real engine runs before any handler, in its order:
// the hang (nothing answers), the vllm personality's loop delay, llama.cpp's
// loading state, then the API key as the personality's middleware checks
// it. Without a personality, as vLLM: every /v1/* path, unknown ones
// included, needs the key; /health and /metrics do not (probes and
// scrapers of vLLM send none), and neither do vLLM's inference paths
// outside /v1 (/invocations, /pooling, /score, /rerank, /tokenize,
// /detokenize; see handleUnguardedVLLM), which run the model for anyone.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == HangPath {
		s.debugHang(w, r)
		return
	}
	if !s.step(r.Context()) {
		return
	}
	p := s.cfg.Personality
	if p == PersonalityVLLM {
		// One asyncio loop serves every request and streams every
		// answer: the more run, the later any request is looked at.
		running, _, _ := s.sched.load()
		if !s.sleep(r.Context(), time.Duration(running)*s.cfg.HealthDelayPerRunning) {
			return
		}
	}
	if p == PersonalityLlamaCpp && !s.loaded() {
		// Every path, as the newest tools/server/server-http.cpp has it
		// ("no endpoints are allowed to be accessed when the server is
		// not ready"; see PersonalityLlamaCpp for where releases differ).
		llamaLoading(w)
		return
	}
	if s.cfg.APIKey != "" && p.guarded(r) && !s.authorized(r) {
		p.unauthorized(w)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// authorized reports whether r carries the API key as the personality's
// engine reads it.
func (s *Server) authorized(r *http.Request) bool {
	key, ok := s.cfg.Personality.presentedKey(r)
	return ok && keyMatches(key, s.cfg.APIKey)
}

// serveMetrics is /metrics, unless the engine was started without its
// metrics flag.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	if s.cfg.NoMetrics {
		s.cfg.Personality.metricsOff(w)
		return
	}
	s.metrics.ServeHTTP(w, r)
}

func (s *Server) logf(format string, args ...any) {
	if s.cfg.Log != nil {
		fmt.Fprintf(s.cfg.Log, "%s %s\n", s.now().UTC().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
	}
}

// loaded reports whether the scripted startup delay has passed. Under the
// vllm personality a Server is always loaded: Run keeps its port closed
// until then, as vLLM does.
func (s *Server) loaded() bool {
	return s.cfg.Personality == PersonalityVLLM || !s.now().Before(s.started.Add(s.cfg.StartupDelay))
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	switch {
	case s.cfg.FailHealth:
		http.Error(w, "engine unhealthy (scripted)", http.StatusServiceUnavailable)
	case !s.loaded():
		http.Error(w, "engine loading", http.StatusServiceUnavailable)
	case s.cfg.Healthy != nil && !s.cfg.Healthy():
		http.Error(w, "waiting for the gang's other ranks", http.StatusServiceUnavailable)
	case s.cfg.Personality == PersonalityLlamaCpp:
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	default:
		// vLLM answers 200 with an empty body.
		w.WriteHeader(http.StatusOK)
	}
}

// modelCard is one entry of vLLM's /v1/models.
type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen *int    `json:"max_model_len"`
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	if !s.loaded() {
		writeError(w, http.StatusServiceUnavailable, "engine loading", "ServiceUnavailableError", "")
		return
	}
	cards := []modelCard{{
		ID: s.cfg.Model, Object: "model", Created: s.started.Unix(),
		OwnedBy: s.cfg.Personality.ownedBy(), Root: s.cfg.Model, MaxModelLen: &s.cfg.MaxModelLen,
	}}
	// Each adapter after the base model, in the order loaded, with its
	// path as root, the base as parent and no max_model_len: vLLM's
	// OpenAIServingModels.show_available_models, and SGLang's
	// available_models (http_server.py) alike.
	for _, a := range s.loras.list() {
		parent := a.parent
		cards = append(cards, modelCard{
			ID: a.name, Object: "model", Created: s.started.Unix(),
			OwnedBy: s.cfg.Personality.ownedBy(), Root: a.path, Parent: &parent,
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": cards})
}

// reply is the deterministic answer to a prompt: it names the model and
// echoes the start of the prompt, so a test can tell which engine answered
// what. One word is one generated token. It is cut to maxTokens, and
// padded to minTokens (vLLM's min_tokens, or max_tokens with ignore_eos,
// which benchmarks send to fix the output length).
func (s *Server) reply(prompt, adapter string, maxTokens, minTokens int) (tokens []string, finish string) {
	words := []string{"fake", s.cfg.Model, "reply:"}
	if adapter != "" {
		// An adapter's answer names it, so a test can tell which answered.
		words = []string{"fake", s.cfg.Model, "[adapter", adapter + "]", "reply:"}
	}
	echo := strings.Fields(prompt)
	if len(echo) > 16 {
		echo = echo[:16]
	}
	words = append(words, echo...)
	for len(words) < minTokens {
		words = append(words, "more")
	}
	finish = "stop"
	if maxTokens > 0 && len(words) >= maxTokens && (len(words) > maxTokens || minTokens >= maxTokens) {
		words, finish = words[:maxTokens], "length"
	}
	// Streamed tokens carry their leading space, as real tokenizers do.
	for i := 1; i < len(words); i++ {
		words[i] = " " + words[i]
	}
	return words, finish
}

// decode reads a JSON request body into v and checks the model name. It
// writes the error itself and returns false on failure.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any, model func() string) bool {
	return s.decodeAs(w, r, v, func() (string, string) { return model(), "" }, nil)
}

// decodeAs is decode for the generation endpoints: the model may name a
// LoRA adapter (and, under SGLang, so may lora_path), which it stores in
// *as (nil: the base model only).
func (s *Server) decodeAs(w http.ResponseWriter, r *http.Request, v any, model func() (string, string), as *exchange) bool {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "use POST", badRequest, "")
		return false
	}
	if !s.loaded() {
		writeError(w, http.StatusServiceUnavailable, "engine loading", "ServiceUnavailableError", "")
		return false
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error(), badRequest, "")
		return false
	}
	m, loraPath := model()
	if as == nil {
		if m != s.cfg.Model {
			// As vLLM: a gateway tells "this engine does not serve that
			// model" (a stale route) from a bad request by the 404.
			writeError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", m), "NotFoundError", "model")
			return false
		}
		return true
	}
	adapter, answerAs, fail := s.resolveModel(m, loraPath)
	if fail != nil {
		param := ""
		if fail.status == http.StatusNotFound {
			param = "model"
		}
		writeError(w, fail.status, fail.msg, fail.typ, param)
		return false
	}
	as.adapter, as.model = adapter, answerAs
	return true
}

func (s *Server) id(prefix string) string {
	return fmt.Sprintf("%s-fake-%d", prefix, s.nextID.Add(1))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// badRequest is the error type vLLM gives a request it refuses (400).
const badRequest = "BadRequestError"

// writeError answers in the error shape of vLLM's OpenAI server since
// v0.10.1 (vLLM PR 22099), which is OpenAI's: {"error": {"message", "type",
// "param", "code"}}, with vLLM's type names (BadRequestError,
// NotFoundError) and the HTTP status as the code. vLLM before v0.10.1 sent
// the same fields flat, beside "object": "error", so a client of real
// engines reads error.message and falls back to message. An empty param is
// null.
func writeError(w http.ResponseWriter, status int, msg, typ, param string) {
	var p any
	if param != "" {
		p = param
	}
	writeJSON(w, status, map[string]any{
		"error": map[string]any{"message": msg, "type": typ, "param": p, "code": status},
	})
}
