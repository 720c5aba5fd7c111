// Package supervisor is one llmgw node: it joins the cluster and settles
// (join.go), runs the control loop (loop.go: view, plan, this node's part to
// its Runner, what runs here with its leases back into gossip, and the read
// model of it all), and serves the node's HTTP API (api.go, logs.go).
//
// What it drives lives beside it: supervisor/engine runs the engines,
// supervisor/status is the read model every interface shows, and
// supervisor/datadir names what the node keeps on disk.
package supervisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/secret"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/engine"
	"github.com/llmgw/llmgw/supervisor/status"
)

// Config is everything `llmgw node up` decides.
type Config struct {
	Name    string
	DataDir string
	// BindAddr/BindPort: gossip listener. AdvertiseAddr/Port: what peers
	// dial (defaults to the bind address when it is not a wildcard).
	BindAddr      string
	BindPort      int
	AdvertiseAddr string
	AdvertisePort int
	// APIAddr is the HTTP listener, host:port.
	APIAddr string
	// GatewayAddr is where this node's gateway listens (host:port; empty:
	// none), published in its record with a wildcard host replaced by the
	// advertised one. GatewayTLS says it speaks HTTPS, so that clients
	// reading the record know the scheme.
	GatewayAddr string
	GatewayTLS  bool
	// GatewayRates, when set, is the node's gateway's requests/s per
	// deployment lately (gateway.Gateway.Rates), published in the node's
	// record so other gateways can tell how much of a replica's unseen
	// load may be this one's. Without it the record says nothing, and the
	// others assume this gateway sends as much as each of them.
	GatewayRates func() map[string]float64
	// Join lists gossip addresses to join, retried in the background.
	Join      []string
	GossipKey []byte
	// ClusterLabel tags gossip packets (default "llmgw").
	ClusterLabel string
	// Token guards mutating API calls and MCP.
	Token   string
	Labels  map[string]string
	Profile gossip.Profile
	// GPUs is the GPU probe (NVML, or simulated behind --simulate-gpus).
	GPUs          gpu.Probe
	GPUsSimulated bool
	GPUInterval   time.Duration
	// DriverFaults, when set, reads the kernel's NVIDIA driver messages on
	// every GPU tick: GPUs with a recent Xid are marked faulted (placement
	// puts nothing new there, vllm#36960: /health can say 200 while the GPU
	// faults), and the counts travel in the node's record.
	DriverFaults func(ctx context.Context) (host.DriverFaults, error)
	// Interconnect, when set, reads the RDMA ports' rates; they travel in
	// the record's telemetry beside the GPUs' activity (read from GPUs
	// when it is a gpu.TelemetryReader).
	Interconnect func(ctx context.Context) (host.Interconnect, error)
	LeaseTTL     time.Duration
	// Runner runs shards; nil claims shards without running anything.
	Runner Runner
	// RuntimeName is advertised in the node's record ("none" when nil).
	RuntimeName string
	// AllowFrom, when non-empty, limits every HTTP request to these
	// networks.
	AllowFrom []*net.IPNet
	Version   string
	Logger    *slog.Logger
	// Clock is the node's one clock: leases, backoffs and the record's
	// times are judged by it (default: the system clock).
	Clock clock.Clock
	// TestHooks enables /v1/test/partition. TEST ONLY.
	TestHooks bool
	// Extra registers additional HTTP handlers (MCP, metrics) on the mux.
	Extra func(n *Node, mux *http.ServeMux)
	// WeightsDir is the weights cache the weights probe scans (see
	// weights.go), every WeightsInterval (default a minute). HubURL is
	// where gpu_memory: auto reads headers of a model no node has (empty:
	// nowhere), within FitTimeout (default 5 s).
	WeightsDir      string
	WeightsInterval time.Duration
	HubURL          string
	FitTimeout      time.Duration
}

