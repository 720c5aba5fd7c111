// Package supervisor is the per-node control loop of llmgw: it gathers the
// gossip state, asks placement for the plan, hands this node's part of the
// plan to the engines, and publishes what runs here (with its leases) back
// into gossip. It serves the node's HTTP API too.
package supervisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/atomicfile"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/supervisor/engine"
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
	Now       func() time.Time
	// TestHooks enables /v1/test/partition. TEST ONLY.
	TestHooks bool
	// Extra registers additional HTTP handlers (MCP, metrics) on the mux.
	Extra func(n *Node, mux *http.ServeMux)
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

	mu       sync.Mutex
	plan     placement.Plan
	view     placement.View
	planAt   time.Time
	gpuSnap  gpu.Snapshot
	dropped  map[string]bool // test partition rules
	reconDur time.Duration

	// id is what node.json holds; the join loop keeps its peers current.
	id      identity
	settled atomic.Bool
	// loadPublished is when shard load last went out in the record.
	loadPublished time.Time
	kick          chan struct{}

	cancel context.CancelFunc
	// wg holds the control, join and GPU loops; serveWG the HTTP server.
	wg      sync.WaitGroup
	serveWG sync.WaitGroup
	closed  chan struct{}
	once    sync.Once
	// followers holds a slot per open follow=1 log stream (maxFollowers).
	followers chan struct{}
}

