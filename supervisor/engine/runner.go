package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/probes/load"
	"github.com/llmgw/llmgw/probes/sockets"
	"github.com/llmgw/llmgw/supervisor/profile"
	"github.com/llmgw/llmgw/supervisor/runtime"
	"github.com/llmgw/llmgw/supervisor/shardstate"
)

// Config configures the engines of one node.
type Config struct {
	Node    string
	Runtime runtime.Runtime
	// DataDir holds shards/ (state files) and logs/ (engine output).
	DataDir string
	// Host is the address other nodes use to reach this node's engines.
	Host string
	// Self is the llmgw binary, for the fake engine profile.
	Self       string
	WeightsDir string
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
	// StableAfter is how long an engine must stay ready before its crash
	// count starts over. Running is not enough (a model that loads for two
	// minutes and then runs out of memory is crash-looping), and neither is
	// readiness alone (an engine that serves for a second and dies is too).
	StableAfter time.Duration
	// StartTimeout bounds how long an engine may run without becoming
	// ready (loading weights included) before it counts as a crash. An
	// engine hung in start-up would otherwise hold its shard forever.
	StartTimeout time.Duration
	// ListenerOwner says which process among pid and its descendants
	// listens on port (sockets.FS.Owner); default: the host's /proc.
	ListenerOwner func(port, pid int) (owner int, found bool, err error)
	// MaxLogBytes caps an engine's log file: past it the file is copied
	// to <log>.1 (one generation) and emptied. 0: 256 MiB.
	MaxLogBytes int64
	// LogCheck is how often log sizes are checked. 0: 30 s.
	LogCheck time.Duration
	// LoadInterval is how often a ready engine's /metrics is scraped.
	LoadInterval time.Duration
	Logger       *slog.Logger
	Now          func() time.Time
	HTTP         *http.Client
}

// statusTimeout bounds one runtime status call: a hung containerd must not
// freeze an engine's watcher (nor Close, which waits for watchers).
const statusTimeout = 10 * time.Second

// Runner runs this node's shards as engines through a runtime: it starts
// what the plan gives this node, reports an engine ready only when its
// /health answers and its models list names the served model, restarts
// crashed engines with exponential backoff, and stops what the plan no
// longer gives it. It implements Engines.
//
// Each engine has its own goroutine, so a slow start (an image pull, a
// model load) never holds up the others or the node's control loop.
type Runner struct {
	cfg      Config
	log      *slog.Logger
	stateDir string
	logDir   string

	mu      sync.Mutex
	engines map[string]*engine // by engine ID
	// logMu orders log capping with log removal (see logLoop, finish);
	// taken before mu, never while holding it.
	logMu sync.Mutex
	ports map[int]string
	// settled is false until the node has heard the cluster: until then a
	// plan comes from a partial view, and acting on it would start
	// duplicates or stop healthy engines.
	settled bool
	changes chan struct{}
	tracker *load.Tracker
	// scrapeErrors counts failed /metrics scrapes, for our own metrics.
	scrapeErrors atomic.Uint64
	// quit detaches every watcher without stopping its engine; base is
	// cancelled with it, so a start in progress (an image pull) gives up.
	quit       chan struct{}
	base       context.Context
	cancelBase context.CancelFunc
	once       sync.Once
	wg         sync.WaitGroup
}

