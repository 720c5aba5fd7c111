package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/hop"
	"github.com/llmgw/llmgw/internal/secret"
	"github.com/llmgw/llmgw/supervisor"
	"github.com/llmgw/llmgw/supervisor/engine"
	"github.com/llmgw/llmgw/supervisor/gateway"
	"github.com/llmgw/llmgw/supervisor/history"
	"github.com/llmgw/llmgw/supervisor/page"
)

func gatewayFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "gateway", Value: "0.0.0.0:8000", Usage: "OpenAI-compatible gateway listen host:port; empty disables it", Sources: cli.EnvVars("LLMGW_GATEWAY")},
		&cli.StringFlag{Name: "gateway-tls-cert", Usage: "PEM certificate: the gateway speaks HTTPS (with --gateway-tls-key)", Sources: cli.EnvVars("LLMGW_GATEWAY_TLS_CERT")},
		&cli.StringFlag{Name: "gateway-tls-key", Usage: "PEM private key of --gateway-tls-cert", Sources: cli.EnvVars("LLMGW_GATEWAY_TLS_KEY")},
		&cli.StringFlag{Name: "gateway-keys-file", Usage: "API keys clients must present, one per line with an optional name after it; reloaded on SIGHUP (default: the gateway is open)", Sources: cli.EnvVars("LLMGW_GATEWAY_KEYS_FILE")},
		&cli.IntFlag{Name: "gateway-max-inflight", Value: 4096, Usage: "requests the gateway proxies at once; more get 429", Sources: cli.EnvVars("LLMGW_GATEWAY_MAX_INFLIGHT")},
		&cli.StringFlag{Name: "gateway-policy", Value: "prefix", Usage: "how the gateway picks a replica: prefix (the same replica for the same prompt prefix on every node, within a load bound), least-load or round-robin", Sources: cli.EnvVars("LLMGW_GATEWAY_POLICY")},
		&cli.IntFlag{Name: "gateway-prefix-bytes", Value: gateway.DefaultPrefixBytes, Usage: "how much of a prompt the prefix policy hashes, in bytes of its messages' roles and contents", Sources: cli.EnvVars("LLMGW_GATEWAY_PREFIX_BYTES")},
		&cli.FloatFlag{Name: "gateway-balance", Value: gateway.DefaultBalance, Usage: "the prefix policy's load bound: a replica takes a prefix's requests while its load is within this many times the mean", Sources: cli.EnvVars("LLMGW_GATEWAY_BALANCE")},
		&cli.DurationFlag{Name: "gateway-scrape-interval", Value: gateway.DefaultScrapeInterval, Usage: "the least time between two reads of one engine's /metrics for routing; engines are read every tenth of their requests' duration, within this and 1s", Sources: cli.EnvVars("LLMGW_GATEWAY_SCRAPE_INTERVAL")},
		&cli.DurationFlag{Name: "gateway-first-byte-timeout", Usage: "how long the gateway waits for the first byte of an engine's answer before it answers 504 and counts a failure against the replica; 0: the engine profile's (10m for vllm, sglang and llamacpp)", Sources: cli.EnvVars("LLMGW_GATEWAY_FIRST_BYTE_TIMEOUT")},
		&cli.DurationFlag{Name: "gateway-stream-idle-timeout", Usage: "the longest the gateway waits between two reads of an engine's answer before it cuts it (a stream ends with an error event); 0: the engine profile's (2m for vllm, sglang and llamacpp)", Sources: cli.EnvVars("LLMGW_GATEWAY_STREAM_IDLE_TIMEOUT")},
		&cli.DurationFlag{Name: "pd-leg-timeout", Value: gateway.DefaultPDLegTimeout, Usage: "for deployments with prefill and decode roles: the longest the prefill leg, the decode's first byte (which waits for the KV transfer) and each gap in its answer may take before the request fails with an error (the engines' own waits are 300s and more)", Sources: cli.EnvVars("LLMGW_PD_LEG_TIMEOUT")},
		&cli.BoolFlag{Name: "gateway-access-log", Value: true, Usage: "one line per gateway request on stderr (never the prompt)", Sources: cli.EnvVars("LLMGW_GATEWAY_ACCESS_LOG")},
		&cli.StringFlag{Name: "priority-header", Usage: "a request header whose value (interactive, default or batch) sets the request's class in the gateway's queue, ahead of its API key's priority= (e.g. X-Priority); empty: no header is honoured", Sources: cli.EnvVars("LLMGW_PRIORITY_HEADER")},
		&cli.IntFlag{Name: "queue-depth", Value: gateway.DefaultQueueDepth, Usage: "requests that may wait in the gateway's queue per deployment, once every replica holds its bound (target_inflight, else max_num_seqs); more get 429", Sources: cli.EnvVars("LLMGW_QUEUE_DEPTH")},
		&cli.DurationFlag{Name: "queue-wait", Value: gateway.DefaultQueueWait, Usage: "the longest a request waits in the gateway's queue before it gets 429", Sources: cli.EnvVars("LLMGW_QUEUE_WAIT")},
		&cli.DurationFlag{Name: "gateway-drain-timeout", Value: gateway.DefaultDrainTimeout, Usage: "how long a stopping node's gateway keeps serving: it answers what it admitted and what arrives on open connections (with Connection: close), and cuts what is left at this bound", Sources: cli.EnvVars("LLMGW_GATEWAY_DRAIN_TIMEOUT")},
	}
}

