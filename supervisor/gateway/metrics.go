package gateway

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// unknownModel labels requests whose model resolved to no deployment: the
// client chooses that string, and a label per typo would grow without
// bound.
const unknownModel = "(unknown)"

// metrics are the gateway's Prometheus series. They live in the Gateway,
// not in a package-level registry, and reach the node's /metrics through
// Gateway's Collector methods.
type metrics struct {
	requests       *prometheus.CounterVec
	duration       *prometheus.HistogramVec
	ttfb           *prometheus.HistogramVec
	itl            *prometheus.HistogramVec
	retries        *prometheus.CounterVec
	ejections      *prometheus.CounterVec
	upstreamErrors *prometheus.CounterVec
	affinity       *prometheus.CounterVec
	keyRequests    *prometheus.CounterVec
	keyTokens      *prometheus.CounterVec
	keyLimited     *prometheus.CounterVec
	logDropped     prometheus.Counter
	scrapeErrors   prometheus.Counter
	wakeHeld       *prometheus.CounterVec
	wakeWait       *prometheus.HistogramVec
	queueWait      *prometheus.HistogramVec
	queueRejected  *prometheus.CounterVec
	pdRequests     *prometheus.CounterVec
}

// descInflight is read from the replicas' own counters at scrape time, so
// replicas that left the table leave the metric with them.
var descInflight = prometheus.NewDesc("llmgw_gateway_requests_in_flight",
	"Requests this node's gateway has in flight, by deployment and replica.", []string{"model", "replica"}, nil)

// descQueueDepth is read from the queues at scrape time, like
// descInflight.
var descQueueDepth = prometheus.NewDesc("llmgw_gateway_queue_depth",
	"Requests waiting in this gateway's queue because every routable replica of the deployment holds its bound (target_inflight, else max_num_seqs), by deployment and priority class.", []string{"deployment", "priority"}, nil)

