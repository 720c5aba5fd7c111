package engine

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/sockets"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/profile"
	"github.com/llmgw/llmgw/supervisor/runtime"
	"github.com/llmgw/llmgw/supervisor/shardstate"
)

// Config configures the engines of one node.
type Config struct {
	Node    string
	Runtime runtime.Runtime
	// DataDir holds shards/ (state files) and logs/ (engine output).
	DataDir datadir.Dir
	// Host is the address other nodes use to reach this node's engines.
	Host string
	// Self is the llmgw binary, for the fake engine profile.
	Self       string
	WeightsDir string
	// CacheDir holds the engines' compile caches (vLLM's torch.compile
	// cache, inductor's and Triton's kernels), kept across restarts and bind-mounted into
	// containers like WeightsDir. Default: <data dir>/cache/engines.
	CacheDir string
	// GPUFree reads the free memory of the GPUs named by index, just
	// before an engine starts on them (profile.Inputs.GPUFree: SGLang's
	// memory flag is a fraction of it). Nil, or SimulatedGPUs: unknown.
	GPUFree func(ctx context.Context, indices []int) ([]uint64, error)
	// RDMADevices lists the node's usable RDMA devices (mlx5_0, ...) for
	// a gang member's start: its container gets the device nodes and its
	// collectives the devices' names. Nil: none.
	RDMADevices func(ctx context.Context) []string
	// Ports is the range engine ports are taken from.
	PortMin, PortMax int
	// GPUs returns this node's GPUs (UUIDs for CDI, memory for the
	// engine's memory fraction).
	GPUs func() []placement.GPU
	// SimulatedGPUs: the GPUs do not exist, so no CDI devices are asked for.
	SimulatedGPUs bool
	// Grace is how long a stopping engine gets between SIGTERM and SIGKILL.
	Grace time.Duration
	// Poll is how often each engine is checked.
	Poll time.Duration
	// BackoffMin and BackoffMax bound the restart delay of a crashing
	// engine; it doubles with each crash in a row.
	BackoffMin, BackoffMax time.Duration
	// FailingAfter is the number of crashes in a row after which the shard
	// is reported failing, so placement may move it.
	FailingAfter int
	// DrainDelay is how long an engine that serves keeps serving after it
	// is told to stop (no longer planned here), before SIGTERM: its record
	// says "stopping" at once, and every node, and every router reading
	// one, must learn that before the engine stops answering. 0: 1 s.
	DrainDelay time.Duration
	// DrainMax bounds how long after DrainDelay a stopping engine may keep
	// requests in hand (running or waiting, on its /metrics) before it is
	// stopped anyway. 0: 30 s.
	DrainMax time.Duration
	// StableAfter is how long an engine must stay ready before its crash
	// count starts over. Running is not enough (a model that loads for two
	// minutes and then runs out of memory is crash-looping), and neither is
	// readiness alone (an engine that serves for a second and dies is too).
	StableAfter time.Duration
	// StartTimeout bounds how long an engine may start without becoming
	// ready and without a sign of progress (its log or the weights dir
	// growing), counted from the end of its image pull, before it counts
	// as a crash: an engine hung in start-up would otherwise hold its
	// shard forever. A deployment's start_timeout wins. 0: 2 h (a 70B
	// model is ~140 GB to download).
	StartTimeout time.Duration
	// Readiness overrides the engine profiles' readiness rule where a
	// field is set (see profile.Readiness): node flags, and tests that
	// cannot wait minutes for a hung engine.
	Readiness profile.Readiness
	// ListenerOwner says which process among pid and its descendants
	// listens on port (sockets.FS.Owner); default: the host's /proc.
	ListenerOwner func(port, pid int) (owner int, found bool, err error)
	// MaxLogBytes caps an engine's log file: past it the file is copied
	// to <log>.1 (one generation) and emptied. 0: 256 MiB.
	MaxLogBytes int64
	// LogCheck is how often log sizes are checked. 0: 30 s.
	LogCheck time.Duration
	// EngineKey gives the API key an engine is started with, from its
	// engine ID (cmd/llmgw derives it from the cluster token with
	// internal/secret.EngineKey). The profile passes it to the engine,
	// which then answers 401 on its API without it; the runner presents it
	// on its readiness probes and load scrapes. Nil, or an empty key: the
	// engine runs without one.
	EngineKey func(engineID string) string
	// LoadInterval is how often a ready engine's /metrics is scraped.
	LoadInterval time.Duration
	Logger       *slog.Logger
	// Clock stamps claims, starts and exits, judges backoffs, stable
	// runs, start timeouts and load scrapes, and makes every wait of the
	// runner (each engine's poll, the drain delay and bound, stop retries,
	// log checks): with a fake one, a test moves it for the runner to
	// poll at all. Default: clock.Real().
	Clock clock.Clock
	HTTP  *http.Client
	// Tracer, when set, traces engine starts and failovers on this node
	// (trace.go), stamped by Clock. Nil: nothing is traced.
	Tracer trace.Tracer
	// OTLPTracesEndpoint, when set, is the OTLP/HTTP URL (ending in
	// /v1/traces) engines that trace themselves send their traces to
	// (profile.Inputs.OTLPTracesEndpoint: vLLM's). A node setting, never
	// part of a spec version.
	OTLPTracesEndpoint string
}