// Node is one running llmgw agent.
type Node struct {
	cfg     Config
	log     *slog.Logger
	cluster *gossip.Cluster
	runner  Runner
	api     *http.Server
	apiLn   net.Listener
	started time.Time

	clock clock.Clock

	mu      sync.Mutex
	gpuSnap gpu.Snapshot
	dropped map[string]bool // test partition rules

	// snap is the read model of the last reconcile pass (see Status).
	snap atomic.Pointer[status.Snapshot]
	// writes counts the deployment writes this node accepted; snapWrites
	// is how many of them the published snapshot saw, and published is
	// closed (and replaced, under mu) at every publication. Place and
	// Unplace wait on them, so a client reads its own write back.
	writes, snapWrites atomic.Uint64
	published          chan struct{}

	// dir is the data dir; id is what its node.json holds, whose peers
	// the join loop keeps current.
	dir     datadir.Dir
	id      datadir.Identity
	settled atomic.Bool
	// toldPeers: --join or node.json named peers at start; isolatedSince
	// is since when the node has heard none (zero: it is not isolated;
	// under mu, see isolation.go).
	toldPeers     bool
	isolatedSince time.Time
	// renewalWarned: a failed note of the renewal on disk was logged (the
	// control loop owns it).
	renewalWarned bool
	// loadPublished is when shard load last went out in the record, and
	// telemetryRead when telemetry was last read (the GPU loop owns it).
	loadPublished time.Time
	telemetryRead time.Time
	// ratesPublished is when the gateway's rates last went out (the
	// control loop owns it).
	ratesPublished time.Time
	// handover holds back the stop of copies whose replacements this node
	// has just seen ready (the control loop owns it).
	handover handover
	// wake makes the control loop reconcile now (the node settled).
	wake chan struct{}
	// rescan makes the weights loop scan now.
	rescan chan struct{}

	cancel context.CancelFunc
	// wg holds the control, join and GPU loops; serveWG the HTTP server.
	wg      sync.WaitGroup
	serveWG sync.WaitGroup
	closed  chan struct{}
	once    sync.Once
	// follows counts the open follow=1 log streams, per caller.
	follows followSlots
	// tools are the MCP tools this node serves (SetMCPTools), under mu.
	tools []string
}

// SetMCPTools records the MCP tools this node serves, for /status.json.
func (n *Node) SetMCPTools(names []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.tools = slices.Clone(names)
}

// mcpTools is what SetMCPTools recorded, never nil.
func (n *Node) mcpTools() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string{}, n.tools...)
}

