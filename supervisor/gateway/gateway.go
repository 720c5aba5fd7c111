package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/llmgw/llmgw/internal/bearer"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/hop"
	"github.com/llmgw/llmgw/supervisor/profile"
	"github.com/llmgw/llmgw/supervisor/status"
)

// Config configures a Gateway. The zero value serves (open, no access log,
// the prefix policy, built-in engine profiles, the real clock).
type Config struct {
	// Clock is the clock leases, ejections, scrapes, durations and
	// per-attempt timeouts are judged by; nil is the real one.
	Clock clock.Clock
	// Transport carries requests to engines, and the gateway's scrapes of
	// their /metrics; nil is NewTransport().
	Transport http.RoundTripper
	// EngineKey, when set, gives each engine's API key by engine ID
	// ("<shard>-<spec version>"); the gateway sends it upstream as
	// "Authorization: Bearer <key>" in place of the client's header, which
	// is never forwarded. An empty key sends none.
	EngineKey func(engineID string) string
	// Relay signs what the gateway sends through another node's relay to
	// an engine that listens on that node's loopback only (Route.Relay),
	// with the relay's key (internal/secret.HopKey(token, "relay")). Nil:
	// such routes cannot be reached, and an attempt on one fails like a
	// refused connection.
	Relay *hop.Signer
	// Keys, when set, are the API keys clients must present; SetKeys
	// replaces them. Nil: the gateway is open.
	Keys *KeySet
	// MaxInflight bounds the requests the gateway proxies at once; more get
	// 429 with Retry-After. Zero means no bound.
	MaxInflight int
	// MaxBodyBytes caps a request body (DefaultMaxBodyBytes when zero).
	MaxBodyBytes int64
	// BodyTimeout bounds reading a request body (DefaultBodyTimeout when
	// zero). It is set per request rather than as the server's
	// ReadTimeout, which would also end every stream that outlives it.
	BodyTimeout time.Duration
	// AccessLog receives one line per request; nil writes none.
	AccessLog io.Writer
	// AccessLogQueue is how many lines may wait for the writer before
	// new ones are dropped (4096 when zero).
	AccessLogQueue int
	// Tracer, when set, makes a span of every proxied request and of each
	// of its attempts, and sends each attempt's traceparent to the engine
	// (trace.go). Nil: no tracing, at no cost.
	Tracer trace.Tracer
	// Policy chooses among routable replicas; nil is Prefix with its
	// defaults, as `llmgw node up --gateway-policy` defaults to.
	Policy Policy
	// Profiles give each engine kind's metrics path and names, for the
	// gateway's own load scrapes; nil is profile.Builtin(). An engine
	// without one is weighed by its gossiped load only.
	Profiles map[string]profile.Profile
	// ScrapeInterval is the least time between two scrapes of one engine
	// (DefaultScrapeInterval when zero). Engines are read every tenth of
	// their requests' mean duration within [ScrapeInterval, 1 s], and only
	// those of deployments that see requests.
	ScrapeInterval time.Duration
	// EjectAfter failures in a row (connection failures, 500/502/504
	// answers, first-byte timeouts; never 429 or 503, which say busy)
	// eject a replica for EjectFor (3 and 10 s when zero).
	EjectAfter int
	EjectFor   time.Duration
	// FirstByteTimeout bounds the wait for the first byte of an engine's
	// answer, from sending the request; StreamIdleTimeout bounds the gap
	// between two reads of an answer's body after it. Zero is the engine
	// kind's profile (Readiness.FirstByteTimeout, StreamIdleTimeout), and
	// an engine kind with neither is not bounded. Their timers run on
	// Clock, so a test passes a bound by advancing it.
	FirstByteTimeout  time.Duration
	StreamIdleTimeout time.Duration
	// PDLegTimeout bounds, for a disaggregated deployment, the prefill
	// leg, the decode's first byte (which waits for the KV transfer) and
	// each gap in its answer, below the engine kind's own bounds
	// (DefaultPDLegTimeout when zero): see pdroute.go.
	PDLegTimeout time.Duration
	// Rand draws the random numbers of the gateway (SGLang's bootstrap
	// rooms, request IDs); nil is a source seeded from the system's.
	Rand func() uint64
	// Logger takes the gateway's warnings (a request of a disaggregated
	// deployment that was not disaggregated); nil discards them.
	Logger *slog.Logger
	// StatsWindow is the window Stats reports over (1 min when zero).
	StatsWindow time.Duration
	// RelayHold bounds how long a request waits when every replica it
	// tried is on a node whose relay refused the connection: an agent
	// restarting, whose engines serve on (DefaultRelayHold when zero).
	RelayHold time.Duration
	// SettleHold bounds how long a request waits for its node to settle
	// (DefaultSettleHold when zero): see Gateway.Update.
	SettleHold time.Duration
	// WakeHold bounds how long a request for a deployment starting from
	// zero is held for a replica (DefaultWakeHold when zero); WakeQueue
	// bounds the requests held per deployment and WakeBytes their bodies'
	// bytes in all (DefaultWakeQueue, DefaultWakeBytes). See wake.go.
	WakeHold  time.Duration
	WakeQueue int
	WakeBytes int
	// PriorityHeader names the request header whose value (interactive,
	// default or batch) sets a request's class in the gateway's queue,
	// ahead of its API key's; empty: no header is honoured. QueueDepth
	// bounds the requests waiting per deployment and QueueWait each one's
	// wait (DefaultQueueDepth, DefaultQueueWait when zero). See queue.go.
	PriorityHeader string
	QueueDepth     int
	QueueWait      time.Duration
}