func newMetrics() *metrics {
	return &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_gateway_requests_total",
			Help: "Requests the gateway answered, by deployment and HTTP status (499: the client went away).",
		}, []string{"model", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmgw_gateway_request_duration_seconds",
			Help:    "Time from a request's arrival to its last byte, by deployment.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
		}, []string{"model"}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmgw_gateway_time_to_first_byte_seconds",
			Help:    "Time from a request's arrival to the first byte of the engine's answer relayed (the first event of a stream), by deployment.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"model"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmgw_gateway_inter_token_latency_seconds",
			Help:    "Time between consecutive events of a streamed answer that carry output (content, text, reasoning or tool-call arguments), as relayed to the client, by deployment: one observation per such event after the first; events without output (the role chunk, the finish and usage chunks, [DONE]) are passed over, and plain answers observe nothing.",
			Buckets: []float64{.005, .01, .02, .03, .05, .075, .1, .15, .2, .3, .5, 1, 2.5},
		}, []string{"model"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_gateway_retries_total",
			Help: "Requests sent to another replica, by deployment and why: connect (refused or reset before any byte), auth (the engine refused the gateway's key), busy (429 or 503), status_502 and status_504 (the engine's answer), left_routing (the replica left routing unready while the request waited).",
		}, []string{"model", "reason"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_gateway_ejections_total",
			Help: "Replicas skipped for a while by passive outlier detection, by deployment, replica and why: auth (401/403, at once), or the failure that completed a run of them: connect, status_500, status_502, status_504, first_byte_timeout. 429 and 503 (busy) never count.",
		}, []string{"model", "replica", "reason"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_gateway_upstream_errors_total",
			Help: "Failures of engines behind the gateway, by deployment, replica and kind: connect, auth (401/403), busy (429/503), status_500, status_502, status_504, first_byte_timeout (no byte of the answer within the bound), stream_idle_timeout (the answer stalled past the bound), left_routing (the replica left routing unready with the request in flight), stream (the engine broke off an answer).",
		}, []string{"model", "replica", "kind"}),
		affinity: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_gateway_affinity_total",
			Help: "Requests routed by the prefix policy, by deployment and outcome: taken (the prefix's first replica), spilled (it was over the load bound; a later one in the same order took it), unkeyed (no prompt to key on; least loaded).",
		}, []string{"model", "outcome"}),
		keyRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_gateway_key_requests_total",
			Help: "Requests by API key (its name in the keys file, or a short digest of a key without one), LoRA adapter (empty for the deployment itself; at most 64 names a gateway, the rest \"other\") and HTTP status.",
		}, []string{"key", "adapter", "code"}),
		keyTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_gateway_key_tokens_total",
			Help: "Tokens by API key, LoRA adapter (as for llmgw_gateway_key_requests_total) and kind (prompt, completion), as the engines' answers report them in usage (a stream only when the client asked for stream_options.include_usage).",
		}, []string{"key", "adapter", "kind"}),
		keyLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_gateway_key_limited_total",
			Help: "Requests refused with 429 because their API key was over its rps or concurrency limit.",
		}, []string{"key"}),
		logDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_gateway_access_log_dropped_total",
			Help: "Access-log lines dropped because the writer fell behind (requests never wait for it).",
		}),
		scrapeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmgw_gateway_load_scrape_errors_total",
			Help: "Failed scrapes of an engine's /metrics by the gateway; the gossiped load is used meanwhile.",
		}),
		wakeHeld: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_gateway_wake_held_total",
			Help: "Requests the gateway held for a deployment starting from zero (autoscaled with min 0, no replica routable), by deployment.",
		}, []string{"model"}),
		wakeWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmgw_gateway_wake_wait_seconds",
			Help:    "How long a held request waited for a replica of a deployment starting from zero (the cold start as a client saw it), by deployment.",
			Buckets: []float64{.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600},
		}, []string{"model"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmgw_gateway_queue_wait_seconds",
			Help:    "How long a request waited in the gateway's queue before it was let through to a replica, by deployment and priority class (requests that went at once are not observed).",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60},
		}, []string{"deployment", "priority"}),
		queueRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_gateway_queue_rejected_total",
			Help: "Requests the gateway's queue refused with 429, by deployment, priority class and reason: full (the queue depth was reached) or expired (the queue wait passed).",
		}, []string{"deployment", "priority", "reason"}),
		pdRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgw_gateway_pd_requests_total",
			Help: "Requests of disaggregated deployments (prefill and decode roles), by deployment and outcome: disaggregated (both legs), skipped (prompt's uncached part below transfer.skip_below: decode alone), fallback (decode alone: no prefill could serve and transfer.fallback allows it), no_params (the prefill answered without kv_transfer_params), version_mismatch (no prefill of the decode's spec version), each of these two served by the decode alone with transfer.fallback and failed without it, failed (the request failed for want of a prefill, a transfer or a decode).",
		}, []string{"deployment", "outcome"}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.duration, m.ttfb, m.itl, m.retries, m.ejections, m.upstreamErrors, m.affinity, m.keyRequests, m.keyTokens, m.keyLimited, m.logDropped, m.scrapeErrors, m.wakeHeld, m.wakeWait, m.queueWait, m.queueRejected, m.pdRequests}
}

// Describe implements prometheus.Collector.
func (g *Gateway) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range g.m.collectors() {
		c.Describe(ch)
	}
	ch <- descInflight
	ch <- descQueueDepth
}

// Collect implements prometheus.Collector.
func (g *Gateway) Collect(ch chan<- prometheus.Metric) {
	for _, c := range g.m.collectors() {
		c.Collect(ch)
	}
	// Old and new spec versions of one replica are separate engines with
	// one replica name: summed, so no label set is sent twice.
	type key struct{ model, replica string }
	sums := map[key]int{}
	g.statesMu.Lock()
	for _, st := range g.states {
		sums[key{st.deployment, st.replicaID}] += st.rep.load.inFlight()
	}
	g.statesMu.Unlock()
	for k, n := range sums {
		ch <- prometheus.MustNewConstMetric(descInflight, prometheus.GaugeValue, float64(n), k.model, k.replica)
	}
	g.queueDepths(func(dep string, class Priority, n int) {
		ch <- prometheus.MustNewConstMetric(descQueueDepth, prometheus.GaugeValue, float64(n), dep, class.String())
	})
}

func statusLabel(code int) string { return strconv.Itoa(code) }