// engine is one shard's engine on this node. Fields under Runner.mu.
type engine struct {
	id      string
	desired Desired
	state   shardstate.State
	status  gossip.ShardStatus
	ready   bool
	failing bool
	crashes int // crashes in a row since the engine last ran stably
	// readySince is when the current run became ready (zero: not ready);
	// StableAfter of it resets crashes.
	readySince time.Time
	// planned: the plan has given this engine its spec. An adopted
	// engine's state file holds only enough to watch it, so a crash
	// before the first plan waits for one instead of restarting it with a
	// partial command (an orphan is never planned, so never restarted).
	planned bool
	// portForeign: another process answers on the engine's port (logged
	// once per episode; see ownsPort).
	portForeign bool
	// startErr is why the last start failed; cleared by a start that works.
	startErr string
	// orphan: found running with our labels but no state file. Without
	// the file its port, GPUs and claim are unknown, so it is stopped once
	// the node settles (the plan then starts the shard afresh if wanted).
	orphan bool
	// prof is the engine's profile, resolved once (profile.Lookup builds
	// the whole table, and readiness asks for it every poll), and scraper
	// reads its /metrics by the profile's metric names.
	prof    *profile.Profile
	scraper *load.Scraper
	load    gossip.ShardLoad
	// scrapedAt is when load was last read.
	scrapedAt time.Time
	stop      context.CancelFunc
	done      chan struct{}
}

// NewRunner reads the shard state files, finds the engines the runtime
// still runs, and adopts them untouched. Engines the runtime runs for this
// node without a state file are adopted from their labels; state files
// whose engine is gone are removed; corrupt state files are reported and
// set aside.
func NewRunner(ctx context.Context, cfg Config) (*Runner, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 2 * time.Second}
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
		cfg.StartTimeout = 30 * time.Minute
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
	if cfg.StableAfter == 0 {
		cfg.StableAfter = time.Minute
	}
	if cfg.PortMin == 0 {
		cfg.PortMin, cfg.PortMax = 8100, 8999
	}
	r := &Runner{
		cfg: cfg, log: cfg.Logger.With("component", "runner"),
		stateDir: filepath.Join(cfg.DataDir, "shards"), logDir: filepath.Join(cfg.DataDir, "logs"),
		engines: map[string]*engine{}, ports: map[int]string{}, changes: make(chan struct{}, 1),
		quit: make(chan struct{}), tracker: load.NewTracker(),
	}
	r.base, r.cancelBase = context.WithCancel(context.Background())
	for _, d := range []string{r.stateDir, r.logDir} {
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

// EngineID names one (shard, spec version) engine on a node.
func EngineID(shard, spec string) string { return shard + "-" + spec }

func (r *Runner) adopt(ctx context.Context) error {
	states, bad := shardstate.Load(r.stateDir)
	for _, b := range bad {
		r.log.Error("shard state file unusable", "err", b.Error()) // says whether it was moved aside
	}
	running, err := r.cfg.Runtime.List(ctx, r.cfg.Node)
	if err != nil {
		return fmt.Errorf("runner: list %s engines: %w", r.cfg.Runtime.Name(), err)
	}
	live := map[string]runtime.Engine{}
	for _, e := range running {
		live[e.ID] = e
	}
	for _, st := range states {
		id := st.Spec.EngineID
		e, ok := live[id]
		// Unknown (a shim not answering, containerd restarting) is not
		// gone: adopt it and let the watcher look again.
		if !ok || e.State == runtime.StateExited {
			r.log.Info("engine of a shard state file is gone; removing the file", "shard", st.ShardID, "engine", id)
			if ok {
				_ = r.cfg.Runtime.Stop(ctx, id, 0)
			}
			_ = shardstate.Remove(r.stateDir, shardstate.FileID(st))
			continue
		}
		delete(live, id)
		r.track(id, st, e.PID, false)
		r.log.Info("adopted running engine", "shard", st.ShardID, "engine", id, "pid", e.PID)
	}
	for id, e := range live {
		// Ours by label but without a state file: the agent died between
		// starting it and writing the file, or the file was corrupt. It is
		// stopped once the node settles unless the plan wants it.
		st := shardstate.State{ShardID: e.Labels[runtime.LabelShard], PID: e.PID, StartedAt: e.StartedAt,
			Spec: shardstate.Spec{EngineID: id, SpecVersion: e.Labels[runtime.LabelSpec], Runtime: r.cfg.Runtime.Name()}}
		if e.State == runtime.StateExited || st.ShardID == "" {
			r.log.Info("removing an exited or unlabelled engine of ours", "engine", id)
			_ = r.cfg.Runtime.Stop(ctx, id, 0)
			continue
		}
		r.track(id, st, e.PID, true)
		r.log.Warn("found a running engine without a state file; it is stopped once the node has settled", "engine", id)
	}
	return nil
}

// track registers an adopted engine and starts watching it.
func (r *Runner) track(id string, st shardstate.State, pid int, orphan bool) {
	ctx, cancel := context.WithCancel(context.Background())
	// Until the plan says more, the state file is the spec: enough to
	// probe readiness and, after a crash, to start the engine again.
	spec := placement.Deployment{Name: st.Spec.ServedModelName, Model: st.Spec.Model, Engine: st.Spec.Engine, Image: st.Spec.Image}
	e := &engine{id: id, state: st, status: gossip.ShardStarting, stop: cancel, done: make(chan struct{}), orphan: orphan,
		desired: Desired{Assignment: placement.Assignment{ShardID: st.ShardID, ReplicaID: st.ReplicaID, Deployment: st.Spec.Deployment,
			SpecVersion: st.Spec.SpecVersion, GPUs: st.Spec.GPUIndices, MemoryPerGPU: st.Spec.MemoryPerGPU}, Spec: spec}}
	e.state.PID = pid
	r.mu.Lock()
	r.engines[id] = e
	if st.Spec.HTTPPort > 0 {
		r.ports[st.Spec.HTTPPort] = id
	}
	r.mu.Unlock()
	r.wg.Add(1)
	go r.watch(ctx, e, true)
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
		want[EngineID(d.ShardID, d.SpecVersion)] = d
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
			e.ready = false
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
		port, err := r.allocPort(id)
		if err != nil {
			r.log.Error("cannot start shard", "shard", d.ShardID, "err", err)
			continue
		}
		now := r.cfg.Now()
		cctx, cancel := context.WithCancel(context.Background())
		e := &engine{id: id, desired: d, planned: true, status: gossip.ShardStarting, stop: cancel, done: make(chan struct{}),
			state: shardstate.State{ShardID: d.ShardID, ReplicaID: d.ReplicaID, ClaimStamp: now.UnixNano(), StartedAt: now,
				Spec: shardstate.Spec{Engine: d.Spec.Engine, ServedModelName: d.Spec.Name, Model: d.Spec.Model, Deployment: d.Deployment,
					GPUIndices: d.GPUs, MemoryPerGPU: d.MemoryPerGPU, HTTPPort: port, ReplicaID: d.ReplicaID, SpecVersion: d.SpecVersion, EngineID: id, Runtime: r.cfg.Runtime.Name()}}}
		r.engines[id] = e
		r.wg.Add(1)
		go r.watch(cctx, e, false)
	}
	// No notification: the caller reads Shards() right after this call,
	// and Changes() wakes that same caller, so notifying here would make
	// it reconcile again, forever (a busy loop on every idle node).
	// Watchers notify when an engine's state really changes.
}