// Start brings a node up: it reads its identity, discovers GPUs, listens
// for HTTP and gossip, and starts the control loop. On error nothing is
// left running.
func Start(ctx context.Context, cfg Config) (n *Node, err error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
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
	id, err := loadIdentity(cfg.DataDir, cfg.Name, cfg.Now)
	if err != nil {
		return nil, err
	}
	n = &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.Name), started: cfg.Now(), dropped: map[string]bool{}, closed: make(chan struct{}), kick: make(chan struct{}, 1), followers: make(chan struct{}, maxFollowers)}
	n.runner = cfg.Runner
	if n.runner == nil {
		n.runner = engine.NewClaimOnly(cfg.Now)
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

	n.apiLn, err = net.Listen("tcp", cfg.APIAddr)
	if err != nil {
		return nil, fmt.Errorf("--api %s: %w", cfg.APIAddr, err)
	}
	defer func() {
		if err != nil {
			n.apiLn.Close()
		}
	}()

	gcfg := gossip.Config{
		Name: cfg.Name, BindAddr: cfg.BindAddr, BindPort: cfg.BindPort,
		AdvertiseAddr: cfg.AdvertiseAddr, AdvertisePort: cfg.AdvertisePort,
		Key: cfg.GossipKey, Label: cfg.ClusterLabel, Profile: cfg.Profile, Logger: cfg.Logger.With("node", cfg.Name),
		Now: cfg.Now, DataDir: cfg.DataDir, APIAddr: n.AdvertisedAPI(),
	}
	if cfg.TestHooks {
		gcfg.Drop = n.isDropped
	}
	// Faulted GPUs are marked from the first record on: placement must
	// not use one in the seconds before the first GPU tick.
	gpus, probes := n.withFaults(ctx, n.foreignAdjusted(snap), nil, gossip.ProbeSummary{GPUDriver: snap.Driver, GPUsSimulated: cfg.GPUsSimulated})
	initial := gossip.NodeRecord{
		Version:      gossip.Version{Epoch: id.Epoch},
		API:          n.AdvertisedAPI(),
		Labels:       cfg.Labels,
		GPUs:         gpus,
		AgentVersion: cfg.Version,
		StartedAt:    n.started,
		Probes:       probes,
		Shards:       n.runner.Shards(),
		Runtime:      cfg.RuntimeName,
	}
	if initial.Runtime == "" {
		initial.Runtime = "none"
	}
	n.cluster, err = gossip.New(gcfg, initial)
	if err != nil {
		return nil, err
	}
	// The gossip address is only known once memberlist bound, and with it
	// the last fallback of the advertised API address.
	n.cluster.UpdateLocal(func(r *gossip.NodeRecord) { r.Gossip, r.API = n.cluster.Address(), n.AdvertisedAPI() })

	mux := http.NewServeMux()
	n.routes(mux)
	if cfg.Extra != nil {
		cfg.Extra(n, mux)
	}
	n.api = newHTTPServer(n.guard(mux))
	lctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg.Add(3)
	n.serveWG.Add(1)
	go func() {
		defer n.serveWG.Done()
		if err := n.api.Serve(n.apiLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("HTTP API stopped", "err", err)
		}
	}()
	n.id = id
	go n.joinLoop(lctx, append(slices.Clone(cfg.Join), id.Peers...))
	go n.loop(lctx)
	go n.gpuLoop(lctx)
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
func (n *Node) AdvertisedAPI() string {
	host, port, err := net.SplitHostPort(n.APIAddr())
	if err != nil {
		return n.APIAddr()
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

// GossipAddr is the address peers dial for gossip.
func (n *Node) GossipAddr() string { return n.cluster.Address() }

// Cluster exposes the gossip state (read-mostly) to handlers in other
// packages, such as MCP.
func (n *Node) Cluster() *gossip.Cluster { return n.cluster }

// Plan returns the last plan this node computed and the view it used.
func (n *Node) Plan() (placement.Plan, placement.View) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.plan, n.view
}

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

// joinLoop joins the given peers, retrying with exponential backoff until
// one answers, so nodes can start in any order. Later, it keeps dialling
// members it believes dead: after a partition heals memberlist alone would
// stop talking to the other side once its gossip-to-the-dead window passed.
func (n *Node) joinLoop(ctx context.Context, peers []string) {
	defer n.wg.Done()
	peers = dedupe(peers, n.cluster.Address())
	backoff := 250 * time.Millisecond
	warned := false
	if len(peers) == 0 {
		n.settle("no peers to join: this node starts the cluster")
	}
	giveUp := time.Now().Add(settleTimeout)
	for len(peers) > 0 {
		num, err := n.cluster.Join(peers)
		if err == nil {
			n.log.Info("joined cluster", "contacted", num, "members", n.cluster.NumMembers())
			n.settle("joined")
			break
		}
		if time.Now().After(giveUp) {
			n.settle("no peer answered within " + settleTimeout.String() + "; acting on what this node knows")
		}
		if !warned {
			n.log.Warn("--join: no peer answered yet; retrying in the background", "peers", peers, "err", err)
			warned = true
		}
		if !clock.Sleep(ctx, backoff) {
			return
		}
		backoff = min(backoff*2, 30*time.Second)
	}
	tick := time.NewTicker(n.reconnectInterval())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// Dead members are dialled at once, not one after another: each
		// unanswered dial takes memberlist's TCP timeout, and a stop waits
		// for this loop.
		var wg sync.WaitGroup
		for _, m := range n.cluster.Members() {
			if m.State != gossip.StateDead || m.Address == "" || n.cfg.Now().Sub(m.Since) > reconnectFor {
				continue
			}
			wg.Go(func() {
				if ctx.Err() != nil {
					return
				}
				// name/addr: memberlist then knows whom it dials, and a
				// node it would refuse (a partition rule) is not dialled.
				if _, err := n.cluster.Join([]string{m.Name + "/" + m.Address}); err == nil {
					n.log.Info("reconnected to a member believed dead", "member", m.Name)
				}
			})
		}
		wg.Wait()
		n.rememberPeers()
	}
}

// reconnectFor bounds how long a dead member is dialled again: long enough
// for a partition to heal or a machine to be repaired (Serf's reconnect
// timeout is the same day), not forever for a node that was retired.
const reconnectFor = 24 * time.Hour

// settleTimeout bounds how long a node that cannot reach any peer waits
// before it starts and stops engines on its own view.
const settleTimeout = 10 * time.Second

// settle lets the engines act on the plan. Until the node has exchanged
// state with a peer its view is partial (after a restart it may not even
// know the other nodes), and a plan from a partial view would start
// duplicates of shards that run elsewhere.
func (n *Node) settle(why string) {
	if s, ok := n.runner.(settler); ok {
		if n.settled.CompareAndSwap(false, true) {
			n.log.Info("engines may now follow the plan", "why", why)
			s.Settle()
			n.poke()
		}
	}
}

func (n *Node) poke() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

func (n *Node) reconnectInterval() time.Duration {
	if n.cfg.Profile.Name == "local" {
		return time.Second
	}
	return 10 * time.Second
}

// loop is the control loop: on every gossip or engine change, and on a
// tick, it recomputes the plan and reconciles this node's engines; on the
// renew tick it renews this node's leases.
func (n *Node) loop(ctx context.Context) {
	defer n.wg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	renew := time.NewTicker(n.cfg.LeaseTTL / 3)
	defer renew.Stop()
	for {
		if ctx.Err() != nil {
			return
		}
		n.reconcile(ctx)
		select {
		case <-ctx.Done():
			return
		case <-n.cluster.Changes():
		case <-n.runner.Changes():
		case <-n.kick:
		case <-tick.C:
		case <-renew.C:
			n.cluster.Renew()
		}
	}
}

func (n *Node) reconcile(ctx context.Context) {
	start := time.Now()
	view := BuildView(n.cluster.Members(), n.cluster.Deployments(), n.cfg.Now(), n.cfg.LeaseTTL)
	plan := placement.Compute(view)
	specs := map[string]placement.Deployment{}
	for _, d := range view.Deployments {
		specs[d.Name] = d.WithDefaults()
	}
	var mine []engine.Desired
	for _, a := range plan.Assignments {
		if a.Node == n.cfg.Name {
			mine = append(mine, engine.Desired{Assignment: a, Spec: specs[a.Deployment]})
		}
	}
	n.runner.Reconcile(ctx, mine)
	shards := n.runner.Shards()
	if n.shardsChanged(shards) {
		n.cluster.UpdateLocal(func(r *gossip.NodeRecord) { r.Shards = shards })
	}
	n.mu.Lock()
	n.plan, n.view, n.planAt = plan, view, n.cfg.Now()
	n.reconDur = time.Since(start)
	n.mu.Unlock()
}

// loadPublishInterval spaces record updates that only carry new engine
// load: every change of content is a full record sent to the cluster, and
// load changes at every scrape.
const loadPublishInterval = 15 * time.Second

// shardsChanged says whether this node's record must be republished:
// always when anything but load changed, and for load alone at most every
// loadPublishInterval.
func (n *Node) shardsChanged(cur []gossip.ShardRecord) bool {
	old := n.cluster.Local().Shards
	if reflect.DeepEqual(cur, old) {
		return false
	}
	if len(cur) == len(old) {
		same := true
		for i := range cur {
			a, b := cur[i], old[i]
			a.Load, b.Load = gossip.ShardLoad{}, gossip.ShardLoad{}
			if !reflect.DeepEqual(a, b) {
				same = false
				break
			}
		}
		if same && n.cfg.Now().Sub(n.loadPublished) < loadPublishInterval {
			return false
		}
	}
	n.loadPublished = n.cfg.Now()
	return true
}

// ReconcileDuration is how long the last reconcile pass took.
func (n *Node) ReconcileDuration() time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.reconDur
}