// Defaults of Config.
const (
	DefaultMaxBodyBytes = 32 << 20
	DefaultBodyTimeout  = 30 * time.Second
	// DefaultScrapeInterval is as often as llm-d's endpoint picker reads
	// its engines by default; only engines whose requests are short are
	// read that often (see Config.ScrapeInterval).
	DefaultScrapeInterval = 50 * time.Millisecond
	// DefaultSettleHold is the node's own bound on settling (a node that
	// reaches no peer acts on its own view after 10 s), so a request
	// held from the node's start is served once it settles.
	DefaultSettleHold = 10 * time.Second
	// DefaultRelayHold covers an agent's restart: its new process serves
	// the relay again within a few seconds, its engines having served on.
	DefaultRelayHold = 5 * time.Second
)

// maxAttempts is one try and at most two retries.
const maxAttempts = 3

// Gateway is the node's OpenAI-compatible endpoint. It is an http.Handler
// and a prometheus.Collector. The node feeds it every snapshot with Update;
// requests read the routing table of the last one without locks.
type Gateway struct {
	cfg   Config
	clock clock.Clock
	tr    http.RoundTripper
	// adapterLabels bounds the adapter label of the per-key metrics.
	adapterLabels labelSet
	// ownTransport: the gateway made tr, and closes its idle connections
	// when it stops.
	ownTransport bool
	policy       Policy
	m            *metrics
	log          *accessLog
	stats        *stats
	scrape       *scrapers
	routing      atomic.Pointer[routing]
	keys         atomic.Pointer[KeySet]
	callers      *callers
	bodies       *bodyPool

	// active counts proxied requests (admission and drain); idle is
	// signalled when it drops to zero while stopping. stopping is set,
	// and draining closed, once the gateway drains (Drain).
	active    atomic.Int64
	stopping  atomic.Bool
	draining  chan struct{}
	drainOnce sync.Once
	// wakes holds the requests for deployments starting from zero.
	wakes wakes
	// queues holds the requests waiting for a replica below its bound.
	queues   queues
	idle     chan struct{}
	stopOnce sync.Once

	// pd remembers the outcomes of disaggregated requests logged.
	pd pdSeen

	// states carries each engine's live state across table rebuilds, by
	// route key.
	statesMu sync.Mutex
	states   map[string]*tracked
}

// tracked is one engine's live state with the names it is reported under,
// and the engine and node its routes went to.
type tracked struct {
	rep        *replica
	deployment string
	replicaID  string
	engineID   string
	node       string
	// relayed: the gateway reaches the engine through its holder's relay
	// (Route.Relay), so a holder that falls silent takes the requests in
	// flight with it.
	relayed bool
}

// routing is one installed table with the live state of its routes.
type routing struct {
	table  *Table
	routes map[string][]*liveRoute
	// own is this gateway's requests/s to each deployment (see Rates) as
	// of the table's making.
	own map[string]float64
	// replaced is closed when the next table is installed: requests held
	// until the node settles wait on it.
	replaced chan struct{}
}

