// Package supervisor is one llmgw node. Each of its responsibilities is a
// type of its own, in the file its name promises; Node (node.go) starts
// them, holds them, and is what the rest of the program calls.
//
//   - identity.go: node.json, the node's name, boot epoch and remembered
//     peers (identity).
//   - join.go: joining the cluster, retrying, redialling members believed
//     dead, and settling (joiner); what to say when a peer refuses this
//     node's gossip key.
//   - loop.go: the control loop (controlLoop): view, plan, this node's part
//     to its Runner, and what runs here back into gossip.
//   - leases.go: renewing this node's leases, noting each renewal on disk,
//     and reclaiming what it holds once they lapsed (leaseKeeper).
//   - view.go, handover.go, gang.go, failover.go: the pure parts of a
//     pass: placement's input with every lease judged, the settling of
//     replacements, the gang each member sees, and the takeovers after a
//     lapse (for the runner's traces).
//   - isolation.go: whether this node hears its peers (isolation).
//   - readmodel.go: what readers see, the snapshot of the last pass, and
//     the wait that lets a writer read its own write back (readModel).
//   - gpuloop.go: the GPU and driver-fault tick (gpuLoop).
//   - autoscaler.go: the decider loop of autoscaled deployments
//     (autoscaler), publishing their targets; the rule is
//     supervisor/autoscale.
//   - weights.go: the weights probe's loop (weightsLoop), and asking a peer
//     for a model's headers.
//   - place.go, autofit.go: Place and Unplace, the one way in for every
//     interface, and gpu_memory: auto.
//   - server.go and endpoint_*.go: the HTTP API (apiServer), one file per
//     resource, behind apiNode, what it asks of the node; logfile.go reads
//     engine log files for it.
//   - hop.go: signing and checking node-to-node calls (hops).
//   - runner.go: the Runner interface the control loop drives.
//
// What churns in the node's gossip record (shards and their load, the
// gateway's rates, GPUs, probes, telemetry), and when it goes out, is for
// supervisor/publish to decide; Start writes the rest once, and the
// weights loop the cached models. What the node drives lives beside it:
// supervisor/engine runs the engines, supervisor/status is the read model
// every interface shows, and supervisor/datadir names what the node keeps
// on disk.
package supervisor