// Runner runs this node's shards as engines through a runtime: it starts
// what the plan gives this node, reports an engine ready only when its
// /health answers and its models list names the served model, restarts
// crashed engines with exponential backoff, and stops what the plan no
// longer gives it. It implements Engines.
//
// Each engine has its own goroutine (watch), so a slow start (an image
// pull, a model load) never holds up the others or the node's control
// loop.
//
// Locks, in the order they are taken: logMu, then mu (which every managed
// engine shares as managed.mu), then ports' own; none is held while
// waiting on the runtime or an engine.
type Runner struct {
	cfg Config
	log *slog.Logger

	// mu guards engines, settled, and the fields of every managed engine
	// (see managed).
	mu      sync.Mutex
	engines map[string]*managed // by engine ID
	// logMu orders log capping with log removal (see logLoop, finish);
	// taken before mu, never while holding it.
	logMu sync.Mutex
	// settled is false until the node has heard the cluster: until then a
	// plan comes from a partial view, and acting on it would start
	// duplicates or stop healthy engines.
	settled bool
	changes chan struct{}

	// ports holds the engines' ports; probe asks the engines how they are
	// (and counts what failed); policy turns what a poll found into an
	// engine's status and backoff; gang is this node as its gangs see it.
	ports *ports
	probe *prober
	// gate lets one engine at a time start on each GPU (gate.go).
	gate   *startGate
	policy restartPolicy
	gang   gangNode

	// quit detaches every watcher without stopping its engine; base is
	// cancelled with it, so a start in progress (an image pull) gives up.
	quit       chan struct{}
	base       context.Context
	cancelBase context.CancelFunc
	once       sync.Once
	wg         sync.WaitGroup
}

