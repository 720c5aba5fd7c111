package fakeengine

import (
	"sync/atomic"

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
	// LabelModel is the label vLLM puts on every metric.
	LabelModel = "model_name"
)

// metrics is one engine's load, kept in atomics and exported through a
// private registry (a global one would mix engines in one test binary).
type metrics struct {
	reg        *prometheus.Registry
	running    atomic.Int64
	waiting    atomic.Int64
	maxRunning int
	prompt     prometheus.Counter
	generation prometheus.Counter
}

func newMetrics(model string, maxRunning int, legacyKV bool) *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), maxRunning: maxRunning}
	labels := prometheus.Labels{LabelModel: model}
	kvName := MetricKVCache
	if legacyKV {
		kvName = MetricKVCacheLegacy
	}
	m.prompt = prometheus.NewCounter(prometheus.CounterOpts{
		Name: MetricPromptTokens, Help: "Number of prefill tokens processed.", ConstLabels: labels,
	})
	m.generation = prometheus.NewCounter(prometheus.CounterOpts{
		Name: MetricGenerationTokens, Help: "Number of generation tokens processed.", ConstLabels: labels,
	})
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricRunning, Help: "Number of requests in model execution batches.", ConstLabels: labels,
		}, func() float64 { return float64(m.running.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricWaiting, Help: "Number of requests waiting to be processed.", ConstLabels: labels,
		}, func() float64 { return float64(m.waiting.Load()) }),
		// The KV cache fills with the running batch: a fake, but one that
		// moves with load the way the real gauge does.
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: kvName, Help: "KV-cache usage. 1 means 100 percent usage.", ConstLabels: labels,
		}, func() float64 { return float64(m.running.Load()) / float64(m.maxRunning) }),
		m.prompt,
		m.generation,
	)
	return m
}