import (
	"cmp"
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
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/internal/secret"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/engine"
	"github.com/llmgw/llmgw/supervisor/publish"
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
	// GatewayQueued, when set, is how many requests the node's gateway
	// queues per deployment now (gateway.Gateway.Queued), published with
	// the rates: demand the deployments' deciders add to their engines'.
	GatewayQueued func() map[string]int
	// GatewayPD, when set, is the latest reason the node's gateway saw
	// for each outcome of a disaggregated deployment's requests other
	// than disaggregated (gateway.Gateway.PDOutcomes), shown with the
	// deployments.
	GatewayPD func() map[string]map[string]string
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
	// NewClusterVersion is the cluster protocol version a node runs at
	// when it starts a new cluster: no peer to join, none remembered and
	// no version kept in node.json. 0: this build's newest (protocol.Max),
	// as a new CockroachDB cluster starts at its binary's version: no
	// member of an older release exists to agree with. Tests set 1 to
	// stand for a cluster that began on the previous release.
	NewClusterVersion int
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

// Node is one running llmgw agent. It owns the parts Start made, each the
// only writer of its own state, and answers for them to the rest of the
// program.
type Node struct {
	cfg     Config
	log     *slog.Logger
	clock   clock.Clock
	cluster *gossip.Cluster
	runner  Runner

	hops      hops       // signs and checks node-to-node calls
	drops     dropRules  // the test partition's rules (TestHooks)
	reads     *readModel // what readers see
	isolation *isolation // whether this node hears its peers
	control   *controlLoop
	gpus      *gpuLoop
	weights   *weightsLoop
	join      *joiner
	api       *apiServer

	cancel context.CancelFunc
	// loops holds the control, join, GPU and weights loops.
	loops  sync.WaitGroup
	closed chan struct{}
	once   sync.Once
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
	log := cfg.Logger.With("node", cfg.Name)
	started := cfg.Clock.Now()
	id, err := loadIdentity(dir, cfg.Name, started, log)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, clock: cfg.Clock, log: log, closed: make(chan struct{}),
		hops: hops{name: cfg.Name, token: cfg.Token, clock: cfg.Clock}}
	wake := newWakeup()
	n.reads = newReadModel(cfg.Clock, status.Build(status.Input{Self: cfg.Name, Now: started, TTL: cfg.LeaseTTL}), n.closed, wake)
	n.runner = cfg.Runner
	if n.runner == nil {
		n.runner = engine.NewClaimOnly(cfg.Clock)
	}
	if cfg.GPUs == nil {
		return nil, errors.New("supervisor: no GPU probe configured")
	}
	snap, err := cfg.GPUs.Discover(ctx)
	if err != nil {
		return nil, fmt.Errorf("discover GPUs: %w", err)
	}
	if !snap.Available && !cfg.GPUsSimulated {
		log.Info("no NVIDIA GPUs here (NVML library not found); this node offers no GPU capacity")
	}
	if cfg.GPUsSimulated {
		log.Warn("SIMULATED GPUs: this node advertises GPUs that do not exist (--simulate-gpus); for development and tests only", "gpus", len(snap.GPUs))
	}
	n.gpus = &gpuLoop{probe: cfg.GPUs, simulated: cfg.GPUsSimulated, every: cfg.GPUInterval,
		driverFaults: cfg.DriverFaults, interconnect: cfg.Interconnect, runner: n.runner, clock: cfg.Clock, log: log, snap: snap}
	n.weights = &weightsLoop{dir: cfg.WeightsDir, every: cfg.WeightsInterval, clock: cfg.Clock, log: log, rescan: make(chan struct{}, 1)}

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
	undo = append(undo, func() { _ = apiLn.Close() })

	gcfg := gossip.Config{
		Name: cfg.Name, BindAddr: cfg.BindAddr, BindPort: cfg.BindPort,
		AdvertiseAddr: cfg.AdvertiseAddr, AdvertisePort: cfg.AdvertisePort,
		Key: cfg.GossipKey, Label: cfg.ClusterLabel, Profile: cfg.Profile, Logger: log,
		Clock: cfg.Clock, DeploymentsFile: dir.DeploymentsFile(), APIAddr: advertised(apiLn.Addr().String(), cfg, ""),
		TokenFingerprint: secret.Fingerprint(cfg.Token),
		// The cluster version starts where the last run left it: it never
		// goes down, and a restarted node must not run an older rule than
		// its peers for the T it would take to rise again.
		ActiveVersion: id.ActiveVersion,
		// Beats come every TTL/3: one that renews a record heard within
		// TTL/2 changes no lease this node judges (the loop's tick
		// judges lapses), so it wakes no pass.
		BeatQuiet: cfg.LeaseTTL / 2,
	}
	if id.ActiveVersion == 0 && len(cfg.Join)+len(id.Peers) == 0 {
		gcfg.ActiveVersion = cmp.Or(cfg.NewClusterVersion, protocol.Max)
		log.Info("starting a new cluster: no peer to join, none remembered", "active_version", gcfg.ActiveVersion)
	}
	ident := &identity{dir: dir, id: id, log: log}
	gcfg.OnActiveVersion = func(v int) {
		if err := ident.saveActiveVersion(v); err != nil {
			log.Error("the active cluster version is not kept in node.json: after a restart this node starts at the one before and runs its rules until it rises again", "err", err)
		}
		// The loop passes at the rise, not at its next event: it has no
		// tick any more.
		wake.poke()
	}
	if cfg.TestHooks {
		gcfg.Drop = n.drops.dropped
	}
	leases := &leaseKeeper{ttl: cfg.LeaseTTL, clock: cfg.Clock, log: log, runner: n.runner, dir: dir}
	leases.reclaimIfLapsed(started)
	// Faulted GPUs are marked from the first record on: placement must
	// not use one in the seconds before the first GPU tick.
	gpus, probes := n.gpus.reading(ctx, snap, nil, gossip.ProbeSummary{GPUDriver: snap.Driver, GPUsSimulated: cfg.GPUsSimulated})
	initial := gossip.NodeRecord{
		Version:      gossip.Version{Epoch: id.Epoch},
		API:          gcfg.APIAddr,
		Gateway:      advertised(cfg.GatewayAddr, cfg, ""),
		GatewayTLS:   cfg.GatewayTLS && cfg.GatewayAddr != "",
		Labels:       cfg.Labels,
		GPUs:         gpus,
		AgentVersion: cfg.Version,
		StartedAt:    started,
		Probes:       probes,
		Shards:       n.runner.Shards(),
		Runtime:      cfg.RuntimeName,
		CachedModels: n.weights.scan(),
	}
	var rates func() map[string]float64
	var queued func() map[string]int
	if cfg.GatewayRates != nil && cfg.GatewayAddr != "" {
		rates = cfg.GatewayRates
		initial.GatewayRates = map[string]float64{} // idle, and saying so
	}
	if cfg.GatewayAddr != "" {
		queued = cfg.GatewayQueued
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
	cluster.UpdateLocal(func(r *gossip.NodeRecord) {
		r.Gossip = cluster.Address()
		r.API, r.Gateway = advertised(apiLn.Addr().String(), cfg, r.Gossip), advertised(cfg.GatewayAddr, cfg, r.Gossip)
	})

	peers := append(slices.Clone(cfg.Join), id.Peers...)
	n.isolation = &isolation{self: cfg.Name, ttl: cfg.LeaseTTL, after: isolatedAfter(cfg.Profile), started: started, shards: n.runner, log: log,
		toldPeers: len(dedupe(peers, cluster.Address())) > 0}
	if n.isolation.toldPeers {
		cluster.ExpectPeers()
	}
	n.join = &joiner{cluster: cluster, runner: n.runner, id: ident, keyFile: dir.GossipKeyFile(),
		self: cfg.Name, reconnect: reconnectInterval(cfg.Profile), clock: cfg.Clock, log: log, wake: wake}
	n.control = &controlLoop{name: cfg.Name, ttl: cfg.LeaseTTL, profile: cfg.Profile, clock: cfg.Clock, log: log,
		cluster: cluster, runner: n.runner, leases: leases, isolation: n.isolation, reads: n.reads,
		load: publish.NewLoad(cluster, rates, queued), wake: wake, settled: &n.join.settled}
	n.api = &apiServer{node: n, gossip: cluster, shards: n.runner, isolation: n.isolation, hops: &n.hops, drops: &n.drops,
		conf: apiConfig{gatewayPD: cfg.GatewayPD, name: cfg.Name, token: cfg.Token, allowFrom: cfg.AllowFrom, testHooks: cfg.TestHooks, weightsDir: cfg.WeightsDir,
			runtime: cfg.RuntimeName, profile: cfg.Profile.Name, version: cfg.Version, leaseTTL: cfg.LeaseTTL, started: started},
		clock: cfg.Clock, log: log, closed: n.closed}
	mux := http.NewServeMux()
	n.api.routes(mux)
	if cfg.Extra != nil {
		cfg.Extra(n, mux)
	}
	n.api.serve(apiLn, mux)

	lctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.loops.Go(func() { n.join.run(lctx, peers) })
	n.loops.Go(func() { n.control.run(lctx) })
	n.loops.Go(func() { n.gpus.run(lctx, cluster) })
	n.loops.Go(func() { n.weights.run(lctx, cluster) })
	scaler := &autoscaler{self: cfg.Name, clock: cfg.Clock, log: log, cluster: cluster, reads: n.reads, settled: &n.join.settled,
		deciders: map[scaleKey]*deciding{}}
	n.loops.Go(func() { scaler.run(lctx) })
	log.Info("node up", "api", n.APIAddr(), "gossip", cluster.Address(), "profile", cfg.Profile.Name, "gpus", len(snap.GPUs), "lease_ttl", cfg.LeaseTTL)
	return n, nil
}

// advertised is addr (host:port) with a wildcard host replaced by the one
// peers and clients reach this node at: --advertise-addr, else a specific
// --bind-addr, else the host memberlist advertises (gossipAddr, empty
// until it bound). Consumers (MCP forwarding, the logs proxy, the page)
// dial the addresses in the record as they are. Empty stays empty.
func advertised(addr string, cfg Config, gossipAddr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		switch {
		case cfg.AdvertiseAddr != "":
			host = cfg.AdvertiseAddr
		case net.ParseIP(cfg.BindAddr) != nil && !net.ParseIP(cfg.BindAddr).IsUnspecified():
			host = cfg.BindAddr
		case gossipAddr != "":
			// The address memberlist advertises reaches this host too.
			if gh, _, err := net.SplitHostPort(gossipAddr); err == nil {
				host = gh
			}
		}
	}
	return net.JoinHostPort(host, port)
}

// Name is the node's name.
func (n *Node) Name() string { return n.cfg.Name }

// APIAddr is the address the HTTP API listens on.
func (n *Node) APIAddr() string { return n.api.addr() }

// SetMCPTools records the MCP tools this node serves, for /status.json.
func (n *Node) SetMCPTools(names []string) { n.api.tools.set(names) }

// Published is closed at the next publication of the read model: a
// follower (the gateway) waits on it, then reads Status again.
func (n *Node) Published() <-chan struct{} { return n.reads.next() }

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
func (n *Node) Status() *status.Snapshot { return n.reads.load() }

// Now is the node's clock, for readers of Status.
func (n *Node) Now() time.Time { return n.clock.Now() }

// Plan returns the last plan this node computed.
func (n *Node) Plan() placement.Plan { return n.Status().Plan() }

// GPUSnapshot is the last GPU reading.
func (n *Node) GPUSnapshot() gpu.Snapshot { return n.gpus.snapshot() }

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
		n.loops.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		n.api.shutdown(ctx)
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