// gatewaySetup is what the gateway flags decided, checked before anything
// starts.
type gatewaySetup struct {
	addr      string
	tls       *tls.Config
	keysFile  string
	keys      *gateway.KeySet
	inflight  int
	accessLog bool
	policy    gateway.Policy
	scrape    time.Duration
	// firstByte and streamIdle bound the waits on engines; 0 is each
	// engine kind's profile.
	firstByte  time.Duration
	streamIdle time.Duration
	// pdLeg bounds each leg of a disaggregated request (pdroute.go).
	pdLeg time.Duration
	// drain bounds the gateway's stop (Server.Shutdown).
	drain time.Duration
	// tracer, when tracing is on (tracing.go), traces its requests.
	tracer trace.Tracer
	// priorityHeader, queueDepth and queueWait configure the queue.
	priorityHeader string
	queueDepth     int
	queueWait      time.Duration
}

// gatewayConfig checks the gateway flags; every error names the flag.
func gatewayConfig(c *cli.Command) (gatewaySetup, error) {
	s := gatewaySetup{addr: c.String("gateway"), keysFile: c.String("gateway-keys-file"),
		inflight: int(c.Int("gateway-max-inflight")), accessLog: c.Bool("gateway-access-log")}
	if s.addr == "" {
		return s, nil
	}
	if _, _, err := splitHostPort("--gateway", s.addr); err != nil {
		return s, err
	}
	if s.inflight < 1 {
		return s, fmt.Errorf("--gateway-max-inflight %d: want at least 1", s.inflight)
	}
	prefixBytes, balance := int(c.Int("gateway-prefix-bytes")), c.Float("gateway-balance")
	if prefixBytes < 1 {
		return s, fmt.Errorf("--gateway-prefix-bytes %d: want at least 1 (default %d)", prefixBytes, gateway.DefaultPrefixBytes)
	}
	if balance < 1 {
		return s, fmt.Errorf("--gateway-balance %g: want at least 1 (1.25 lets a replica take 25%% over the mean)", balance)
	}
	pol, err := gateway.NewPolicy(c.String("gateway-policy"), prefixBytes, balance)
	if err != nil {
		return s, fmt.Errorf("--gateway-policy: %w", err)
	}
	s.policy = pol
	s.scrape = c.Duration("gateway-scrape-interval")
	if s.scrape < 10*time.Millisecond || s.scrape > time.Minute {
		return s, fmt.Errorf("--gateway-scrape-interval %v: want 10ms to 1m (default %v)", s.scrape, gateway.DefaultScrapeInterval)
	}
	s.firstByte, s.streamIdle = c.Duration("gateway-first-byte-timeout"), c.Duration("gateway-stream-idle-timeout")
	if s.firstByte < 0 {
		return s, fmt.Errorf("--gateway-first-byte-timeout %v: want 0 (the engine profile's) or more", s.firstByte)
	}
	if s.streamIdle < 0 {
		return s, fmt.Errorf("--gateway-stream-idle-timeout %v: want 0 (the engine profile's) or more", s.streamIdle)
	}
	if s.pdLeg = c.Duration("pd-leg-timeout"); s.pdLeg < 100*time.Millisecond || s.pdLeg > 10*time.Minute {
		return s, fmt.Errorf("--pd-leg-timeout %v: want 100ms to 10m (default %v)", s.pdLeg, gateway.DefaultPDLegTimeout)
	}
	if s.drain = c.Duration("gateway-drain-timeout"); s.drain < time.Second || s.drain > time.Hour {
		return s, fmt.Errorf("--gateway-drain-timeout %v: want 1s to 1h (default %v)", s.drain, gateway.DefaultDrainTimeout)
	}
	if s.priorityHeader = c.String("priority-header"); s.priorityHeader != "" && !headerName(s.priorityHeader) {
		return s, fmt.Errorf("--priority-header %q: want a header name (letters, digits and -, such as X-Priority)", s.priorityHeader)
	}
	if s.queueDepth = int(c.Int("queue-depth")); s.queueDepth < 1 || s.queueDepth > 1<<20 {
		return s, fmt.Errorf("--queue-depth %d: want 1 to %d requests per deployment (default %d)", s.queueDepth, 1<<20, gateway.DefaultQueueDepth)
	}
	if s.queueWait = c.Duration("queue-wait"); s.queueWait < 100*time.Millisecond || s.queueWait > 10*time.Minute {
		return s, fmt.Errorf("--queue-wait %v: want 100ms to 10m (default %v)", s.queueWait, gateway.DefaultQueueWait)
	}
	cert, key := c.String("gateway-tls-cert"), c.String("gateway-tls-key")
	switch {
	case (cert == "") != (key == ""):
		return s, errors.New("--gateway-tls-cert and --gateway-tls-key: give both or neither")
	case cert != "":
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return s, fmt.Errorf("--gateway-tls-cert/--gateway-tls-key: %w", err)
		}
		s.tls = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	}
	if s.keysFile != "" {
		ks, err := gateway.LoadKeys(s.keysFile)
		if err != nil {
			return s, fmt.Errorf("--gateway-keys-file: %w", err)
		}
		s.keys = ks
	}
	return s, nil
}