type liveRoute struct {
	Route
	rep *replica
}

// New returns a gateway with an empty table, which is not settled: until
// an Update brings a settled one, requests for a model it lacks are held
// (see Update).
func New(cfg Config) *Gateway {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	ownTransport := cfg.Transport == nil
	if ownTransport {
		cfg.Transport = NewTransport()
	}
	if cfg.Policy == nil {
		cfg.Policy = &Prefix{}
	}
	if cfg.PDLegTimeout <= 0 {
		cfg.PDLegTimeout = DefaultPDLegTimeout
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Uint64 // ChaCha8, seeded by the system, safe for concurrent use
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Profiles == nil {
		cfg.Profiles = profile.Builtin()
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.AccessLogQueue <= 0 {
		cfg.AccessLogQueue = 4096
	}
	if cfg.ScrapeInterval <= 0 {
		cfg.ScrapeInterval = DefaultScrapeInterval
	}
	if cfg.EjectAfter <= 0 {
		cfg.EjectAfter = 3
	}
	if cfg.EjectFor <= 0 {
		cfg.EjectFor = 10 * time.Second
	}
	if cfg.StatsWindow <= 0 {
		cfg.StatsWindow = time.Minute
	}
	if cfg.WakeHold <= 0 {
		cfg.WakeHold = DefaultWakeHold
	}
	if cfg.WakeQueue <= 0 {
		cfg.WakeQueue = DefaultWakeQueue
	}
	if cfg.WakeBytes <= 0 {
		cfg.WakeBytes = DefaultWakeBytes
	}
	if cfg.QueueDepth <= 0 {
		cfg.QueueDepth = DefaultQueueDepth
	}
	if cfg.QueueWait <= 0 {
		cfg.QueueWait = DefaultQueueWait
	}
	if cfg.SettleHold <= 0 {
		cfg.SettleHold = DefaultSettleHold
	}
	if cfg.RelayHold <= 0 {
		cfg.RelayHold = DefaultRelayHold
	}
	g := &Gateway{cfg: cfg, clock: cfg.Clock, tr: cfg.Transport, ownTransport: ownTransport, policy: cfg.Policy, m: newMetrics(),
		stats: newStats(cfg.StatsWindow), callers: newCallers(), bodies: newBodyPool(), draining: make(chan struct{}),
		idle: make(chan struct{}, 1), states: map[string]*tracked{}}
	if cfg.AccessLog != nil {
		g.log = newAccessLog(cfg.AccessLog, cfg.AccessLogQueue, g.m.logDropped.Inc)
	}
	g.scrape = newScrapers(g)
	g.keys.Store(cfg.Keys)
	g.routing.Store(&routing{table: BuildTable(nil, cfg.Clock.Now()), routes: map[string][]*liveRoute{}, replaced: make(chan struct{})})
	return g
}

// Update installs the routing table of a new snapshot. The node calls it
// whenever it publishes one (every reconcile pass), so leases are judged
// afresh at least every pass; a request also skips a route whose lease
// lapsed since.
//
// An engine reached through its holder's relay that leaves the table
// because its holder renews no more (frozen, dead, cut off: its lease
// lapsed, and it is not stopping) has its requests cut the same way: the
// engine may serve on, but what it answers passes through the holder's
// agent, which is not answering.
//
// An engine that leaves the table because it is no longer ready (its
// holder alive and renewing, its engine neither ready nor stopping nor
// draining: Table.unready) has its requests in flight cut: one that has
// sent the client nothing is tried elsewhere, a stream gets its final
// error event. A hung engine would otherwise hold them until the bounds
// of its profile, minutes. A stopping or draining copy leaves them be:
// that is how a rolling update loses no request. A gang is judged by its
// rank-0 engine, the one its requests go to; when another rank fails,
// rank 0's holder restarts the gang, and rank 0 reads unready too.
//
// Until a snapshot says the node has settled (status.Snapshot.Settled:
// it has heard the cluster), the table is a partial view: a node that
// has just started may not know a deployment, or any ready replica of
// it, that the cluster has. A request the table cannot route then is
// held, at most Config.SettleHold, until a table can (or a settled one
// says it cannot), and /health answers 503 meanwhile (exchange.route).
func (g *Gateway) Update(snap *status.Snapshot) {
	now := g.clock.Now()
	t := BuildTable(snap, now)
	rt := &routing{table: t, routes: make(map[string][]*liveRoute, len(t.entries)), own: g.stats.published(now), replaced: make(chan struct{})}
	g.statesMu.Lock()
	next := make(map[string]*tracked, len(g.states))
	for name, e := range t.entries {
		for _, r := range e.Routes {
			k := r.key()
			st := next[k]
			if st == nil {
				if st = g.states[k]; st == nil {
					st = &tracked{rep: &replica{}}
				} else {
					st.rep.uncut()
				}
				st.deployment, st.replicaID, st.engineID, st.node = r.Deployment, r.ReplicaID, r.EngineID, r.Node
				st.relayed = r.Relay != ""
				next[k] = st
			}
			rt.routes[name] = append(rt.routes[name], &liveRoute{Route: r, rep: st.rep})
		}
	}
	// An engine that left the table with requests still in flight stays
	// counted until they end.
	var cut []*tracked
	for k, st := range g.states {
		if _, ok := next[k]; ok {
			continue
		}
		at := engineAt(st.engineID, st.node)
		if t.unready[at] || (st.relayed && t.holderSilent[at]) {
			cut = append(cut, st)
		}
		if st.rep.load.inFlight() > 0 {
			next[k] = st
		}
	}
	g.states = next
	g.statesMu.Unlock()
	// The new table first, so that the retries of the requests cut read
	// it. Each table is replaced once, so its channel is closed once.
	close(g.routing.Swap(rt).replaced)
	g.requeue(t)
	for _, st := range cut {
		why := "its engine is no longer ready"
		if t.holderSilent[engineAt(st.engineID, st.node)] {
			why = "its holder renews its lease no more, and its relay carries the requests"
		}
		st.rep.cutAll(&cutError{reason: reasonLeftRouting,
			msg: fmt.Sprintf("replica %s on %s left routing: %s", st.replicaID, st.node, why)})
	}
	g.stats.forget(func(m string) bool { _, ok := t.entries[m]; return ok })
}

// Table is the routing table in use.
func (g *Gateway) Table() *Table { return g.routing.Load().table }

// SetKeys replaces the API keys clients must present (the node calls it on
// SIGHUP after LoadKeys); nil opens the gateway. Requests already admitted
// are not re-checked.
func (g *Gateway) SetKeys(ks *KeySet) {
	g.keys.Store(ks)
	g.callers.forget(ks)
}

// Stats is each deployment's recent traffic through this gateway, sorted by
// deployment.
func (g *Gateway) Stats() []ModelStats { return g.stats.snapshot(g.clock.Now()) }

// StatsOver is Stats over another window: the page's history samples
// each of its steps. Past the last statsRing requests of a deployment
// its window shrinks the same way.
func (g *Gateway) StatsOver(window time.Duration) []ModelStats {
	return g.stats.over(g.clock.Now(), window)
}

// rateWindow is how far back Rates looks: long enough that a steady rate
// reads steady. rateRise is the short window it also reads, so that
// traffic that starts at this door shows within seconds: while a rising
// rate lags, the other gateways under-count this door's unseen load, the
// unsafe direction; a falling one lags the long window, which only keeps
// them careful a little longer.
const (
	rateWindow = 10 * time.Second
	rateRise   = 2 * time.Second
)

// Rates is the requests per second this gateway sent to each deployment:
// the higher of its rates over the last 10 s and the last 2 s.
// Deployments it sent nothing to are absent, and an idle gateway's map is
// empty, not nil. The node publishes it in its record
// (gossip.NodeRecord.GatewayRates), and the other gateways weigh by it how
// much of a replica's unseen load may be this one's (Table.Others), which
// divides by this gateway's own figure, measured alike.
//
// Requests held for a deployment starting from zero count too, as a rate
// of one per rateWindow each: they are what wakes it (wake.go).
func (g *Gateway) Rates() map[string]float64 {
	out := g.stats.published(g.clock.Now())
	for d, n := range g.wakes.counts() {
		out[d] = max(out[d], float64(n)/rateWindow.Seconds())
	}
	return out
}

// StatsWindow is the window Stats reports over (Config.StatsWindow).
func (g *Gateway) StatsWindow() time.Duration { return g.cfg.StatsWindow }

// Drain begins the gateway's stop: /health answers 503 from now on, so a
// load balancer takes the node out, and every answer carries
// "Connection: close", so that each client connection ends after its
// answer instead of being closed under a request. Requests keep being
// served, those that arrive meanwhile included: a request that reached
// this door is answered here, not refused (Server.Shutdown says when the
// door closes). Requests still held until the node settles are answered
// 503 with Retry-After at once: a node that stops will not settle.
func (g *Gateway) Drain() {
	g.drainOnce.Do(func() {
		g.stopping.Store(true)
		close(g.draining)
	})
}

// Shutdown drains the gateway (Drain) and waits until the requests in
// flight end or ctx does, then stops its background work (load scrapes,
// the access-log writer, idle connections of its own transport). Closing
// the listener and the client connections is the server's part
// (Server.Shutdown). When ctx ends first, the requests still in flight are
// cut (cutInFlight: each gets an answer) and ctx's error is returned.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.Drain()
	var err error
	for g.active.Load() > 0 && err == nil {
		select {
		case <-g.idle:
		case <-ctx.Done():
			err = fmt.Errorf("gateway: %d requests still in flight: %w", g.active.Load(), ctx.Err())
			g.cutInFlight()
		}
	}
	g.stopBackground()
	return err
}

// stopBackground stops the load scrapes, the access-log writer and the
// idle connections of the gateway's own transport, once.
func (g *Gateway) stopBackground() {
	g.stopOnce.Do(func() {
		g.scrape.close()
		if g.log != nil {
			g.log.close()
		}
		if t, ok := g.tr.(interface{ CloseIdleConnections() }); ok && g.ownTransport {
			t.CloseIdleConnections()
		}
	})
}

// cutInFlight ends every attempt in flight at the drain's bound, so that
// each request gets an answer before its connection closes: one that has
// sent the client nothing is answered 503 with Retry-After, a stream ends
// with an error event (see exchange.lost and relayEvents).
func (g *Gateway) cutInFlight() {
	cause := &cutError{reason: reasonStopping, msg: "node stopping: the gateway's drain bound passed before the answer ended; send the request to another node"}
	g.statesMu.Lock()
	states := make([]*tracked, 0, len(g.states))
	for _, st := range g.states {
		states = append(states, st)
	}
	g.statesMu.Unlock()
	for _, st := range states {
		st.rep.cutAll(cause)
	}
}

// admit counts a proxied request; release uncounts it. A draining gateway
// admits as before: see Drain.
func (g *Gateway) admit() *apiError {
	n := g.active.Add(1)
	if g.cfg.MaxInflight > 0 && n > int64(g.cfg.MaxInflight) {
		return errOverloaded(g.cfg.MaxInflight)
	}
	return nil
}

func (g *Gateway) release() {
	if g.active.Add(-1) == 0 && g.stopping.Load() {
		select {
		case g.idle <- struct{}{}:
		default:
		}
	}
}

// closing marks an answer about to be written as the connection's last
// while the gateway drains: the client then opens its next connection
// (to another node, once this one's listener closed) instead of sending
// on one the server is about to close.
func (g *Gateway) closing(w http.ResponseWriter) {
	if g.stopping.Load() {
		w.Header().Set("Connection", "close")
	}
}

// ServeHTTP serves the OpenAI surface: POST /v1/chat/completions,
// /v1/completions and /v1/embeddings (proxied), GET /v1/models and
// GET /health.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.closing(w)
	switch r.URL.Path {
	case "/v1/chat/completions":
		g.proxyPost(w, r, chatEndpoint)
	case "/v1/completions":
		g.proxyPost(w, r, completionsEndpoint)
	case "/v1/embeddings":
		g.proxyPost(w, r, embeddingsEndpoint)
	case "/v1/models":
		g.models(w, r)
	case "/health":
		g.health(w, r)
	default:
		g.refuse(w, r, errNotFound(r.URL.Path), "")
	}
}

