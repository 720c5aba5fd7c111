package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmgw/llmgw/internal/hop"
	"github.com/prometheus/client_golang/prometheus"
)

// The relay is the holder's side of a request another node's gateway
// routes to an engine here. From cluster version 4 an engine listens on
// 127.0.0.1 only: vLLM's key guards /v1 alone, and its /invocations,
// /pooling, /score and /tokenize run the model for anyone who reaches the
// port (vllm/entrypoints/openai/api_server.py, AuthenticationMiddleware:
// a path that does not start with /v1 is passed without a check). A
// gateway on another node therefore sends to the holder's API,
// RelayPath<engine ID><path>, signed for "relay" (internal/hop: the
// method, target, body digest, time and a nonce, with a key derived from
// the cluster token), and the relay here checks the signature, refuses a
// nonce it saw before, and forwards to the engine on loopback with the
// engine's key. The key and the token never cross the network.
//
// The relay forwards only what a gateway sends: the inference paths
// (POST), and a GET of the engine's metrics path for the gateway's load
// scrapes. It streams without buffering (each write flushed), cancels the
// engine's request when the calling gateway goes away, and adds nothing
// to the answer, so the calling gateway's rules (retry only before the
// first byte, ejection, timeouts) hold as if it dialled the engine. An
// engine not held here, or one that refuses the connection, is a 502,
// which the calling gateway retries on another replica.

// RelayPath prefixes the relay's paths on a node's API.
const RelayPath = "/llmgw/relay/"

// relayPaths are the POST paths the relay forwards: the gateway's
// endpoints.
var relayPaths = map[string]bool{"/v1/chat/completions": true, "/v1/completions": true, "/v1/embeddings": true}

// LocalEngine is an engine this node runs, as the relay reaches it.
type LocalEngine struct {
	// Port is its HTTP port on 127.0.0.1, MetricsPath its profile's.
	Port        int
	MetricsPath string
}

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Verifier checks the calling gateway's signature (purpose "relay").
	Verifier *hop.Verifier
	// Local finds an engine this node runs by engine ID.
	Local func(engineID string) (LocalEngine, bool)
	// EngineKey gives each engine's API key by engine ID.
	EngineKey func(engineID string) string
	// MaxBodyBytes caps a request body (DefaultMaxBodyBytes when zero);
	// BodyTimeout bounds reading it (DefaultBodyTimeout when zero).
	MaxBodyBytes int64
	BodyTimeout  time.Duration
	// Transport carries requests to the engines; nil is NewTransport().
	Transport http.RoundTripper
}

// Relay serves RelayPath on a node's API. The zero value is not usable;
// use NewRelay.
type Relay struct {
	cfg   RelayConfig
	proxy *httputil.ReverseProxy
	// results counts the calls by what became of them
	// (llmgw_relay_requests_total{result}).
	results *prometheus.CounterVec

	mu sync.Mutex
	// inflight counts the requests being relayed; idle is closed (and
	// replaced) when it falls to zero, for Wait.
	inflight int
	idle     chan struct{}
}

// NewRelay returns a relay with cfg.
func NewRelay(cfg RelayConfig) *Relay {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.Transport == nil {
		cfg.Transport = NewTransport()
	}
	rl := &Relay{cfg: cfg, idle: make(chan struct{}),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmgw_relay_requests_total",
			Help: "Calls to this node's relay from other nodes' gateways, by result: relayed (to a local engine, whatever it answered), refused (no valid signature, or a replay), path (not one the relay forwards), no_engine (not held here), body (unreadable or too large); and metrics, scrapes of a local engine's metrics (GET /v1/engines/{engine}/metrics)."},
			[]string{"result"})}
	for _, r := range []string{"relayed", "refused", "path", "no_engine", "body", "metrics"} {
		rl.results.WithLabelValues(r)
	}
	close(rl.idle)
	rl.proxy = &httputil.ReverseProxy{
		Transport: cfg.Transport,
		// Every write is flushed: a stream's events reach the calling
		// gateway as the engine writes them.
		FlushInterval: -1,
		// ServeHTTP hands the proxy the outgoing request ready-made (target,
		// headers, key); nothing is left to rewrite.
		Rewrite: func(*httputil.ProxyRequest) {},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the calling gateway went away
			}
			relayError(w, http.StatusBadGateway, fmt.Sprintf("the engine did not answer the relay: %v", err))
		},
	}
	return rl
}