// Start brings a node up: it reads its identity, discovers GPUs, listens
// for HTTP and gossip, and starts the control loop. On error nothing Start
// made is left running (cfg.Runner and cfg.GPUs stay the caller's to
// close), and the error says what failed.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 10 * time.Second
	}
	if cfg.GPUInterval == 0 {
		cfg.GPUInterval = 5 * time.Second
	}
	if cfg.ClusterLabel == "" {
		cfg.ClusterLabel = "llmgw"
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("--data-dir %s: %w", cfg.DataDir, err)
	}
	dir := datadir.New(cfg.DataDir)
	id, err := loadIdentity(dir, cfg.Name, cfg.Clock.Now, cfg.Logger.With("node", cfg.Name))
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, clock: cfg.Clock, dir: dir, log: cfg.Logger.With("node", cfg.Name), started: cfg.Clock.Now(), dropped: map[string]bool{},
		closed: make(chan struct{}), wake: make(chan struct{}, 1), published: make(chan struct{}), rescan: make(chan struct{}, 1)}
	n.snap.Store(status.Build(status.Input{Self: cfg.Name, Now: n.started, TTL: cfg.LeaseTTL}))
	n.runner = cfg.Runner
	if n.runner == nil {
		n.runner = engine.NewClaimOnly(cfg.Clock.Now)
	}
	if cfg.GPUs == nil {
		return nil, errors.New("supervisor: no GPU probe configured")
	}
	snap, err := cfg.GPUs.Discover(ctx)
	if err != nil {
		return nil, fmt.Errorf("discover GPUs: %w", err)
	}
	if !snap.Available && !cfg.GPUsSimulated {
		n.log.Info("no NVIDIA GPUs here (NVML library not found); this node offers no GPU capacity")
	}
	if cfg.GPUsSimulated {
		n.log.Warn("SIMULATED GPUs: this node advertises GPUs that do not exist (--simulate-gpus); for development and tests only", "gpus", len(snap.GPUs))
	}
	n.gpuSnap = snap

	// undo closes what Start has opened so far, newest first, when a later
	// step fails. Each entry closes one thing that exists: a deferred
	// closure over n's fields used to run after "return nil, err" had set
	// the named result n to nil, and its panic hid the real error.
	var undo []func()
	fail := func(err error) (*Node, error) {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		return nil, err
	}
	apiLn, err := net.Listen("tcp", cfg.APIAddr)
	if err != nil {
		return nil, fmt.Errorf("--api %s: %w", cfg.APIAddr, err)
	}
	n.apiLn = apiLn
	undo = append(undo, func() { _ = apiLn.Close() })

	gcfg := gossip.Config{
		Name: cfg.Name, BindAddr: cfg.BindAddr, BindPort: cfg.BindPort,
		AdvertiseAddr: cfg.AdvertiseAddr, AdvertisePort: cfg.AdvertisePort,
		Key: cfg.GossipKey, Label: cfg.ClusterLabel, Profile: cfg.Profile, Logger: cfg.Logger.With("node", cfg.Name),
		Now: cfg.Clock.Now, DeploymentsFile: dir.DeploymentsFile(), APIAddr: n.AdvertisedAPI(),
		TokenFingerprint: secret.Fingerprint(cfg.Token),
	}
	if cfg.TestHooks {
		gcfg.Drop = n.isDropped
	}
	n.reclaimIfLapsed()
	// Faulted GPUs are marked from the first record on: placement must
	// not use one in the seconds before the first GPU tick.
	gpus, probes := n.withFaults(ctx, n.foreignAdjusted(snap), nil, gossip.ProbeSummary{GPUDriver: snap.Driver, GPUsSimulated: cfg.GPUsSimulated})
	gpus = n.simulatedClaims(gpus)
	initial := gossip.NodeRecord{
		Version:      gossip.Version{Epoch: id.Epoch},
		API:          n.AdvertisedAPI(),
		Gateway:      n.advertised(cfg.GatewayAddr),
		GatewayTLS:   cfg.GatewayTLS && cfg.GatewayAddr != "",
		Labels:       cfg.Labels,
		GPUs:         gpus,
		AgentVersion: cfg.Version,
		StartedAt:    n.started,
		Probes:       probes,
		Shards:       n.runner.Shards(),
		Runtime:      cfg.RuntimeName,
		CachedModels: n.scanWeights(),
	}
	if cfg.GatewayRates != nil && cfg.GatewayAddr != "" {
		initial.GatewayRates = map[string]float64{} // idle, and saying so
	}
	if initial.Runtime == "" {
		initial.Runtime = "none"
	}
	cluster, err := gossip.New(gcfg, initial)
	if err != nil {
		return fail(err)
	}
	n.cluster = cluster
	// The gossip address is only known once memberlist bound, and with it
	// the last fallback of the advertised API address.
	n.cluster.UpdateLocal(func(r *gossip.NodeRecord) {
		r.Gossip, r.API, r.Gateway = n.cluster.Address(), n.AdvertisedAPI(), n.advertised(cfg.GatewayAddr)
	})

	mux := http.NewServeMux()
	n.routes(mux)
	if cfg.Extra != nil {
		cfg.Extra(n, mux)
	}
	n.api = newHTTPServer(n.guard(mux))
	lctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg.Add(4)
	n.serveWG.Add(1)
	go func() {
		defer n.serveWG.Done()
		if err := n.api.Serve(n.apiLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("HTTP API stopped", "err", err)
		}
	}()
	n.id = id
	n.toldPeers = len(dedupe(append(slices.Clone(cfg.Join), id.Peers...), n.cluster.Address())) > 0
	go n.joinLoop(lctx, append(slices.Clone(cfg.Join), id.Peers...))
	go n.loop(lctx)
	go n.gpuLoop(lctx)
	go n.weightsLoop(lctx)
	n.log.Info("node up", "api", n.APIAddr(), "gossip", n.cluster.Address(), "profile", cfg.Profile.Name, "gpus", len(snap.GPUs), "lease_ttl", cfg.LeaseTTL)
	return n, nil
}