// NewRunner reads the shard state files, finds the engines the runtime
// still runs, and adopts them untouched. Engines the runtime runs for this
// node without a state file are adopted from their labels; state files
// whose engine is gone are removed; corrupt state files are reported and
// set aside.
func NewRunner(ctx context.Context, cfg Config) (*Runner, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.HTTP == nil {
		// No client-wide timeout: each probe and scrape is bounded by its
		// profile's probe timeout (a busy vLLM needs more than 2 s).
		cfg.HTTP = &http.Client{}
	}
	if cfg.Poll == 0 {
		cfg.Poll = 500 * time.Millisecond
	}
	if cfg.Grace == 0 {
		cfg.Grace = 10 * time.Second
	}
	if cfg.BackoffMin == 0 {
		cfg.BackoffMin = time.Second
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = time.Minute
	}
	if cfg.FailingAfter == 0 {
		cfg.FailingAfter = 5
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 2 * time.Hour
	}
	if cfg.ListenerOwner == nil {
		cfg.ListenerOwner = sockets.Host().Owner
	}
	if cfg.MaxLogBytes == 0 {
		cfg.MaxLogBytes = 256 << 20
	}
	if cfg.LogCheck == 0 {
		cfg.LogCheck = 30 * time.Second
	}
	if cfg.LoadInterval == 0 {
		cfg.LoadInterval = 5 * time.Second
	}
	if cfg.DrainDelay == 0 {
		cfg.DrainDelay = time.Second
	}
	if cfg.DrainMax == 0 {
		cfg.DrainMax = 30 * time.Second
	}
	if cfg.StableAfter == 0 {
		cfg.StableAfter = time.Minute
	}
	if cfg.PortMin == 0 {
		cfg.PortMin, cfg.PortMax = 8100, 8999
	}
	if cfg.CacheDir == "" {
		cfg.CacheDir = filepath.Join(cfg.DataDir.Root(), "cache", "engines")
	}
	r := &Runner{
		cfg: cfg, log: cfg.Logger.With("component", "runner"),
		engines: map[string]*managed{}, changes: make(chan struct{}, 1), quit: make(chan struct{}),
		ports: newPorts(cfg.Node, cfg.PortMin, cfg.PortMax), policy: newRestartPolicy(cfg), gate: newStartGate(),
	}
	r.probe = newProber(cfg, r.log)
	r.gang = gangNode{name: cfg.Node, host: cfg.Host, clock: cfg.Clock, ports: r.ports}
	r.base, r.cancelBase = context.WithCancel(context.Background())
	// The weights dir too: it is a bind mount's source and the engines'
	// HF_HOME, so it must exist before the first start.
	for _, d := range []string{cfg.DataDir.ShardsDir(), cfg.DataDir.LogsDir(), cfg.CacheDir, cfg.WeightsDir} {
		if d == "" {
			continue
		}
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("runner: %w", err)
		}
	}
	if err := r.adopt(ctx); err != nil {
		return nil, err
	}
	r.wg.Add(1)
	go r.logLoop()
	return r, nil
}

// engineKey is engine id's API key; empty when engines run without keys.
func (c Config) engineKey(id string) string {
	if c.EngineKey == nil {
		return ""
	}
	return c.EngineKey(id)
}

// Settle allows the runner to start and stop engines. Until then it only
// watches what it adopted.
func (r *Runner) Settle() {
	r.mu.Lock()
	r.settled = true
	r.mu.Unlock()
}