// Pattern is the relay's route on a node's API mux.
func (rl *Relay) Pattern() string { return RelayPath + "{engine}/{path...}" }

// MetricsPattern is the route through which Prometheus scrapes an engine
// this node runs (GET /v1/prometheus/targets points its __metrics_path__
// here). It is open, like the node's own /metrics: Prometheus cannot add
// a header per target, and llama.cpp guards its /metrics with the
// engine's key (its server's public endpoints are /health and /models
// only), which the relay adds and the scraper never sees.
const MetricsPattern = "GET /v1/engines/{engine}/metrics"

// metricsTimeout bounds one engine scrape through ServeMetrics: a hung
// engine must not hold Prometheus's scrape or the node's API for long.
const metricsTimeout = 10 * time.Second

// maxMetricsBytes caps an engine's metrics page through ServeMetrics
// (vLLM's is tens of KiB).
const maxMetricsBytes = 16 << 20

// ServeMetrics serves the metrics page of an engine this node runs
// (MetricsPattern), fetched from the engine's loopback port with its key.
// An engine not held here is a 404: Prometheus marks the target down
// until discovery drops it.
func (rl *Relay) ServeMetrics(w http.ResponseWriter, r *http.Request) {
	engineID := r.PathValue("engine")
	local, ok := rl.cfg.Local(engineID)
	if !ok {
		rl.results.WithLabelValues("no_engine").Inc()
		relayError(w, http.StatusNotFound, fmt.Sprintf("engine %s does not run on this node", engineID))
		return
	}
	rl.results.WithLabelValues("metrics").Inc()
	ctx, cancel := context.WithTimeout(r.Context(), metricsTimeout)
	defer cancel()
	url := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(local.Port)) + local.MetricsPath
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		relayError(w, http.StatusInternalServerError, err.Error())
		return
	}
	// Prometheus's Accept (the formats it reads) goes on to the engine.
	if a := r.Header.Get("Accept"); a != "" {
		req.Header.Set("Accept", a)
	}
	if k := rl.cfg.EngineKey(engineID); k != "" {
		req.Header.Set("Authorization", "Bearer "+k)
	}
	resp, err := rl.cfg.Transport.RoundTrip(req)
	if err != nil {
		relayError(w, http.StatusBadGateway, fmt.Sprintf("engine %s did not answer for its metrics: %v", engineID, err))
		return
	}
	defer resp.Body.Close()
	for _, h := range []string{"Content-Type", "Content-Encoding"} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, io.LimitReader(resp.Body, maxMetricsBytes))
}