// Name is the node's name.
func (n *Node) Name() string { return n.cfg.Name }

// APIAddr is the address the HTTP API listens on.
func (n *Node) APIAddr() string { return n.apiLn.Addr().String() }

// AdvertisedAPI is the API address other nodes and clients dial: the
// listen address, with a wildcard host replaced by the advertised one. It is
// what the node's record publishes, so consumers (MCP forwarding, the logs
// proxy, the page) dial record.API as it is.
func (n *Node) AdvertisedAPI() string { return n.advertised(n.APIAddr()) }

// advertised is addr (host:port) with a wildcard host replaced by the one
// peers and clients reach this node at; empty stays empty.
func (n *Node) advertised(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		switch {
		case n.cfg.AdvertiseAddr != "":
			host = n.cfg.AdvertiseAddr
		case net.ParseIP(n.cfg.BindAddr) != nil && !net.ParseIP(n.cfg.BindAddr).IsUnspecified():
			host = n.cfg.BindAddr
		case n.cluster != nil:
			// The address memberlist advertises reaches this host too.
			if gh, _, err := net.SplitHostPort(n.cluster.Address()); err == nil {
				host = gh
			}
		}
	}
	return net.JoinHostPort(host, port)
}

// Published is closed at the next publication of the read model: a
// follower (the gateway) waits on it, then reads Status again.
func (n *Node) Published() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.published
}

// GossipAddr is the address peers dial for gossip.
func (n *Node) GossipAddr() string { return n.cluster.Address() }

// GossipStats are the node's gossip traffic counters.
func (n *Node) GossipStats() gossip.Stats { return n.cluster.Stats() }

// Cluster exposes the gossip state (read-mostly) to handlers in other
// packages, such as MCP.
func (n *Node) Cluster() *gossip.Cluster { return n.cluster }

// Status is the read model of the node's last reconcile pass: what the
// API, the page, the metrics and MCP show. Read it with the reader's own
// now (see status.Snapshot).
func (n *Node) Status() *status.Snapshot { return n.snap.Load() }

// Now is the node's clock, for readers of Status.
func (n *Node) Now() time.Time { return n.clock.Now() }

// Plan returns the last plan this node computed.
func (n *Node) Plan() placement.Plan { return n.Status().Plan() }

// Leave leaves the cluster gracefully and stops the node. Engines keep
// running: a restarted agent adopts them.
func (n *Node) Leave(timeout time.Duration) error {
	return n.stop(func() error { return n.cluster.Leave(timeout) })
}

// Kill stops the node without telling the cluster, as a crash would.
func (n *Node) Kill() error { return n.stop(n.cluster.Shutdown) }

// Done is closed once the node stopped.
func (n *Node) Done() <-chan struct{} { return n.closed }

func (n *Node) stop(leave func() error) error {
	var err error
	n.once.Do(func() {
		// Order matters. The control loop must be gone before the node
		// marks itself leaving: a last reconcile would see this node as
		// not alive, plan nothing here and stop every engine. Then the
		// API, so no write is acknowledged that will not be gossiped. Then
		// the engines' watchers (engines keep running). Leave comes last.
		n.cancel()
		n.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = n.api.Shutdown(ctx)
		n.serveWG.Wait()
		if c, ok := n.runner.(closer); ok {
			c.Close()
		}
		err = leave()
		if c, ok := n.cfg.GPUs.(gpuCloser); ok {
			_ = c.Close()
		}
		close(n.closed)
	})
	return err
}

// NewToken returns a random cluster token.
func NewToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (n *Node) isDropped(peer string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.dropped[peer]
}