func (r *Runner) notifyLocked() {
	select {
	case r.changes <- struct{}{}:
	default:
	}
}

// allocPort takes a port from the range that nothing on this host listens
// on. Checking by binding matters when several nodes share one host (the
// demo, the scenarios).
//
// The scan starts at an offset derived from the node name, so agents that
// share a host rarely race for the same port; when they do, the loser finds
// the port taken at its next start and moves (see start).
func (r *Runner) allocPort(id string) (int, error) {
	span := r.cfg.PortMax - r.cfg.PortMin + 1
	h := fnv.New32a()
	h.Write([]byte(r.cfg.Node))
	off := int(h.Sum32() % uint32(span))
	for i := 0; i < span; i++ {
		p := r.cfg.PortMin + (off+i)%span
		if _, used := r.ports[p]; used || !portFree(p) {
			continue
		}
		r.ports[p] = id
		return p, nil
	}
	return 0, fmt.Errorf("no free engine port in %d-%d", r.cfg.PortMin, r.cfg.PortMax)
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("0.0.0.0", strconv.Itoa(p)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// ensurePort moves an engine that is about to (re)start to a free port when
// something else took its port meanwhile.
func (r *Runner) ensurePort(e *engine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := e.state.Spec.HTTPPort
	if old > 0 && portFree(old) {
		return
	}
	delete(r.ports, old)
	p, err := r.allocPort(e.id)
	if err != nil {
		r.log.Error("no free port for engine", "engine", e.id, "err", err)
		return
	}
	e.state.Spec.HTTPPort = p
	r.log.Warn("engine port taken by another process; moving", "engine", e.id, "from", old, "to", p)
}

// watch drives one engine: start it (unless adopted), then check it every
// poll: runtime state, then readiness. A crash is recorded and the engine
// restarted after a backoff that doubles per crash in a row. When ctx ends
// the engine is stopped and forgotten.
func (r *Runner) watch(ctx context.Context, e *engine, adopted bool) {
	defer r.wg.Done()
	defer close(e.done)
	started := adopted
	var retryAt time.Time
	// attemptAt is when the current start attempt began; everReady whether
	// it became ready since; unknowns counts "unknown" states in a row.
	attemptAt, everReady, unknowns := r.cfg.Now(), false, 0
	tick := time.NewTicker(r.cfg.Poll)
	defer tick.Stop()
	for {
		if ctx.Err() != nil {
			r.finish(e)
			return
		}
		if !started && !r.cfg.Now().Before(retryAt) && r.isPlanned(e) {
			attemptAt, everReady = r.cfg.Now(), false
			if err := r.start(ctx, e); err != nil {
				if r.base.Err() != nil {
					return // the agent is closing: not a crash
				}
				if ctx.Err() != nil {
					continue // no longer wanted: not a crash; the loop's top stops it
				}
				r.log.Error("engine start failed", "shard", e.state.ShardID, "err", err)
				r.mu.Lock()
				e.startErr = clipError(err.Error(), 300)
				r.mu.Unlock()
				retryAt = r.crashed(e, nil)
			} else {
				started = true
			}
		}
		if started {
			sctx, cancel := context.WithTimeout(ctx, statusTimeout)
			st, err := r.cfg.Runtime.Status(sctx, e.id)
			cancel()
			switch {
			case ctx.Err() != nil:
			case err != nil && !errors.Is(err, runtime.ErrNotFound):
				// The runtime cannot say (containerd down, a shim hung): the
				// engine itself still can. A dead one stops being ready, so
				// its lease is no longer renewed and nothing routes to it.
				r.log.Warn("engine status unknown; judging by readiness alone", "shard", e.state.ShardID, "err", err)
				r.setReady(e, r.probeReady(ctx, e), 0)
			case err == nil && st.State == runtime.StateUnknown && unknowns < 20:
				// containerd restarting or a shim not answering: look again
				// rather than kill a possibly healthy engine.
				unknowns++
			case err != nil || st.State != runtime.StateRunning:
				code := st.ExitCode
				r.log.Warn("engine exited; restarting after backoff", "shard", e.state.ShardID, "exit_code", code, "crashes_in_a_row", e.crashes+1)
				// Remove the dead engine so its GPUs are free while we wait.
				if err := r.cfg.Runtime.Stop(context.Background(), e.id, 0); err != nil && !errors.Is(err, runtime.ErrNotFound) {
					r.log.Warn("remove exited engine", "shard", e.state.ShardID, "err", err)
				}
				retryAt = r.crashed(e, &code)
				started = false
			default:
				unknowns = 0
				ready := r.probeReady(ctx, e) && r.ownsPort(e, st.PID)
				everReady = everReady || ready
				r.setReady(e, ready, st.PID)
				if ready {
					r.scrapeLoad(ctx, e)
				} else if !everReady && r.cfg.Now().Sub(attemptAt) > r.cfg.StartTimeout {
					r.log.Warn("engine not ready within the start timeout; restarting it", "shard", e.state.ShardID, "timeout", r.cfg.StartTimeout)
					if err := r.cfg.Runtime.Stop(context.Background(), e.id, r.cfg.Grace); err != nil && !errors.Is(err, runtime.ErrNotFound) {
						// Still running: starting it again would clash with
						// itself. Try the stop again at the next poll.
						r.log.Error("stop engine that never became ready", "shard", e.state.ShardID, "err", err)
						break
					}
					retryAt = r.crashed(e, nil)
					started = false
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		case <-r.quit:
			return
		}
	}
}

func (r *Runner) start(engineCtx context.Context, e *engine) error {
	// Runtime calls end when the engine is no longer wanted or when the
	// agent closes the runner.
	ctx, cancel := context.WithCancel(r.base)
	defer cancel()
	stop := context.AfterFunc(engineCtx, cancel)
	defer stop()
	r.ensurePort(e)
	r.mu.Lock()
	d, st := e.desired, e.state
	r.mu.Unlock()
	prof, err := r.profileOf(e)
	if err != nil {
		return err
	}
	in := profile.Inputs{Port: st.Spec.HTTPPort, Self: r.cfg.Self, WeightsDir: r.cfg.WeightsDir, ShardIndex: shardIndex(d)}
	var uuids []string
	if r.cfg.GPUs != nil {
		gpus := r.cfg.GPUs()
		for _, i := range d.GPUs {
			for _, g := range gpus {
				if g.Index == i {
					in.GPUMemoryTotal = g.MemoryTotal
					if !r.cfg.SimulatedGPUs {
						uuids = append(uuids, g.UUID)
					}
				}
			}
		}
	}
	cmd, env, image, err := profile.Resolve(prof, d.Spec, in)
	if err != nil {
		return err
	}
	spec := runtime.EngineSpec{
		ID: e.id, Node: r.cfg.Node, ShardID: d.ShardID, ReplicaID: d.ReplicaID, Deployment: d.Deployment, SpecVersion: d.SpecVersion,
		Image: image, Command: cmd, Env: env, GPUIndices: d.GPUs, GPUUUIDs: uuids, HTTPPort: st.Spec.HTTPPort,
		LogPath: r.logPath(e.id), WeightsDir: r.cfg.WeightsDir,
	}
	st.Spec.Image, st.Spec.Command, st.Spec.GPUUUIDs = image, cmd, uuids
	// Container images are pulled before the engine starts (vLLM's are
	// 12-28 GB; the runtime logs progress). The engine stays "starting"
	// meanwhile, holding its claim.
	if p, ok := r.cfg.Runtime.(interface {
		EnsureImage(ctx context.Context, ref string) error
	}); ok && image != "" {
		if err := p.EnsureImage(ctx, image); err != nil {
			return err
		}
	}
	// The state file goes first: an agent that dies right after Start
	// still finds what it started.
	if err := shardstate.Save(r.stateDir, st); err != nil {
		return err
	}
	eng, err := r.cfg.Runtime.Start(ctx, spec)
	if err != nil {
		return fmt.Errorf("start %s: %w", e.id, err)
	}
	st.PID, st.StartedAt = eng.PID, r.cfg.Now()
	if r.cfg.Runtime.Name() == "containerd" {
		st.Spec.ContainerID = e.id
	}
	if err := shardstate.Save(r.stateDir, st); err != nil {
		r.log.Error("save shard state", "err", err)
	}
	r.mu.Lock()
	e.state = st
	e.readySince = time.Time{}
	e.startErr = ""
	if e.status != gossip.ShardStopping {
		e.status = gossip.ShardStarting
	}
	r.notifyLocked()
	r.mu.Unlock()
	r.log.Info("engine started", "shard", d.ShardID, "engine", e.id, "pid", eng.PID, "port", st.Spec.HTTPPort)
	return nil
}

// crashed records a crash (an exit, a failed start, a start timeout) and
// returns when to try again.
func (r *Runner) crashed(e *engine, code *int) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.cfg.Now()
	if !e.readySince.IsZero() && now.Sub(e.readySince) >= r.cfg.StableAfter {
		e.crashes = 0 // it had served stably: a new story, not a loop
	}
	e.readySince = time.Time{}
	e.crashes++
	e.state.Restarts++
	e.state.LastExitCode = code
	e.state.LastExitAt = now
	e.ready = false
	if e.status != gossip.ShardStopping {
		e.status = gossip.ShardBackoff
	}
	e.failing = e.crashes >= r.cfg.FailingAfter
	_ = shardstate.Save(r.stateDir, e.state)
	r.notifyLocked()
	delay := r.cfg.BackoffMin << min(e.crashes-1, 16)
	return r.cfg.Now().Add(min(delay, r.cfg.BackoffMax))
}

func (r *Runner) setReady(e *engine, ready bool, pid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.status == gossip.ShardStopping {
		return
	}
	status := gossip.ShardStarting
	now := r.cfg.Now()
	if ready {
		status = gossip.ShardReady
		if e.readySince.IsZero() {
			e.readySince = now
		}
		if (e.crashes > 0 || e.failing) && now.Sub(e.readySince) >= r.cfg.StableAfter {
			e.crashes, e.failing = 0, false
			r.notifyLocked()
		}
	} else {
		e.readySince = time.Time{}
	}
	if e.ready != ready || e.status != status || (pid > 0 && e.state.PID != pid) {
		e.ready, e.status = ready, status
		if pid > 0 {
			e.state.PID = pid
		}
		r.notifyLocked()
	}
}

// ownsPort checks, when an engine is about to be believed ready, that the
// answer on its port comes from the engine's own process tree: another
// process there (a stale engine of another agent on this host) would make
// the lease, and the route, point at the wrong model. Once ready, the
// check is not repeated every poll (it scans /proc).
func (r *Runner) ownsPort(e *engine, pid int) bool {
	r.mu.Lock()
	was, port := e.ready, e.state.Spec.HTTPPort
	r.mu.Unlock()
	if was || pid <= 0 || port <= 0 {
		return true
	}
	_, found, err := r.cfg.ListenerOwner(port, pid)
	// An error means nothing to judge by: nothing listens in our network
	// namespace although the port answered (an engine in a namespace of
	// its own), or /proc is not readable.
	foreign := err == nil && !found
	r.mu.Lock()
	if foreign && !e.portForeign {
		r.log.Warn("engine port answered by a process that is not the engine; not ready", "shard", e.state.ShardID, "port", port, "engine_pid", pid)
	}
	e.portForeign = foreign
	r.mu.Unlock()
	return !foreign
}

// clipError keeps an error message short enough for a node record.
func clipError(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// isPlanned reports whether the plan has given e its spec (see
// engine.planned).
func (r *Runner) isPlanned(e *engine) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return e.planned
}

// profileOf returns the engine's profile. The spec version fixes the
// engine kind, so it is looked up once per engine. Adopted engines carry the
// kind from their state file (see track).
func (r *Runner) profileOf(e *engine) (profile.Profile, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.prof == nil {
		p, err := profile.Lookup(e.desired.Spec.Engine)
		if err != nil {
			return profile.Profile{}, err
		}
		e.prof = &p
	}
	return *e.prof, nil
}

// probeReady is the readiness rule: /health answers 200 and the models
// list names the served model.
func (r *Runner) probeReady(ctx context.Context, e *engine) bool {
	r.mu.Lock()
	port, served := e.state.Spec.HTTPPort, e.state.Spec.ServedModelName
	r.mu.Unlock()
	prof, err := r.profileOf(e)
	if err != nil || port == 0 {
		return false
	}
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	ok := func(path string, body *[]byte) bool {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+path, nil)
		resp, err := r.cfg.HTTP.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		if body != nil {
			*body, _ = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		}
		return resp.StatusCode == http.StatusOK
	}
	if !ok(prof.HealthPath, nil) {
		return false
	}
	var body []byte
	if !ok(prof.ModelsPath, &body) {
		return false
	}
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if json.Unmarshal(body, &models) != nil {
		return false
	}
	for _, m := range models.Data {
		if m.ID == served || served == "" {
			return true
		}
	}
	return false
}

// scrapeLoad reads the engine's /metrics every LoadInterval. Rates come
// from counter deltas; the tracker re-baselines when the engine restarted.
func (r *Runner) scrapeLoad(ctx context.Context, e *engine) {
	r.mu.Lock()
	due := r.cfg.Now().Sub(e.scrapedAt) >= r.cfg.LoadInterval
	port := e.state.Spec.HTTPPort
	r.mu.Unlock()
	if !due {
		return
	}
	prof, err := r.profileOf(e)
	if err != nil || prof.MetricsPath == "" {
		return
	}
	r.mu.Lock()
	if e.scraper == nil {
		e.scraper = load.NewScraper(r.cfg.HTTP, clockFunc(r.cfg.Now), load.WithNames(metricNames(prof.Metrics)))
	}
	scraper := e.scraper
	r.mu.Unlock()
	sample, err := scraper.Scrape(ctx, "http://127.0.0.1:"+strconv.Itoa(port)+prof.MetricsPath)
	var l load.Load
	if err != nil {
		r.scrapeErrors.Add(1)
		l = r.tracker.Failed(e.id, r.cfg.Now(), err)
	} else {
		l = r.tracker.Observe(e.id, sample)
	}
	r.mu.Lock()
	e.scrapedAt = r.cfg.Now()
	e.load = gossip.ShardLoad{Running: l.Running, Waiting: l.Waiting, KVCacheUsage: l.KVCacheUsage, PromptTPS: l.PromptTPS,
		GenerationTPS: l.GenerationTPS, RatesValid: l.RatesValid, ScrapedAt: l.ScrapedAt, Error: l.Error}
	r.notifyLocked()
	r.mu.Unlock()
}

// metricNames turns a profile's metric names (data) into what the load
// scraper reads. Every engine exports the process start time the same way.
func metricNames(m profile.Metrics) load.Names {
	n := load.Names{Running: m.Running, Waiting: m.Waiting, PromptTokens: m.PromptTokens,
		GenerationTokens: m.GenerationTokens, StartTime: load.VLLM().StartTime}
	for _, k := range []string{m.KVCacheUsage, m.KVCacheUsageFallback} {
		if k != "" {
			n.KVCache = append(n.KVCache, k)
		}
	}
	return n
}

// ScrapeErrors counts failed engine /metrics scrapes.
func (r *Runner) ScrapeErrors() uint64 { return r.scrapeErrors.Load() }

type clockFunc func() time.Time

func (c clockFunc) Now() time.Time { return c() }

// finish stops the engine and forgets it. A stop that fails is tried
// again with backoff: forgetting an engine that still runs would leave its
// GPUs busy under no one's claim. If the agent closes meanwhile, the state
// file stays, and the next agent adopts the engine and stops it.
func (r *Runner) finish(e *engine) {
	for delay := r.cfg.BackoffMin; ; delay = min(2*delay, r.cfg.BackoffMax) {
		err := r.cfg.Runtime.Stop(context.Background(), e.id, r.cfg.Grace)
		if err == nil || errors.Is(err, runtime.ErrNotFound) {
			break
		}
		r.log.Error("stop engine failed; trying again", "engine", e.id, "err", err, "retry_in", delay)
		t := time.NewTimer(delay)
		select {
		case <-r.quit:
			t.Stop()
			return
		case <-t.C:
		}
	}
	_ = shardstate.Remove(r.stateDir, shardstate.FileID(e.state))
	r.tracker.Forget(e.id)
	// Its log goes with it: engine IDs change with every spec version, so
	// kept logs would pile up with each rolling update. Under logMu, and
	// after the engine leaves r.engines, so a cap cannot bring .1 back.
	r.logMu.Lock()
	r.mu.Lock()
	delete(r.engines, e.id)
	for p, id := range r.ports {
		if id == e.id {
			delete(r.ports, p)
		}
	}
	r.notifyLocked()
	r.mu.Unlock()
	_ = os.Remove(r.logPath(e.id))
	_ = os.Remove(r.logPath(e.id) + ".1")
	r.logMu.Unlock()
	r.log.Info("engine stopped", "shard", e.state.ShardID, "engine", e.id)
}

// Shards implements Engines.
func (r *Runner) Shards() []gossip.ShardRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]gossip.ShardRecord, 0, len(r.engines))
	for _, e := range r.engines {
		if e.orphan {
			continue // claims nothing; see engine.orphan
		}
		st := e.state
		rec := gossip.ShardRecord{
			ShardID: st.ShardID, ReplicaID: st.ReplicaID, Deployment: e.desired.Deployment, SpecVersion: st.Spec.SpecVersion,
			GPUs: st.Spec.GPUIndices, MemoryPerGPU: e.desired.MemoryPerGPU, Status: e.status, Ready: e.ready,
			ClaimStamp: st.ClaimStamp, Failing: e.failing, PID: st.PID, Container: st.Spec.ContainerID,
			Restarts: st.Restarts, LastExit: st.LastExitCode, StartedAt: st.StartedAt, Load: e.load, Error: e.startErr,
		}
		if rec.Deployment == "" {
			rec.Deployment = st.Spec.Deployment
		}
		if st.Spec.HTTPPort > 0 {
			rec.URL = "http://" + net.JoinHostPort(r.cfg.Host, strconv.Itoa(st.Spec.HTTPPort))
		}
		out = append(out, rec)
	}
	SortShards(out)
	return out
}