// nodeGateway is a running gateway: its listener, its server, and the
// goroutines that feed it snapshots and reload its keys.
type nodeGateway struct {
	gw    *gateway.Gateway
	ln    net.Listener
	srv   *gateway.Server
	drain time.Duration
	log   *slog.Logger
	stop  chan struct{}
	wg    sync.WaitGroup
}

// listenGateway opens the gateway's listener before the node starts, so
// the address its record publishes is the one bound (port 0 included).
func listenGateway(s gatewaySetup, name, token string, clk clock.Clock, log *slog.Logger) (*gateway.Gateway, net.Listener, error) {
	if s.addr == "" {
		return nil, nil, nil
	}
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--gateway %s: %w", s.addr, err)
	}
	if s.tls != nil {
		ln = tls.NewListener(ln, s.tls)
	}
	var access io.Writer
	if s.accessLog {
		access = os.Stderr
	}
	gw := gateway.New(gateway.Config{Keys: s.keys, MaxInflight: s.inflight, AccessLog: access, Policy: s.policy, ScrapeInterval: s.scrape,
		FirstByteTimeout: s.firstByte, StreamIdleTimeout: s.streamIdle, Tracer: s.tracer, PDLegTimeout: s.pdLeg, Logger: log,
		PriorityHeader: s.priorityHeader, QueueDepth: s.queueDepth, QueueWait: s.queueWait,
		// Each engine demands its own key; the gateway presents it in
		// place of the client's.
		EngineKey: func(id string) string { return secret.EngineKey(token, id) },
		// An engine on another node that listens on its loopback only is
		// reached through that node's relay, signed with this key.
		Relay: &hop.Signer{Name: name, Key: secret.HopKey(token, "relay"), Now: clk.Now}})
	if s.keys == nil {
		if host, _, _ := net.SplitHostPort(s.addr); !isLoopback(host) {
			log.Warn("the gateway is open to anyone who reaches "+s.addr+": give --gateway-keys-file to require API keys", "gateway", s.addr)
		}
	}
	return gw, ln, nil
}