// Reconcile implements Engines.
func (r *Runner) Reconcile(ctx context.Context, desired []Desired) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Not settled: the plan comes from a partial view. Closed or
	// cancelled: the agent is going away, and its last view (in which it
	// may already be leaving) must not stop engines.
	if !r.settled || ctx.Err() != nil || r.base.Err() != nil {
		return
	}
	want := map[string]Desired{}
	for _, d := range desired {
		want[placement.EngineID(d.ShardID, d.SpecVersion)] = d
	}
	for id, e := range r.engines {
		if d, ok := want[id]; ok && !e.orphan {
			e.desired, e.planned = d, true
			if e.state.Spec.Deployment == "" {
				e.state.Spec.Deployment = d.Deployment
			}
			continue
		}
		if e.status != gossip.ShardStopping {
			e.status = gossip.ShardStopping
			e.drain, e.ready = e.ready, false
			why := "no longer planned here"
			if e.orphan {
				why = "no state file (orphan)"
			}
			r.log.Info("stopping engine: "+why, "shard", e.state.ShardID, "engine", id)
			e.stop()
		}
	}
	for id, d := range want {
		if _, ok := r.engines[id]; ok {
			continue
		}
		port, err := r.ports.alloc(id)
		if err != nil {
			r.log.Error("cannot start shard", "shard", d.ShardID, "err", err)
			continue
		}
		kvPort := 0
		if d.Role != "" && !(d.Spec.Engine == "sglang" && d.Role == placement.RoleDecode) {
			// One port: vLLM's NIXL handshake listener runs once, in the
			// scheduler, for every TP rank, at VLLM_NIXL_SIDE_CHANNEL_PORT
			// plus the data-parallel index, 0 here (NixlConnectorScheduler
			// in vllm/distributed/kv_transfer/kv_connector/v1/
			// nixl_connector.py); an SGLang prefill serves its bootstrap
			// port, and an SGLang decode listens on none.
			if kvPort, err = r.ports.alloc(id); err != nil {
				r.ports.release(id)
				r.log.Error("cannot start shard: no ports for its KV transfer", "shard", d.ShardID, "err", err)
				continue
			}
		}
		now := r.cfg.Clock.Now()
		cctx, cancel := context.WithCancel(context.Background())
		e := &managed{id: id, mu: &r.mu, changes: r.changes, failover: d.Failover, desired: d, planned: true, status: gossip.ShardStarting, stop: cancel,
			state: shardstate.State{ShardID: d.ShardID, ReplicaID: d.ReplicaID, ClaimStamp: now.UnixNano(), StartedAt: now,
				Spec: shardstate.Spec{Engine: d.Spec.Engine, ServedModelName: d.Spec.Name, Model: d.Spec.Model, Deployment: d.Deployment,
					GPUIndices: d.GPUs, MemoryPerGPU: d.MemoryPerGPU, HTTPPort: port, Role: d.Role, KVPort: kvPort, ReplicaID: d.ReplicaID, SpecVersion: d.SpecVersion, EngineID: id, Runtime: r.cfg.Runtime.Name()}}}
		r.engines[id] = e
		r.wg.Add(1)
		go r.watch(cctx, e, false)
	}
	// No notification: the caller reads Shards() right after this call,
	// and Changes() wakes that same caller, so notifying here would make
	// it reconcile again, forever (a busy loop on every idle node).
	// Watchers notify when an engine's state really changes.
}

// Reclaim claims every shard held here afresh, stamped now: this node's
// leases lapsed (its agent was away or frozen longer than the lease TTL),
// so the cluster may have started replacements, and the copy that stayed
// valid must win a tie between two serving copies (see placement's
// duplicate rule). Orphans claim nothing and keep nothing.
func (r *Runner) Reclaim(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.engines {
		if e.orphan {
			continue
		}
		e.state.ClaimStamp = now.UnixNano()
		if err := shardstate.Save(r.cfg.DataDir.ShardsDir(), e.state); err != nil {
			r.log.Error("save shard state", "shard", e.state.ShardID, "err", err)
		}
	}
	notify(r.changes)
}