func (n *Node) gpuLoop(ctx context.Context) {
	defer n.wg.Done()
	tick := time.NewTicker(n.cfg.GPUInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		snap, err := n.cfg.GPUs.Discover(ctx)
		if err != nil {
			n.log.Warn("GPU re-read failed; keeping the last reading", "err", err)
			continue
		}
		local := n.cluster.Local()
		gpus, probes := n.withFaults(ctx, n.foreignAdjusted(snap), local.GPUs, local.Probes)
		n.mu.Lock()
		n.gpuSnap = snap
		n.mu.Unlock()
		if gpuChanged(n.cluster.Local().GPUs, gpus) || probes != n.cluster.Local().Probes {
			n.cluster.UpdateLocal(func(r *gossip.NodeRecord) { r.GPUs, r.Probes = gpus, probes })
		}
	}
}

// withFaults marks the GPUs with recent driver faults and updates the
// fault counts in probes. When the kernel log cannot be read this time, the
// marks of the last reading (prev) stay: a read error must not make a
// faulting GPU placeable again.
func (n *Node) withFaults(ctx context.Context, gpus, prev []placement.GPU, probes gossip.ProbeSummary) ([]placement.GPU, gossip.ProbeSummary) {
	if n.cfg.DriverFaults == nil || n.cfg.GPUsSimulated {
		return gpus, probes
	}
	f, err := n.cfg.DriverFaults(ctx)
	if err != nil {
		n.log.Warn("reading driver faults failed; keeping the last fault marks", "err", err)
		for i := range gpus {
			for _, p := range prev {
				if p.UUID == gpus[i].UUID && p.Faulted {
					gpus[i].Faulted = true
				}
			}
		}
		return gpus, probes
	}
	gpus = host.MarkFaulted(gpus, f, n.cfg.Now())
	probes.DriverFaultsRecent, probes.DriverFaultsBoot = f.XidRecent, f.XidTotal
	probes.LastDriverFault = ""
	if f.NewestXid != nil {
		probes.LastDriverFault = f.NewestXid.Message
	}
	return gpus, probes
}