// headerName reports whether name is a plain HTTP header name: letters,
// digits and dashes (RFC 9110 allows more; no operator needs them).
func headerName(name string) bool {
	for _, r := range name {
		if !(r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return name != ""
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// serveGateway serves gw on ln and feeds it every snapshot node publishes;
// SIGHUP reloads the keys file.
func serveGateway(s gatewaySetup, gw *gateway.Gateway, ln net.Listener, node *supervisor.Node, log *slog.Logger) *nodeGateway {
	g := &nodeGateway{gw: gw, ln: ln, srv: gateway.NewServer(gw, nil), drain: s.drain, log: log, stop: make(chan struct{})}
	g.wg.Add(2)
	go func() {
		defer g.wg.Done()
		if err := g.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("gateway stopped", "err", err)
		}
	}()
	go func() {
		defer g.wg.Done()
		for {
			next := node.Published()
			gw.Update(node.Status())
			select {
			case <-next:
			case <-g.stop:
				return
			}
		}
	}()
	if s.keysFile != "" {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			defer signal.Stop(hup)
			for {
				select {
				case <-g.stop:
					return
				case <-hup:
				}
				ks, err := gateway.LoadKeys(s.keysFile)
				if err != nil {
					log.Error("SIGHUP: the gateway keeps its keys; the file has an error", "err", err)
					continue
				}
				gw.SetKeys(ks)
				log.Info("SIGHUP: gateway keys reloaded", "keys", ks.Len())
			}
		}()
	}
	log.Info("gateway up", "addr", ln.Addr().String(), "tls", s.tls != nil, "keys", s.keys != nil)
	return g
}

// Close stops the gateway within --gateway-drain-timeout (see
// gateway.Server.Shutdown): /health says 503 at once, what was admitted
// and what arrives on open connections is served with Connection: close,
// the listener closes once no client is connected or half the bound has
// passed, and no connection is closed under a request. The snapshots keep
// coming meanwhile: the node leaves only after (nodeUp), so the table
// stays the cluster's while the gateway drains.
func (g *nodeGateway) Close() {
	if err := g.srv.Shutdown(g.drain); err != nil {
		g.log.Warn("gateway: drain bound reached", "err", err, "bound", g.drain)
	}
	close(g.stop)
	g.wg.Wait()
}

// gatewayStatsPath is where a node serves its gateway's recent traffic,
// for `llmgw top`. It needs no token: it reveals no prompts, only rates
// and times per deployment.
const gatewayStatsPath = "/v1/gateway/stats"

// gatewayStats is the body of GET /v1/gateway/stats: this node's gateway,
// where clients reach it, and each deployment's traffic through it.
type gatewayStats struct {
	Node string `json:"node"`
	URL  string `json:"url,omitempty"`
	// Window is what the figures cover (a model's own window is shorter
	// when more requests came than its ring holds).
	Window time.Duration        `json:"window"`
	Models []gateway.ModelStats `json:"models"`
}

// registerGatewayStats adds GET /v1/gateway/stats to the node's API. With
// no gateway (--gateway ""), it answers 404 saying so.
func registerGatewayStats(n *supervisor.Node, mux *http.ServeMux, gw *gateway.Gateway) {
	mux.HandleFunc("GET "+gatewayStatsPath, func(w http.ResponseWriter, r *http.Request) {
		snap := n.Status()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if gw == nil {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "node " + snap.Self() + " runs no gateway (--gateway is empty)"})
			return
		}
		out := gatewayStats{Node: snap.Self(), Window: gw.StatsWindow(), Models: gw.Stats()}
		if m, ok := snap.Member(snap.Self()); ok {
			out.URL = m.GatewayURL()
		}
		_ = json.NewEncoder(w).Encode(out)
	})
}

// pageOptions gives the cluster page this node's gateway traffic (nothing
// when it runs none): the page may not import the gateway.
func pageOptions(gw *gateway.Gateway) page.Options {
	if gw == nil {
		return page.Options{}
	}
	return page.Options{Traffic: func() []page.Traffic {
		var out []page.Traffic
		for _, m := range gw.Stats() {
			out = append(out, page.Traffic{Deployment: m.Model, Requests: m.Requests, Errors: m.Errors, Rate: m.Rate,
				Window: m.Window, TTFBP50: m.TTFBP50, TTFBP99: m.TTFBP99})
		}
		return out
	}}
}

// historyTraffic gives the node's history this node's gateway traffic per
// step (nil when it runs none: the request charts are then absent).
func historyTraffic(gw *gateway.Gateway) func(time.Duration) []history.Traffic {
	if gw == nil {
		return nil
	}
	return func(window time.Duration) []history.Traffic {
		var out []history.Traffic
		for _, m := range gw.StatsOver(window) {
			out = append(out, history.Traffic{Deployment: m.Model, Rate: m.Rate, TTFBP50: m.TTFBP50, TTFBP99: m.TTFBP99})
		}
		return out
	}
}

// newRelay is the relay through which other nodes' gateways reach this
// node's engines (gateway.Relay, on the node's API); nil without engines
// (--runtime none).
func newRelay(runner *engine.Runner, cfg supervisor.Config, s gatewaySetup) *gateway.Relay {
	if runner == nil {
		return nil
	}
	clk, token := cfg.Clock, cfg.Token // nodeConfig sets the clock
	return gateway.NewRelay(gateway.RelayConfig{
		Verifier:  &hop.Verifier{Key: secret.HopKey(token, "relay"), Now: clk.Now},
		EngineKey: func(id string) string { return secret.EngineKey(token, id) },
		Local: func(id string) (gateway.LocalEngine, bool) {
			port, path, ok := runner.Local(id)
			return gateway.LocalEngine{Port: port, MetricsPath: path}, ok
		},
	})
}

// waitRelay waits, at most bound, for the requests being relayed to this
// node's engines to end.
func waitRelay(rl *gateway.Relay, bound time.Duration, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if !rl.Wait(ctx) {
		log.Warn("relay: requests from other nodes' gateways still running at the drain bound; the API closes under them", "bound", bound)
	}
}
