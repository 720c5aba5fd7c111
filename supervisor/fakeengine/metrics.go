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
