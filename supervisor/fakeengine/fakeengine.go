// Package fakeengine is a stand-in inference engine that speaks the part of
// vLLM's HTTP surface llmgw reads: /health, /v1/models, the OpenAI chat and
// completions endpoints (plain and SSE streaming, usage included),
// /v1/embeddings and vLLM's Prometheus metrics. Where a gateway depends on
// vLLM's behaviour it answers as vLLM does: an unknown model is a 404 in
// vLLM's error shape, and with an API key every /v1/* path demands it
// (401 otherwise) while /health and /metrics stay open, and so do vLLM's
// inference paths outside /v1, which run the model without the key:
// SageMaker's /invocations (chat, completions or embeddings, by the body),
// /pooling, /score, /rerank, /tokenize and /detokenize. It loads no model
// and needs no GPU, so placement, supervision, routing and failure
// handling can be exercised on any machine.
//
// Its misbehaviour is scripted by Config, in the style of a mock driver: slow
// start, a crash after a while with a chosen exit code, a health endpoint
// that never turns healthy, the metric name of older vLLM releases, and a
// hang (Config.HangAfter, POST /debug/hang, Server.Hang): the process stays
// up with its port open, and every request, streams in flight included,
// blocks without a byte while the token counters stop, as a wedged engine
// core leaves a real engine.
//
// A Personality (Config.Personality; `llmgw engine fake --personality
// vllm|sglang|llamacpp`) makes it behave like that real engine where
// llmgw's supervisor and gateway can tell the difference: vLLM opens no
// port while loading and slows every request, /health included, by the
// requests running; SGLang's /health runs a generation through the
// scheduler; llama.cpp answers 503 on every path while loading; each has
// its own metric names and its own rule for which paths its key guards.
// Under a personality the fake reads the real engine's command line as
// llmgw's profiles render it (ParseCommandLine), refusing any flag the real
// engine does not have; what is only the fake's (the loading time, the
// token delays, the hang) comes from FAKE_ENGINE_* variables, so that a
// real engine's flag set never grows. Without a personality the fake is
// unchanged.
//
// Its performance is a small model of a vLLM engine, shaped by Config (and
// the flags of `llmgw engine fake`, which a deployment's args reach), so
// routing can be judged on something that behaves like one:
//
//   - Tokens: about one per four characters of the prompt (a chat's roles
//     and contents in order; token ids count one each). The same counts go
//     into usage, the token counters, the prefill time and the cache.
//   - Batch (MaxRunning, --max-num-seqs): at most that many sequences run
//     at once; the rest queue first come, first served and show in
//     vllm:num_requests_waiting.
//   - KV cache (KVCacheBlocks, --num-gpu-blocks-override, of BlockSize
//     tokens, --block-size): each running sequence holds blocks for its
//     prompt and the tokens generated so far; vllm:kv_cache_usage_perc is
//     the fraction held, and a prompt that does not fit waits.
//   - Prefix cache (on unless NoPrefixCaching, --no-enable-prefix-caching):
//     an LRU of at most KVCacheBlocks full-block hashes, each chained on
//     its parent's as in vLLM. A prompt whose first k blocks are cached
//     computes only the rest; vllm:prefix_cache_queries_total and
//     vllm:prefix_cache_hits_total count tokens looked up and found. A
//     prompt's blocks enter the cache when its prefill ends, and POST
//     /reset_prefix_cache (vLLM's development endpoint) empties it.
//   - Time: the first token comes PrefillBase + PrefillPer1KTokens per
//     thousand uncached prompt tokens after the sequence starts running
//     (--prefill-base, --prefill-per-1k-tokens), then one token every
//     TokenDelay (--token-delay). Sequences do not slow each other down,
//     unless StepInterference (--step-interference,
//     FAKE_ENGINE_STEP_INTERFERENCE) makes a prefill of T uncached tokens
//     delay every running sequence's next token by T × the per-token
//     prefill time. An embedding is its prefill alone, without the
//     prefix cache.
//
// LoRA adapters (Config.EnableLoRA; lora.go), as vLLM serves them:
// --enable-lora, --max-loras (default 1), --max-lora-rank (default 16, one
// of vLLM's choices), --max-cpu-loras and static --lora-modules name=path
// (or vLLM's JSON form); with VLLM_ALLOW_RUNTIME_LORA_UPDATING, POST
// /v1/load_lora_adapter {"lora_name", "lora_path"} and
// /v1/unload_lora_adapter {"lora_name"}, with vLLM's answers and errors (an
// adapter is a directory; a rank "r" in its adapter_config.json above the
// maximum is refused). /v1/models lists each adapter after the base, with
// its path as root and the base as parent; a request whose model is an
// adapter is answered under its name, the content saying "[adapter NAME]";
// at most --max-loras distinct adapters run at once, a request on another
// one waiting while others pass it, as vLLM's scheduler skips it; and
// vllm:lora_requests_info carries max_lora, running_lora_adapters and
// waiting_lora_adapters with the time as its value, one series per label
// set ever current. Under the sglang personality: --enable-lora,
// --lora-paths, --max-loras-per-batch, --max-loaded-loras, --max-lora-rank
// and --lora-target-modules, POST /load_lora_adapter and
// /unload_lora_adapter, and the adapter named as model "BASE:ADAPTER" or by
// lora_path.
//
// Prefill/decode disaggregation (Config.KV; kv.go, sglangkv.go), in both
// real protocols. vLLM's NixlConnector (--kv-transfer-config
// '{"kv_connector":"NixlConnector","kv_role":"kv_both",
// "kv_load_failure_policy":"fail"}', VLLM_NIXL_SIDE_CHANNEL_HOST/_PORT):
// the engine opens its side channel (a real TCP port); a request with
// kv_transfer_params.do_remote_decode runs its prefill and, when it ends
// length-capped, answers with vLLM's top-level kv_transfer_params naming
// that side channel, holding the prompt's full blocks for
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT (480 s); a request with
// do_remote_prefill connects to the named side channel, handshakes (a
// compatibility hash; FAKE_ENGINE_KV_COMPAT_VERSION stands for the
// version), reads the blocks (which frees them there), waits
// FAKE_ENGINE_KV_TRANSFER_PER_1K_TOKENS per thousand tokens and decodes
// with no prefill. A failed load fails the request as vLLM does (500
// "Internal server error"; streamed, an error event) under the policy
// fail, or computes the prompt under recompute. SGLang's pair
// (--disaggregation-mode prefill|decode, --disaggregation-bootstrap-port):
// both get the same body with bootstrap_host, bootstrap_port and
// bootstrap_room, the decode registers for its room on the prefill's
// bootstrap port, the prefill sends the KV once computed and answers its
// first token, each failing with a 500 after its timeout
// (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, _WAITING_TIMEOUT).
// vllm:prompt_tokens_by_source_total, vLLM's NIXL counters, SGLang's
// failure counters and the fake's fakeengine_kv_* say what happened,
// requests served whole by a decode included; FAKE_ENGINE_KV_TRANSFER_FAIL
// makes a prefill refuse every read.
//
// The zero Config is today's fast engine (no delays, 256 sequences, 8192
// blocks of 16 tokens). A benchmark in one process builds replicas with
// NewServer, e.g. Config{Model: "m", PrefillPer1KTokens: 50 * time.Millisecond,
// TokenDelay: 10 * time.Millisecond, MaxRunning: 8}, and serves each on a
// loopback listener; Sleep makes the delays testable without waiting.
package fakeengine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// Config scripts one fake engine.
type Config struct {
	// Model is the served model name: /v1/models lists it and requests must
	// name it.
	Model string
	// Port and Host are where Run listens. An empty Host listens on every
	// interface, as vLLM's default does.
	Port int
	Host string
	// StartupDelay keeps /health (and the model endpoints) at 503 for this
	// long after Run starts, like an engine loading weights. Under the vllm
	// personality Run instead listens only once it has passed, waiting it
	// through Sleep; under llamacpp every path answers 503.
	StartupDelay time.Duration
	// CrashAfter, when positive, makes Run stop serving abruptly after this
	// long and return a *CrashError carrying ExitCode.
	CrashAfter time.Duration
	ExitCode   int
	// FailHealth keeps /health at 503 for the engine's whole life.
	FailHealth bool
	// LegacyKVMetric exports vllm:gpu_cache_usage_perc (vLLM before the V1
	// engine) instead of vllm:kv_cache_usage_perc.
	LegacyKVMetric bool
	// APIKey, when set, is demanded as "Authorization: Bearer <key>" on
	// every /v1/* path, as vLLM's --api-key does; /health and /metrics
	// stay open, as vLLM's do.
	APIKey string

	// TokenDelay is the time between generated tokens (one decode step).
	TokenDelay time.Duration
	// PrefillBase and PrefillPer1KTokens make the time to first token:
	// PrefillBase plus PrefillPer1KTokens for every thousand prompt tokens
	// not found in the prefix cache.
	PrefillBase        time.Duration
	PrefillPer1KTokens time.Duration
	// MaxRunning is how many sequences run at once (vLLM's max_num_seqs);
	// more wait and show in vllm:num_requests_waiting. Zero means 256,
	// vLLM's default.
	MaxRunning int
	// BlockSize is the tokens per KV-cache block, the prefix cache's unit.
	// Zero means 16, vLLM's default.
	BlockSize int
	// KVCacheBlocks is the KV cache's size in blocks, which bounds both the
	// tokens in flight (usage 1 when full) and the prefix cache. Zero means
	// 8192.
	KVCacheBlocks int
	// NoPrefixCaching turns the prefix cache off, as vLLM's
	// --no-enable-prefix-caching: every prompt is computed whole.
	NoPrefixCaching bool
	// MaxModelLen is the context /v1/models reports (vLLM's
	// --max-model-len). Zero means 4096.
	MaxModelLen int

	// EnableLoRA serves LoRA adapters (vLLM's and SGLang's --enable-lora;
	// see lora.go). MaxLoRAs is how many distinct adapters may run at
	// once (vLLM's --max-loras, default 1; SGLang's --max-loras-per-batch,
	// default 8, the base model taking a slot); zero means the
	// personality's default. MaxLoRARank refuses an adapter whose
	// adapter_config.json has a larger "r" (vLLM's --max-lora-rank,
	// default 16; SGLang's, which has no default: zero is no limit there).
	// MaxCPULoRAs is vLLM's --max-cpu-loras, only checked (at least
	// MaxLoRAs). LoRAModules are loaded at start (vLLM's --lora-modules,
	// SGLang's --lora-paths); one that fails to load stops the engine.
	EnableLoRA  bool
	MaxLoRAs    int
	MaxLoRARank int
	MaxCPULoRAs int
	LoRAModules []LoRAModule
	// RuntimeLoRA mounts vLLM's POST /v1/load_lora_adapter and
	// /v1/unload_lora_adapter (VLLM_ALLOW_RUNTIME_LORA_UPDATING); SGLang's
	// endpoints are always there.
	RuntimeLoRA bool
	// MaxLoadedLoRAs caps SGLang's registered adapters
	// (--max-loaded-loras); zero is no cap.
	MaxLoadedLoRAs int
	// LoRAInfoSplit gives vllm:lora_requests_info the labels of vLLM
	// releases before the LoRA counts moved into the scheduler's stats:
	// running_lora_adapters only the adapters with a request running,
	// waiting_lora_adapters those with one waiting. Newer vLLM lists every
	// adapter with a request in both (FAKE_ENGINE_LORA_INFO_SPLIT).
	LoRAInfoSplit bool

	// KV makes the engine one half of a prefill/decode pair (see
	// KVTransfer and the package doc); the zero value takes no part.
	KV KVTransfer
	// StepInterference makes a prefill slow the decodes running beside
	// it, as one batch's steps do: a prefill computing T tokens delays
	// every running sequence's next token by T × the per-token prefill
	// time (PrefillPer1KTokens / 1000). Off by default, so that the
	// figures documented without it keep their meaning
	// (--step-interference; FAKE_ENGINE_STEP_INTERFERENCE under a
	// personality).
	StepInterference bool

	// HangAfter, when positive, makes Run hang the engine (see
	// Server.Hang) this long after it starts; the process keeps running.
	HangAfter time.Duration

	// Personality makes the fake behave like one real engine (see
	// Personality); empty is the plain fake.
	Personality Personality
	// HealthDelayPerRunning is how long the vllm personality holds every
	// request for each request running when it arrives. Zero means
	// DefaultHealthDelayPerRunning (500 ms).
	HealthDelayPerRunning time.Duration
	// SGLangCheapHealth makes the sglang personality's /health answer at
	// once, as SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0 does, instead of
	// generating a token.
	SGLangCheapHealth bool
	// SGLangHealthTimeout bounds the sglang personality's health
	// generation (SGLANG_HEALTH_CHECK_TIMEOUT). Zero means 20 s.
	SGLangHealthTimeout time.Duration
	// NoMetrics serves no metrics, as SGLang without --enable-metrics
	// (404) and llama.cpp without --metrics (501).
	NoMetrics bool

	// The fields below are not CLI flags; tests and benchmarks set them.

	// Sleep waits d unless ctx ends first, reporting whether d passed; the
	// prefill and token delays, the vllm personality's loop delay and
	// loading, and the sglang personality's health polls go through it.
	// Nil means a timer; a test passes one that records the delays or
	// holds them until told.
	Sleep func(ctx context.Context, d time.Duration) bool
	// Listener, when set, is served instead of listening on Host:Port, so a
	// caller can bind port 0 and learn the address first. Run closes it.
	// Under the vllm personality with a StartupDelay, Run closes it at once
	// and listens on its address again once loaded, so that connections
	// are refused meanwhile, as vLLM's are.
	Listener net.Listener
	// Now is the clock StartupDelay is measured on; nil means time.Now.
	Now func() time.Time
	// Healthy, when set, must also say true for /health to answer 200
	// (gang mode: every other rank connected; see RunGang).
	Healthy func() bool
	// Log receives one line per lifecycle event (listening, ready, crash);
	// nil discards them. The CLI passes stderr, which the runtime sends to
	// the engine's log file.
	Log io.Writer
}

