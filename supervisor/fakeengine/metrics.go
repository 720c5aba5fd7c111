package fakeengine

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// vLLM's metric names, as llmgw's engine probe reads them. The names carry a
// colon, which Prometheus allows for exactly this kind of namespacing.
const (
	MetricRunning          = "vllm:num_requests_running"
	MetricWaiting          = "vllm:num_requests_waiting"
	MetricKVCache          = "vllm:kv_cache_usage_perc"
	MetricKVCacheLegacy    = "vllm:gpu_cache_usage_perc"
	MetricPromptTokens     = "vllm:prompt_tokens_total"
	MetricGenerationTokens = "vllm:generation_tokens_total"
	// The prefix cache's counters count tokens, as vLLM's do: queries are
	// the prompt tokens looked up, hits the ones found cached.
	MetricPrefixCacheQueries = "vllm:prefix_cache_queries_total"
	MetricPrefixCacheHits    = "vllm:prefix_cache_hits_total"
	// MetricCacheConfig is vLLM's info gauge (always 1) whose labels give
	// the cache's shape.
	MetricCacheConfig = "vllm:cache_config_info"
	// LabelModel is the label vLLM puts on every metric.
	LabelModel = "model_name"

	// Prefill/decode disaggregation (kv.go). vLLM's, with a
	// --kv-transfer-config: the prompt tokens by where their KV came from
	// (label source: local_compute, local_cache_hit,
	// external_kv_transfer; vllm/v1/metrics/loggers.py), NixlConnector's
	// failed transfers (a decode's) and expired leases (a prefill's).
	MetricPromptTokensBySource = "vllm:prompt_tokens_by_source_total"
	MetricNixlFailedTransfers  = "vllm:nixl_num_failed_transfers_total"
	MetricNixlExpiredReqs      = "vllm:nixl_num_kv_expired_reqs_total"
	// SGLang's, in disaggregation mode (metrics_collector.py).
	MetricSGLangBootstrapFailed = "sglang:num_bootstrap_failed_reqs_total"
	MetricSGLangTransferFailed  = "sglang:num_transfer_failed_reqs_total"
	// The fake's own, under every personality taking part (no real
	// engine has them): requests served as a prefill leg (vLLM's
	// do_remote_decode, or an SGLang prefill with a room), KV loaded
	// from a prefill, requests that computed their own prefill instead
	// (label reason: no_params, a request without kv_transfer_params or
	// bootstrap_room; load_failure, recomputed under
	// kv_load_failure_policy recompute), failed loads (label reason: see
	// the LoadFail constants), and finished prefills holding blocks.
	MetricKVPrefillRequests = "fakeengine_kv_prefill_requests_total"
	MetricKVTransfers       = "fakeengine_kv_transfers_total"
	MetricKVRecomputed      = "fakeengine_kv_recomputed_requests_total"
	MetricKVLoadFailures    = "fakeengine_kv_load_failures_total"
	MetricKVHeldRequests    = "fakeengine_kv_held_requests"
)

// The sources of vllm:prompt_tokens_by_source_total and the reasons of
// fakeengine_kv_recomputed_requests_total.
const (
	SourceLocalCompute   = "local_compute"
	SourceLocalCacheHit  = "local_cache_hit"
	SourceExternalKV     = "external_kv_transfer"
	RecomputeNoParams    = "no_params"
	RecomputeLoadFailure = "load_failure"
)

// metrics is one engine's counters, exported through a private registry (a
// global one would mix engines in one test binary); the gauges read the
// scheduler when scraped.
type metrics struct {
	reg        *prometheus.Registry
	prompt     prometheus.Counter
	generation prometheus.Counter
	queries    prometheus.Counter
	hits       prometheus.Counter

	// Disaggregation (kv.go); registered only where the engine takes
	// part.
	bySource           *prometheus.CounterVec
	nixlFailed         prometheus.Counter
	kvExpired          prometheus.Counter
	sglBootstrapFailed prometheus.Counter
	sglTransferFailed  prometheus.Counter
	kvPrefill          prometheus.Counter
	kvTransfers        prometheus.Counter
	kvRecomputed       *prometheus.CounterVec
	kvLoadFailures     *prometheus.CounterVec
}