// RuntimeName names the runtime engines run in.
func (r *Runner) RuntimeName() string { return r.cfg.Runtime.Name() }

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

func shardIndex(d Desired) int {
	var j int
	if _, err := fmt.Sscanf(d.ShardID[len(d.ReplicaID):], "-s%d", &j); err == nil {
		return j
	}
	return 0
}

// DescribeEngines lists what the runtime runs for this node, one line per
// engine, for the `containers` host tool.
func (r *Runner) DescribeEngines(ctx context.Context) (string, error) {
	engines, err := r.cfg.Runtime.List(ctx, r.cfg.Node)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s runtime, node %s: %d engine(s)\n", r.cfg.Runtime.Name(), r.cfg.Node, len(engines))
	for _, e := range engines {
		fmt.Fprintf(&b, "%s\tstate=%s\tpid=%d\tshard=%s\tspec=%s\tstarted=%s", e.ID, e.State, e.PID,
			e.Labels[runtime.LabelShard], e.Labels[runtime.LabelSpec], e.StartedAt.UTC().Format(time.RFC3339))
		if e.State == runtime.StateExited {
			fmt.Fprintf(&b, "\texit=%d", e.ExitCode)
		}
		b.WriteByte('\n')
	}
	return b.String(), nil
}

// HostEngines lists engine processes for the `engine_stacks` host tool.
func (r *Runner) HostEngines(ctx context.Context) ([]host.EngineProcess, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []host.EngineProcess
	for _, e := range r.engines {
		if e.state.PID > 0 {
			out = append(out, host.EngineProcess{Name: e.state.ShardID, PID: e.state.PID})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