// ErrCrash is what a scripted crash wraps; errors.As with *CrashError gives
// the exit code.
var ErrCrash = errors.New("fake engine: scripted crash")

// CrashError is returned by Run when Config.CrashAfter elapsed.
type CrashError struct {
	ExitCode int
	After    time.Duration
}

func (e *CrashError) Error() string {
	return fmt.Sprintf("fake engine: scripted crash after %s, exit code %d", e.After, e.ExitCode)
}

// Unwrap makes errors.Is(err, ErrCrash) true.
func (e *CrashError) Unwrap() error { return ErrCrash }

// ExitCode is the process exit code a CLI should use for Run's error: 0 for
// nil, the scripted code for a crash, 1 otherwise.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var ce *CrashError
	if errors.As(err, &ce) {
		return ce.ExitCode
	}
	return 1
}

// Run serves the fake engine until ctx is done (then it shuts down gracefully
// and returns nil) or until the scripted crash (then it drops every
// connection and returns a *CrashError).
func Run(ctx context.Context, cfg Config) error {
	srv, err := NewServer(cfg)
	if err != nil {
		return err
	}
	// A hang blocks requests until the engine stops; release them first,
	// or the graceful shutdown would wait on them.
	defer srv.stop()
	var crash <-chan time.Time
	if cfg.CrashAfter > 0 {
		t := time.NewTimer(cfg.CrashAfter)
		defer t.Stop()
		crash = t.C
	}
	crashed := func() error {
		srv.logf("fake engine crashing with exit code %d", cfg.ExitCode)
		return &CrashError{ExitCode: cfg.ExitCode, After: cfg.CrashAfter}
	}
	if cfg.HangAfter > 0 {
		t := time.AfterFunc(cfg.HangAfter, srv.Hang)
		defer t.Stop()
	}

	ln := cfg.Listener
	addr := net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port))
	// The side channel (vLLM) or bootstrap port (an SGLang prefill) is
	// open from the start, as the real engines open theirs while they
	// load.
	defer srv.Close()
	if srv.cfg.KV.listens() && srv.kv.ln == nil {
		kaddr := srv.cfg.KV.listenAddr(cfg.Host)
		kln, err := net.Listen("tcp", kaddr)
		if err != nil {
			return fmt.Errorf("fake engine: listen on %s (KV transfer): %w", kaddr, err)
		}
		srv.cfg.KV.Listener = kln
		srv.startKV()
		srv.logf("fake engine: KV transfer port on %s", kln.Addr())
	}
	if cfg.Personality == PersonalityVLLM && cfg.StartupDelay > 0 {
		// vLLM's API server listens only once the engine core is up
		// (its socket is bound but not listening until then; see
		// PersonalityVLLM): until then a client's connection is refused.
		if ln != nil {
			addr = ln.Addr().String()
			_ = ln.Close()
			ln = nil
		}
		srv.logf("fake engine loading model %q for %s (vllm: no listener until loaded)", cfg.Model, cfg.StartupDelay)
		lctx, cancel := context.WithCancel(ctx)
		defer cancel()
		loaded := make(chan bool, 1)
		go func() { loaded <- srv.cfg.Sleep(lctx, cfg.StartupDelay) }()
		select {
		case <-ctx.Done():
			return nil
		case <-crash:
			return crashed()
		case ok := <-loaded:
			if !ok {
				return nil
			}
		}
	}
	if ln == nil {
		ln, err = net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("fake engine: listen on %s: %w", addr, err)
		}
	}
	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
	}
	srv.logf("fake engine serving model %q on %s (personality %q, startup delay %s)", cfg.Model, ln.Addr(), cfg.Personality, cfg.StartupDelay)

	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()

	select {
	case <-ctx.Done():
		srv.logf("fake engine shutting down: %v", context.Cause(ctx))
		srv.stop()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := hs.Shutdown(sctx); err != nil {
			_ = hs.Close()
		}
		<-served
		return nil
	case <-crash:
		// A crash drops connections mid-stream, as a dying engine would.
		srv.stop()
		_ = hs.Close()
		<-served
		return crashed()
	case err := <-served:
		return fmt.Errorf("fake engine: serve: %w", err)
	}
}