func newMetrics(cfg Config, sched *scheduler) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	names := cfg.Personality.metricNames(cfg.LegacyKVMetric)
	var labels prometheus.Labels
	if names.modelLabel != "" {
		labels = prometheus.Labels{names.modelLabel: cfg.Model}
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	gauge := func(name, help string, f func() float64) prometheus.GaugeFunc {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f)
	}
	// Every counter exists, so the engine model counts without asking
	// which the personality exports; only the exported ones register.
	m.prompt = counter(names.prompt, "Number of prefill tokens processed.")
	m.generation = counter(names.generation, "Number of generation tokens processed.")
	m.queries = counter(MetricPrefixCacheQueries, "Prefix cache queries, in terms of number of queried tokens.")
	m.hits = counter(MetricPrefixCacheHits, "Prefix cache hits, in terms of number of cached tokens.")
	vec := func(name, help, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, []string{label})
	}
	m.bySource = vec(MetricPromptTokensBySource, "Number of prompt tokens by source.", "source")
	m.nixlFailed = counter(MetricNixlFailedTransfers, "Number of failed NIXL KV Cache transfers.")
	m.kvExpired = counter(MetricNixlExpiredReqs, "Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance.")
	m.sglBootstrapFailed = counter(MetricSGLangBootstrapFailed, "The number of bootstrap failed requests.")
	m.sglTransferFailed = counter(MetricSGLangTransferFailed, "The number of transfer failed requests.")
	m.kvPrefill = counter(MetricKVPrefillRequests, "Requests served as the prefill leg of a disaggregated request (fake engine).")
	m.kvTransfers = counter(MetricKVTransfers, "Requests whose KV was loaded from a prefill engine (fake engine).")
	m.kvRecomputed = vec(MetricKVRecomputed, "Requests that computed their own prefill instead of loading it, by reason (fake engine).", "reason")
	m.kvLoadFailures = vec(MetricKVLoadFailures, "Failed KV loads, by reason (fake engine).", "reason")
	if cfg.KV.active() {
		m.reg.MustRegister(m.kvPrefill, m.kvTransfers, m.kvRecomputed, m.kvLoadFailures)
		for _, r := range []string{RecomputeNoParams, RecomputeLoadFailure} {
			m.kvRecomputed.WithLabelValues(r)
		}
	}
	if cfg.KV.nixl() && names.vllmExtras {
		m.reg.MustRegister(m.bySource, m.nixlFailed, m.kvExpired)
		for _, src := range []string{SourceLocalCompute, SourceLocalCacheHit, SourceExternalKV} {
			m.bySource.WithLabelValues(src)
		}
	}
	if cfg.KV.sglang() && cfg.Personality == PersonalitySGLang {
		m.reg.MustRegister(m.sglBootstrapFailed, m.sglTransferFailed)
	}
	m.reg.MustRegister(
		gauge(names.running, "Number of requests in model execution batches.", func() float64 {
			r, _, _ := sched.load()
			return float64(r)
		}),
		gauge(names.waiting, "Number of requests waiting to be processed.", func() float64 {
			_, w, _ := sched.load()
			return float64(w)
		}),
		m.prompt, m.generation,
	)
	if names.kvUsage != "" {
		m.reg.MustRegister(gauge(names.kvUsage, "KV-cache usage. 1 means 100 percent usage.", func() float64 {
			_, _, kv := sched.load()
			return kv
		}))
	}
	if names.vllmExtras {
		m.reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: MetricCacheConfig, Help: "Information of the LLMEngine CacheConfig",
				ConstLabels: prometheus.Labels{
					"block_size":            strconv.Itoa(cfg.BlockSize),
					"num_gpu_blocks":        strconv.Itoa(cfg.KVCacheBlocks),
					"enable_prefix_caching": map[bool]string{true: "True", false: "False"}[!cfg.NoPrefixCaching], // Python's spelling, as vLLM writes it
				},
			}, func() float64 { return 1 }),
			m.queries, m.hits,
		)
	}
	return m
}