// refuse answers a request the gateway turns down itself, and logs it.
func (g *Gateway) refuse(w http.ResponseWriter, r *http.Request, e *apiError, model string) {
	g.closing(w)
	e.write(w)
	at := g.clock.Now()
	if model == "" {
		model = unknownModel
	}
	g.m.requests.WithLabelValues(model, statusLabel(e.status)).Inc()
	if g.log != nil {
		g.log.add(logEntry{at: at, method: r.Method, path: r.URL.Path, model: model, status: e.status, err: e.code})
	}
}

func (g *Gateway) health(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		errMethod(r.Method, "GET").write(w)
		return
	}
	// 503 while the node has not heard the cluster, and from the moment
	// it stops: a load balancer in front takes the node out, and sends
	// its requests elsewhere.
	if g.stopping.Load() {
		errStopping().write(w)
		return
	}
	if !g.routing.Load().table.settled {
		errSettling().write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
}

// modelCard is one entry of /v1/models, in OpenAI's shape; root is the
// model id the deployment serves, as vLLM reports it.
type modelCard struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	Root    string `json:"root,omitempty"`
	// Parent, for a LoRA adapter, is its deployment (as vLLM and SGLang
	// list theirs); Root is then its source.
	Parent string `json:"parent,omitempty"`
	// State is ready (a replica is routable), or, for a deployment that
	// scales to zero, scaled_to_zero (none runs; a request wakes it) or
	// waking (a replica is starting). llmgw's field: OpenAI's clients
	// ignore it.
	State string `json:"state"`
}