// GPUSnapshot is the last GPU reading.
func (n *Node) GPUSnapshot() gpu.Snapshot {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.gpuSnap
}

func (n *Node) foreignAdjusted(s gpu.Snapshot) []placement.GPU {
	own := map[int]bool{}
	for _, p := range n.runner.OwnPIDs() {
		own[p] = true
	}
	return gpu.ForeignMemory(s, own)
}

// gpuChanged ignores memory churn under 256 MiB: re-gossiping every
// allocator wobble would flood the cluster for no placement decision.
func gpuChanged(old, cur []placement.GPU) bool {
	if len(old) != len(cur) {
		return true
	}
	const q = 256 << 20
	for i := range old {
		a, b := old[i], cur[i]
		if a.UUID != b.UUID || a.Faulted != b.Faulted || a.MIG != b.MIG || a.MemoryTotal != b.MemoryTotal ||
			a.MemoryUsed/q != b.MemoryUsed/q || a.MemoryForeign/q != b.MemoryForeign/q {
			return true
		}
	}
	return false
}

// identity is what a node remembers across restarts.
type identity struct {
	Name  string   `json:"name"`
	Epoch int64    `json:"epoch"`
	Peers []string `json:"peers,omitempty"`
}

// loadIdentity reads node.json, checks the name, and bumps the boot epoch
// so this run's records are newer than any the cluster still holds from the
// last run, even if the clock went backwards in between.
func loadIdentity(dir, name string, now func() time.Time) (identity, error) {
	p := filepath.Join(dir, "node.json")
	var id identity
	b, err := os.ReadFile(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return id, fmt.Errorf("--data-dir: read %s: %w", p, err)
	default:
		if err := json.Unmarshal(b, &id); err != nil {
			return id, fmt.Errorf("--data-dir: %s is corrupt (%v); move it aside to start as a new node", p, err)
		}
		if id.Name != "" && id.Name != name {
			return id, fmt.Errorf("--name %q: the data dir %s belongs to node %q; use that name or another --data-dir", name, dir, id.Name)
		}
	}
	id.Name = name
	id.Epoch = max(id.Epoch+1, now().UnixNano())
	out, _ := json.MarshalIndent(id, "", "  ")
	if err := atomicfile.Write(p, out, 0o600); err != nil {
		return id, fmt.Errorf("--data-dir: %w", err)
	}
	return id, nil
}

// rememberPeers saves the gossip addresses of live members, so a restart
// finds the cluster without --join.
func (n *Node) rememberPeers() {
	var peers []string
	for _, m := range n.cluster.Members() {
		if m.Name != n.cfg.Name && m.State == gossip.StateAlive && m.Address != "" {
			peers = append(peers, m.Address)
		}
	}
	// Only the join loop calls this, so n.id needs no lock.
	if len(peers) == 0 || slices.Equal(n.id.Peers, peers) {
		return
	}
	n.id.Peers = peers
	out, _ := json.MarshalIndent(n.id, "", "  ")
	if err := atomicfile.Write(filepath.Join(n.cfg.DataDir, "node.json"), out, 0o600); err != nil {
		n.log.Warn("remember peers", "err", err)
	}
}

// ValidateJoin checks a --join value without contacting it.
func ValidateJoin(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return fmt.Errorf("--join %q: want host:port, e.g. 10.0.0.2:7946", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("--join %q: port must be 1-65535", addr)
	}
	// A name that does not resolve is a typo, not a peer that is still
	// booting: fail now. An address that resolves but does not answer is
	// retried in the background.
	if net.ParseIP(host) == nil {
		if _, err := net.LookupHost(host); err != nil {
			return fmt.Errorf("--join %q: host does not resolve: %v", addr, err)
		}
	}
	return nil
}

func dedupe(peers []string, self string) []string {
	seen := map[string]bool{self: true}
	var out []string
	for _, p := range peers {
		if p = strings.TrimSpace(p); p != "" && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
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