// ServeHTTP relays one request to a local engine.
func (rl *Relay) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	engineID := r.PathValue("engine")
	path := "/" + r.PathValue("path")
	local, ok := rl.cfg.Local(engineID)
	switch {
	case r.Method == http.MethodPost && relayPaths[path]:
	case r.Method == http.MethodGet && ok && path == local.MetricsPath:
	default:
		rl.results.WithLabelValues("path").Inc()
		relayError(w, http.StatusNotFound, fmt.Sprintf("the relay forwards POST %s and GET of an engine's metrics path, not %s %s",
			strings.Join(slices.Sorted(maps.Keys(relayPaths)), ", "), r.Method, path))
		return
	}
	body, err := rl.readBody(w, r)
	if err != nil {
		rl.results.WithLabelValues("body").Inc()
		relayError(w, http.StatusRequestEntityTooLarge, err.Error())
		return
	}
	if _, _, err := rl.cfg.Verifier.Verify(r, body); err != nil {
		rl.results.WithLabelValues("refused").Inc()
		code := http.StatusUnauthorized
		if errors.Is(err, hop.ErrGuardFull) {
			code = http.StatusServiceUnavailable
		}
		relayError(w, code, "relay: "+err.Error())
		return
	}
	if !ok {
		// Stopped or moved since the calling gateway's view: another
		// replica may take the request (502 is retried).
		rl.results.WithLabelValues("no_engine").Inc()
		relayError(w, http.StatusBadGateway, fmt.Sprintf("engine %s does not run on this node", engineID))
		return
	}
	rl.results.WithLabelValues("relayed").Inc()
	rl.begin()
	defer rl.end()
	out := r.Clone(r.Context())
	out.URL.Scheme, out.URL.Host = "http", net.JoinHostPort("127.0.0.1", strconv.Itoa(local.Port))
	out.URL.Path, out.URL.RawPath = path, ""
	out.Host = out.URL.Host
	out.RequestURI = ""
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.ContentLength = int64(len(body))
	out.Header = cleanHeader(r.Header, "Authorization", "Cookie", hop.Header, hop.CallerHeader, hop.ForwardedHeader, hop.NonceHeader,
		"Content-Length", "Expect")
	if k := rl.cfg.EngineKey(engineID); k != "" {
		out.Header.Set("Authorization", "Bearer "+k)
	}
	// X-Forwarded-For is not added: the engine's logs name no client
	// either when the gateway dials it directly.
	out.Header["X-Forwarded-For"] = nil
	rl.proxy.ServeHTTP(w, out)
}

// readBody reads r's body whole (its signature covers its digest), within
// the gateway's cap and time.
func (rl *Relay) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	ctx, cancel := context.WithTimeout(r.Context(), rl.cfg.BodyTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { _ = r.Body.Close() })
	defer stop()
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, rl.cfg.MaxBodyBytes))
	if err != nil {
		return nil, fmt.Errorf("relay: the request body (at most %d bytes) could not be read: %w", rl.cfg.MaxBodyBytes, err)
	}
	return b, nil
}

func (rl *Relay) begin() {
	rl.mu.Lock()
	if rl.inflight == 0 {
		rl.idle = make(chan struct{})
	}
	rl.inflight++
	rl.mu.Unlock()
}

func (rl *Relay) end() {
	rl.mu.Lock()
	rl.inflight--
	if rl.inflight == 0 {
		close(rl.idle)
	}
	rl.mu.Unlock()
}

var descRelayInflight = prometheus.NewDesc("llmgw_relay_inflight", "Requests this node's relay is carrying to its engines now.", nil, nil)

// Describe implements prometheus.Collector.
func (rl *Relay) Describe(ch chan<- *prometheus.Desc) {
	rl.results.Describe(ch)
	ch <- descRelayInflight
}

// Collect implements prometheus.Collector.
func (rl *Relay) Collect(ch chan<- prometheus.Metric) {
	rl.results.Collect(ch)
	rl.mu.Lock()
	n := rl.inflight
	rl.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descRelayInflight, prometheus.GaugeValue, float64(n))
}

// Wait returns once no request is being relayed, or when ctx ends (false).
// A stopping node waits here, after its gateway drained and before its
// API closes, so that the requests other nodes' gateways sent to its
// engines end whole; new ones are still relayed meanwhile, since the
// engines serve on.
func (rl *Relay) Wait(ctx context.Context) bool {
	rl.mu.Lock()
	idle := rl.idle
	rl.mu.Unlock()
	select {
	case <-idle:
		return true
	case <-ctx.Done():
		return false
	}
}

// relayError answers in OpenAI's error shape, as the gateway does.
func relayError(w http.ResponseWriter, code int, msg string) {
	typ := typeServer
	if code == http.StatusUnauthorized {
		typ = typeAuth
	}
	(&apiError{status: code, typ: typ, code: "relay", message: msg}).write(w)
}