// Model states in /v1/models.
const (
	StateReady        = "ready"
	StateScaledToZero = "scaled_to_zero"
	StateWaking       = "waking"
)

// models lists the deployments with at least one routable replica now,
// and those that scale from zero (a request to them is held, not
// refused), with their state.
func (g *Gateway) models(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		g.refuse(w, r, errMethod(r.Method, "GET"), "")
		return
	}
	if !g.authorized(w, r) {
		return
	}
	rt := g.routing.Load()
	now := g.clock.Now()
	cards := []modelCard{}
	for _, name := range rt.table.names {
		e := rt.table.entries[name]
		state := ""
		if e.PD != nil {
			// Routable with a decode and a prefill replica, or a decode
			// alone where the fallback lets it serve.
			if e.PD.routable(rt.routes[name], now) {
				state = StateReady
			}
		} else {
			for _, lr := range rt.routes[name] {
				if lr.live(now) {
					state = StateReady
					break
				}
			}
		}
		switch {
		case state == "" && e.Wakes && e.Replicas == 0:
			state = StateScaledToZero
		case state == "" && e.Wakes:
			state = StateWaking
		case state == "":
			continue // listed once it serves, as before
		}
		cards = append(cards, modelCard{ID: name, Object: "model", Created: e.Created, OwnedBy: "llmgw", Root: e.Model, State: state})
	}
	// LoRA adapters, once a ready replica of their deployment lists them.
	for _, name := range slices.Sorted(maps.Keys(rt.table.adapters)) {
		dep := rt.table.adapters[name]
		for _, lr := range rt.routes[dep] {
			if lr.live(now) && slices.Contains(lr.Adapters, name) {
				cards = append(cards, modelCard{ID: name, Object: "model", Created: rt.table.entries[dep].Created, OwnedBy: "llmgw",
					Root: rt.table.adapterSource[name], Parent: dep, State: StateReady})
				break
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{"list", cards})
}

// live reports whether the route's lease still holds at now.
func (lr *liveRoute) live(now time.Time) bool {
	return lr.LeaseExpires.IsZero() || now.Before(lr.LeaseExpires)
}

// authorized checks the client's key when keys are set, answering 401
// itself when it fails.
func (g *Gateway) authorized(w http.ResponseWriter, r *http.Request) bool {
	if _, err := g.authorize(r); err != nil {
		g.refuse(w, r, err, "")
		return false
	}
	return true
}

// authorize checks the client's key when keys are set; k is the key
// matched, nil when the gateway is open.
func (g *Gateway) authorize(r *http.Request) (k *apiKey, err *apiError) {
	ks := g.keys.Load()
	if ks == nil {
		return nil, nil
	}
	h := r.Header.Get("Authorization")
	if h == "" {
		return nil, errUnauthorized("missing API key: send Authorization: Bearer <key>")
	}
	tok, ok := bearer.Token(h)
	if !ok {
		return nil, errUnauthorized("malformed Authorization header: want Bearer <key>")
	}
	// find compares the token with every key in constant time.
	if k = ks.find(tok); k == nil {
		return nil, errUnauthorized("invalid API key")
	}
	return k, nil
}