// Shards implements supervisor.Runner.
func (r *Runner) Shards() []gossip.ShardRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]gossip.ShardRecord, 0, len(r.engines))
	for _, e := range r.engines {
		if e.orphan {
			continue // claims nothing; see managed.orphan
		}
		st := e.state
		rec := gossip.ShardRecord{
			ShardID: st.ShardID, ReplicaID: st.ReplicaID, Deployment: e.desired.Deployment, Role: st.Spec.Role, KVPort: st.Spec.KVPort, SpecVersion: st.Spec.SpecVersion,
			GPUs: st.Spec.GPUIndices, MemoryPerGPU: e.desired.MemoryPerGPU, Status: e.status, Ready: e.ready,
			ClaimStamp: st.ClaimStamp, Failing: e.failing, PID: st.PID, Container: st.Spec.ContainerID,
			Restarts: st.Restarts, LastExit: st.LastExitCode, StartedAt: st.StartedAt, Load: e.load, Error: e.startErr,
			Note: e.note, NoteAt: e.noteAt, PullMs: e.took.pull.Milliseconds(), LoadMs: e.took.load.Milliseconds(),
		}
		if rec.Deployment == "" {
			rec.Deployment = st.Spec.Deployment
		}
		if rec.Note == "" && e.ready {
			rec.Note, rec.NoteAt = e.missingNoteLocked(), e.missingAt
		}
		if rec.Note == "" && e.ready && !st.Spec.Private && e.desired.ClusterVersion >= protocol.V4 {
			// Nothing restarts a healthy engine for it; the operator
			// learns why its port is still open to other hosts.
			rec.Note, rec.NoteAt = notePublic, st.StartedAt
			if st.Spec.Role != "" {
				rec.Note = notePublicRole
			}
		}
		rec.Adapters, rec.AdapterErrors = e.adapterRecordLocked()
		rec.Gang = r.gang.recordLocked(e)
		// Only rank 0 of a gang serves HTTP; the other ranks publish no URL.
		if st.Spec.HTTPPort > 0 && (rec.Gang == nil || rec.Gang.Rank == 0) {
			rec.URL = "http://" + net.JoinHostPort(r.cfg.Host, strconv.Itoa(st.Spec.HTTPPort))
			rec.Private = st.Spec.Private
		}
		out = append(out, rec)
	}
	SortShards(out)
	return out
}

// notePublic is the note of a ready engine that still listens on every
// address in a cluster at protocol V4: it was started before.
const notePublic = "listens on every address (started before cluster version 4): its next start listens on loopback only"

// notePublicRole is the note of an SGLang prefill or decode engine, which
// listens on every address by design: its bootstrap server binds the
// engine's host, and the other role's nodes must reach it.
const notePublicRole = "listens on every address: an SGLang prefill/decode engine's bootstrap server binds its host (its API still needs its key)"

// RuntimeName names the runtime engines run in.
func (r *Runner) RuntimeName() string { return r.cfg.Runtime.Name() }

// ScrapeErrors counts failed engine /metrics scrapes.
func (r *Runner) ScrapeErrors() uint64 { return r.probe.scrapeErrors.Load() }

// MissingMetrics counts, by metric name, the engines that did not export a
// metric their profile reads (each engine counted once per metric).
func (r *Runner) MissingMetrics() map[string]uint64 { return r.probe.missing.snapshot() }

// Unroutable counts ready engines that left routing by the readiness rule
// (judge.go): probes failing and counters frozen.
func (r *Runner) Unroutable() uint64 { return r.probe.unroutable.Load() }

// HungRestarts counts engines restarted because they stayed unroutable
// without progress for their profile's HungRestart.
func (r *Runner) HungRestarts() uint64 { return r.probe.hungRestarts.Load() }

// Changes implements Engines.
func (r *Runner) Changes() <-chan struct{} { return r.changes }

// OwnPIDs implements Engines.
func (r *Runner) OwnPIDs() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var pids []int
	for _, e := range r.engines {
		// An orphan's GPUs are not claimed by any shard of ours, so its
		// memory must count as foreign until it is stopped.
		if e.state.PID > 0 && !e.orphan {
			pids = append(pids, e.state.PID)
		}
	}
	return pids
}

// Close stops watching engines without stopping them: they keep serving
// for the next agent to adopt.
func (r *Runner) Close() {
	r.once.Do(func() {
		r.cancelBase()
		close(r.quit)
	})
	r.wg.Wait()
}

// Local reports the HTTP port and the metrics path of engine id when this
// runner holds it (an orphan included: it serves until stopped), for the
// node's relay, which reaches it on 127.0.0.1.
func (r *Runner) Local(id string) (port int, metricsPath string, ok bool) {
	r.mu.Lock()
	e := r.engines[id]
	r.mu.Unlock()
	if e == nil {
		return 0, "", false
	}
	e.mu.Lock()
	port = e.state.Spec.HTTPPort
	e.mu.Unlock()
	prof, err := e.profile()
	if err != nil || port <= 0 {
		return 0, "", false
	}
	return port, prof.MetricsPath, true
}
