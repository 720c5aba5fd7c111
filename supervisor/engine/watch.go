package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/weights"
	"github.com/llmgw/llmgw/supervisor/profile"
	"github.com/llmgw/llmgw/supervisor/runtime"
	"github.com/llmgw/llmgw/supervisor/shardstate"
)

// statusTimeout bounds one runtime status call: a hung containerd must not
// freeze an engine's watcher (nor Close, which waits for watchers).
const statusTimeout = 10 * time.Second

// watchState is what one watch goroutine carries from poll to poll. The
// goroutine owns it: nothing else reads or writes it, so it takes no lock.
// (What others read about the engine is in managed, under Runner.mu.)
type watchState struct {
	// started: the engine was started (or adopted) and not seen dead
	// since, so each poll asks the runtime about it; false while it waits
	// to be (re)started.
	started bool
	// retryAt is when a start may be tried again after a crash.
	retryAt time.Time
	// everReady: the current attempt's engine became ready.
	everReady bool
	// unknowns counts "unknown" runtime states in a row.
	unknowns int
	// lastGen is the gang generation a member's engine last ran against
	// (see memberStopped): it starts again only for another one.
	lastGen int64
	// movedSince is when the plan first moved a peer of this gang member
	// away from the generation's member (see gangMoveGrace).
	movedSince time.Time
	// live judges a ready engine's probes and progress (judge.go); clock
	// times a starting one.
	live  liveness
	clock startClock
	// gateWaited: the engine's note says it waits for the start gate.
	gateWaited bool
	// scraping: a /metrics read is in flight; its result arrives on
	// scraped (buffered: the reader never waits for the watcher).
	scraping bool
	scraped  chan scrapeResult
	// trace holds the spans of the engine's start (trace.go).
	trace startTrace
	// adapters is the LoRA registrations' memory (lora.go).
	adapters adapterSync
}

// scrapeResult is one background /metrics read: the token counters, when
// it read them.
type scrapeResult struct {
	counters float64
	ok       bool
}

// watch drives one engine: start it (unless adopted), then check it every
// poll: runtime state, then readiness. A crash is recorded and the engine
// restarted after a backoff that doubles per crash in a row. When ctx ends
// the engine is stopped and forgotten.
func (r *Runner) watch(ctx context.Context, e *managed, adopted bool) {
	defer r.wg.Done()
	w := &watchState{started: adopted, scraped: make(chan scrapeResult, 1), trace: startTrace{tracer: r.cfg.Tracer}}
	now := r.cfg.Clock.Now()
	if !adopted {
		w.trace.beginFailover(r.cfg.Node, e)
	}
	w.clock.begin(now)
	if adopted && e.isReady() {
		// Judged ready at adoption: from now on by the rule, so a busy
		// engine found by a restarted agent is never taken for a
		// starting one that stopped answering.
		w.everReady = true
		w.live.becameReady(now)
	}
	if adopted && !e.isReady() {
		// Found still starting: it holds its GPUs' start gate like one
		// started here (a hold taken elsewhere meanwhile stands).
		r.gate.acquire(e.id, e.gpuIndices(), now)
	}
	tick := r.cfg.Clock.NewTicker(r.cfg.Poll)
	defer tick.Stop()
	defer r.gate.release(e.id)
	for {
		if ctx.Err() != nil {
			w.trace.stop(r.cfg.Clock.Now())
			r.gate.release(e.id)
			r.finish(e)
			return
		}
		var gs *shardstate.Gang
		mayStart := !w.started && !r.cfg.Clock.Now().Before(w.retryAt) && e.isPlanned()
		if mayStart {
			// One engine at a time starts on a GPU (gate.go); the wait is
			// the engine's note, so `llmgw shards` says what holds it.
			if wait := r.gate.acquire(e.id, e.gpuIndices(), r.cfg.Clock.Now()); wait != "" {
				e.setNote(wait, r.cfg.Clock.Now())
				mayStart, w.gateWaited = false, true
			} else if w.gateWaited {
				e.setNote("", time.Time{}) // no longer waiting: say nothing stale
				w.gateWaited = false
			}
		}
		if mayStart && e.isGang() {
			var note string
			if gs, note = r.gang.start(e, w.lastGen); gs == nil {
				e.setGangNote(note)
				mayStart = false
			}
		}
		if mayStart {
			w.everReady = false
			w.trace.begin(r.cfg.Node, e, r.cfg.Clock.Now())
			err := r.start(ctx, e, gs, &w.trace)
			// The start timeout counts from here, after the image pull
			// that start waited for: a 20 GB image on a slow link must not
			// eat the engine's own time to load.
			w.clock.begin(r.cfg.Clock.Now())
			if err != nil {
				if r.base.Err() != nil {
					w.trace.detach(r.cfg.Clock.Now())
					return // the agent is closing: not a crash
				}
				if ctx.Err() != nil {
					continue // no longer wanted: not a crash; the loop's top stops it
				}
				w.trace.fail(r.cfg.Clock.Now(), err.Error())
				r.log.Error("engine start failed", "shard", e.state.ShardID, "err", err)
				e.setStartErr(err.Error())
				w.retryAt = r.policy.crashed(e, nil)
			} else {
				w.started = true
			}
		}
		if w.started {
			r.check(ctx, e, w)
		}
		if w.started && e.isGang() {
			r.checkGang(e, w)
		}
		if !w.started || w.everReady {
			// Ready, failed, or not started (yet): its GPUs are free for
			// the next engine to start on.
			r.gate.release(e.id)
		}
		select {
		case <-ctx.Done():
		case <-tick.Chan():
		case <-r.quit:
			w.trace.detach(r.cfg.Clock.Now())
			return
		}
	}
}

// check is one poll of a started engine: its runtime state, then its
// readiness (and load), or, if it died or never became ready in time, the
// crash and the time of the next start.
func (r *Runner) check(ctx context.Context, e *managed, w *watchState) {
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
		ok, _ := r.probe.ready(ctx, e)
		r.policy.setReady(e, ok, 0)
	case err == nil && st.State == runtime.StateUnknown && w.unknowns < 20:
		// containerd restarting or a shim not answering: look again
		// rather than kill a possibly healthy engine.
		w.unknowns++
	case err != nil || st.State != runtime.StateRunning:
		code := st.ExitCode
		member := e.isMember()
		if member {
			r.log.Warn("gang member exited; waiting for rank 0 to restart the gang", "shard", e.state.ShardID, "exit_code", code)
		} else {
			r.log.Warn("engine exited; restarting after backoff", "shard", e.state.ShardID, "exit_code", code, "crashes_in_a_row", e.crashes+1)
		}
		w.trace.fail(r.cfg.Clock.Now(), exitedWhy(code))
		// Remove the dead engine so its GPUs are free while we wait.
		if err := r.cfg.Runtime.Stop(context.Background(), e.id, 0); err != nil && !errors.Is(err, runtime.ErrNotFound) {
			r.log.Warn("remove exited engine", "shard", e.state.ShardID, "err", err)
		}
		w.started = false
		if member {
			r.policy.memberStopped(e, w, fmt.Sprintf("exited with code %d; waiting for rank 0's next generation", code), &code)
			return
		}
		if e.isGang() {
			e.setGangNote(fmt.Sprintf("rank 0 exited with code %d; gang restarting", code))
		}
		w.retryAt = r.policy.crashed(e, &code)
	default:
		w.unknowns = 0
		if e.isMember() {
			ready := e.memberReady()
			if ready && !w.everReady {
				now := r.cfg.Clock.Now()
				e.setTook(w.trace.took(now))
				w.trace.ready(now)
			}
			w.everReady = w.everReady || ready
			r.policy.setReady(e, ready, st.PID)
			if !ready && !w.everReady && r.startExpired(e, w) {
				r.restartStarting(e, w, true)
			}
			return
		}
		if !w.everReady {
			r.checkStarting(ctx, e, w, st.PID)
			return
		}
		r.checkServing(ctx, e, w, st.PID)
	}
}

// checkStarting is one poll of an engine that has not been ready yet: its
// probes alone decide, and its start clock runs.
func (r *Runner) checkStarting(ctx context.Context, e *managed, w *watchState, pid int) {
	ok, why := r.probe.ready(ctx, e)
	ready := ok && r.probe.ownsPort(e, pid)
	now := r.cfg.Clock.Now()
	if ready {
		w.everReady = true
		e.setTook(w.trace.took(now))
		w.trace.ready(now)
		w.live.becameReady(now)
		e.setNote("", time.Time{})
		r.policy.setReady(e, true, pid)
		if r.probe.scrapeDue(e) {
			r.probe.scrapeLoad(ctx, e, 0)
		}
		return
	}
	r.policy.setReady(e, false, pid)
	if r.startExpired(e, w) {
		r.log.Warn("engine not ready within the start timeout and silent; restarting it", "shard", e.state.ShardID,
			"timeout", e.startTimeout(r.cfg.StartTimeout), "last_probe", why)
		r.restartStarting(e, w, false)
		return
	}
	e.setNote("loading", w.clock.activityAt)
}

// startExpired samples the starting engine's signs of progress (its log,
// the weights dir) and reports whether it has been silent for longer than
// its start timeout.
func (r *Runner) startExpired(e *managed, w *watchState) bool {
	now := r.cfg.Clock.Now()
	if fi, err := os.Stat(r.cfg.DataDir.EngineLogFile(e.id)); err == nil {
		w.clock.sawLog(now, fi.Size())
	}
	if r.cfg.WeightsDir != "" && (w.clock.weightsAt.IsZero() || now.Sub(w.clock.weightsAt) >= weightsEvery) {
		// The model's own directory, not the whole cache: that is where
		// its download lands (HF_HOME is the weights dir).
		e.mu.Lock()
		model := e.desired.Spec.Model
		e.mu.Unlock()
		size, _ := weights.ModelSize(r.cfg.WeightsDir, model)
		w.clock.sawWeights(now, int64(size))
	}
	return w.clock.expired(now, e.startTimeout(r.cfg.StartTimeout))
}

// restartStarting stops an engine that never became ready in time and
// counts the crash (a gang member waits for rank 0's next generation).
func (r *Runner) restartStarting(e *managed, w *watchState, member bool) {
	if err := r.cfg.Runtime.Stop(context.Background(), e.id, r.cfg.Grace); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		// Still running: starting it again would clash with itself. Try
		// the stop again at the next poll.
		r.log.Error("stop engine that never became ready", "shard", e.state.ShardID, "err", err)
		return
	}
	w.started = false
	w.trace.fail(r.cfg.Clock.Now(), "not ready within the start timeout")
	if member {
		r.policy.memberStopped(e, w, "not ready within the start timeout; waiting for rank 0's next generation", nil)
		return
	}
	e.mu.Lock()
	e.startErr = Clip(fmt.Sprintf("not ready within the start timeout (%s without progress)", e.startTimeoutLocked(r.cfg.StartTimeout)), 300)
	e.mu.Unlock()
	w.retryAt = r.policy.crashed(e, nil)
}

// checkServing is one poll of an engine that has been ready: the rule of
// judge.go decides whether it stays routable, and whether it is hung. The
// health probe and the /metrics read run side by side, so a hung engine
// costs one probe timeout per poll, not two.
func (r *Runner) checkServing(ctx context.Context, e *managed, w *watchState, pid int) {
	prof, err := e.profile()
	if err != nil {
		r.policy.setReady(e, false, pid)
		return
	}
	rule := r.probe.ruleOf(prof)
	// The /metrics read runs in the background, apart from the probe:
	// vLLM serves /metrics on the same loop as /health, so under load it
	// is as slow, and a read bounded by the probe timeout would never see
	// the progress that tells busy from hung. It gets the whole progress
	// window, and one read at a time is in flight; the poll goes on.
	if !w.scraping && (w.live.failures > 0 || r.probe.scrapeDue(e)) {
		w.scraping = true
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			sctx, cancel := context.WithCancel(ctx)
			defer cancel()
			stop := context.AfterFunc(r.base, cancel) // Close waits for this read
			defer stop()
			c, ok := r.probe.scrapeLoad(sctx, e, max(rule.ProbeTimeout, rule.ProgressWindow))
			w.scraped <- scrapeResult{counters: c, ok: ok}
		}()
	}
	ok, why := r.probe.ready(ctx, e)
	var counters float64
	var haveCounters bool
	select {
	case res := <-w.scraped:
		w.scraping = false
		counters, haveCounters = res.counters, res.ok
	default:
	}
	if ctx.Err() != nil {
		return
	}
	now := r.cfg.Clock.Now()
	v := w.live.observe(rule, now, ok, why, counters, haveCounters)
	r.policy.setReady(e, v.routable, pid)
	if ok {
		r.syncAdapters(ctx, e, w)
	}
	switch {
	case v.changed && v.routable:
		r.log.Info("engine routable again", "shard", e.state.ShardID, "engine", e.id)
		e.setNote("", time.Time{})
	case v.changed:
		r.probe.unroutable.Add(1)
		r.log.Warn("engine not routable: "+v.why, "shard", e.state.ShardID, "engine", e.id,
			"probe_timeout", rule.ProbeTimeout, "failures", rule.Failures, "progress_window", rule.ProgressWindow)
		e.setNote("not routable: "+v.why, now)
	}
	if !v.hung {
		return
	}
	r.probe.hungRestarts.Add(1)
	reason := fmt.Sprintf("hung: not routable and no progress for %s (%s)", rule.HungRestart, v.why)
	r.log.Error("engine hung; restarting it", "shard", e.state.ShardID, "engine", e.id, "reason", reason)
	if err := r.cfg.Runtime.Stop(context.Background(), e.id, r.cfg.Grace); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		r.log.Error("stop hung engine", "shard", e.state.ShardID, "err", err)
		return
	}
	w.started, w.everReady = false, false
	e.setStartErr(reason)
	e.setNote("restarted: "+reason, now)
	if e.isGang() {
		e.setGangNote("rank 0 hung; gang restarting")
	}
	w.retryAt = r.policy.crashed(e, nil)
}

// printableOnly replaces what a record may not carry (newlines, control
// characters) with spaces.
func printableOnly(s string) string {
	return strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return ' '
		}
		return r
	}, s)
}

// start starts e's engine; gs is its gang start (nil: not a gang), and
// tr the attempt's spans, whose phases it opens: pull and start, then
// ready, which the watcher ends.
func (r *Runner) start(engineCtx context.Context, e *managed, gs *shardstate.Gang, tr *startTrace) error {
	// Runtime calls end when the engine is no longer wanted or when the
	// agent closes the runner.
	ctx, cancel := context.WithCancel(r.base)
	defer cancel()
	stop := context.AfterFunc(engineCtx, cancel)
	defer stop()
	r.ports.ensure(e, r.log)
	e.mu.Lock()
	d, st := e.desired, e.state
	e.mu.Unlock()
	prof, err := e.profile()
	if err != nil {
		return err
	}
	// Engines listen on loopback only once every node's gateway relays
	// through the holder (protocol V4): vLLM's key guards /v1 alone, so
	// /invocations, /pooling, /score and /tokenize would run the model
	// for anyone who reaches the port (AuthenticationMiddleware in
	// vllm/entrypoints/openai/api_server.py skips every path that does
	// not start with /v1). Decided at each start, and kept with the
	// state, so an adopted engine reports what it was started with.
	st.Spec.Private = d.ClusterVersion >= protocol.V4
	in := profile.Inputs{Port: st.Spec.HTTPPort, Self: r.cfg.Self, WeightsDir: r.cfg.WeightsDir, ShardIndex: shardIndex(d),
		APIKey: r.cfg.engineKey(e.id), Gang: gangInputs(gs), StartTimeout: e.startTimeout(r.cfg.StartTimeout),
		CacheDir: r.cfg.CacheDir, OTLPTracesEndpoint: r.cfg.OTLPTracesEndpoint}
	if st.Spec.Private {
		in.Host = "127.0.0.1"
	}
	if st.Spec.Role != "" {
		// A role of a disaggregated deployment: the KV moves engine to
		// engine, not through the gateways, so its port must be reached
		// from the other role's nodes. vLLM's NIXL side channel listens
		// on VLLM_NIXL_SIDE_CHANNEL_HOST (the node's address); SGLang's
		// bootstrap server binds the engine's --host (CommonKVBootstrap
		// Server in python/sglang/srt/disaggregation/common/conn.py), so
		// an SGLang engine listens on every address (its key still
		// guards its API, and gateways keep going through the relay).
		// Both are unauthenticated: see the README's security section.
		in.Role, in.KVPort = st.Spec.Role, st.Spec.KVPort
		in.KVHost, _ = hostInterface(r.cfg.Host)
		if t := d.Spec.Transfer; t != nil {
			in.TransferBackend, in.NIC = t.Backend, t.NIC
		}
		if d.Spec.Engine == "sglang" {
			in.Host = "0.0.0.0"
			// Its record says so: remote gateways may dial it, and
			// the node warns of an engine open to the network.
			st.Spec.Private = false
		}
	}
	if d.Spec.AdaptersAtStart() {
		// An engine that loads LoRA adapters only at start (llama.cpp)
		// gets their paths, resolved on this node, in the spec's order.
		for _, a := range d.Spec.Adapters {
			in.AdapterPaths = append(in.AdapterPaths, AdapterPath(r.cfg.WeightsDir, a.Source))
		}
	}
	if d.Gang != nil {
		in.ClusterVersion = d.Gang.ClusterVersion
	}
	if gs != nil {
		in.HostIP, in.NetIface = hostInterface(r.cfg.Host)
		if r.cfg.RDMADevices != nil {
			in.RDMADevices = r.cfg.RDMADevices(ctx)
		}
	}
	if r.cfg.GPUFree != nil && !r.cfg.SimulatedGPUs && prof.MemoryFraction == profile.FractionOfFreeStatic {
		// Read now, after the start gate let this engine go: what a
		// neighbour still loading holds is then already counted. Only a
		// profile sized from free memory (SGLang) reads it.
		free, err := r.cfg.GPUFree(ctx, d.GPUs)
		if err != nil {
			// Unknown, as on simulated GPUs: the profile falls back to
			// what it does without the reading.
			r.log.Warn("cannot read the GPUs' free memory before a start", "shard", d.ShardID, "gpus", d.GPUs, "err", err)
		} else {
			in.GPUFree = free
		}
	}
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
	if len(prof.Files) > 0 && r.cfg.CacheDir != "" {
		in.FilesDir = profileFilesDir(r.cfg.CacheDir, e.id)
		if err := writeProfileFiles(prof, d.Spec, in); err != nil {
			return err
		}
	}
	cmd, env, image, err := profile.Resolve(prof, d.Spec, in)
	if err != nil {
		return err
	}
	spec := runtime.EngineSpec{
		ID: e.id, Node: r.cfg.Node, ShardID: d.ShardID, ReplicaID: d.ReplicaID, Deployment: d.Deployment, SpecVersion: d.SpecVersion,
		Image: image, Command: cmd, Env: env, GPUIndices: d.GPUs, GPUUUIDs: uuids, HTTPPort: st.Spec.HTTPPort,
		LogPath: r.cfg.DataDir.EngineLogFile(e.id), WeightsDir: r.cfg.WeightsDir, CacheDir: r.cfg.CacheDir,
		Gang: gs != nil, RDMADevices: in.RDMADevices,
	}
	st.Spec.Image, st.Spec.Command, st.Spec.GPUUUIDs = image, cmd, uuids
	tr.image(image)
	st.Gang = gs
	// Container images are pulled before the engine starts (vLLM's are
	// 12-28 GB; the runtime logs progress). The engine stays "starting"
	// meanwhile, holding its claim.
	if p, ok := r.cfg.Runtime.(runtime.ImagePuller); ok && image != "" {
		// The phase is published at once, its percentage at most every
		// 15 s (setNote), so a pull does not churn the node's record.
		var last time.Time
		progress := func(done, total int64) {
			now := r.cfg.Clock.Now()
			if total <= 0 || now.Sub(last) < noteRefresh {
				return
			}
			last = now
			e.setNote(fmt.Sprintf("pulling image %d%%", min(done*100/total, 99)), now)
		}
		e.setNote("pulling image", r.cfg.Clock.Now())
		tr.enter("pull", r.cfg.Clock.Now())
		err := p.EnsureImage(ctx, image, progress)
		e.setNote("", time.Time{})
		if err != nil {
			return err
		}
	}
	// The state file goes first: an agent that dies right after Start
	// still finds what it started.
	tr.enter("start", r.cfg.Clock.Now())
	if err := shardstate.Save(r.cfg.DataDir.ShardsDir(), st); err != nil {
		return err
	}
	eng, err := r.cfg.Runtime.Start(ctx, spec)
	if err != nil {
		return fmt.Errorf("start %s: %w", e.id, err)
	}
	st.PID, st.StartedAt = eng.PID, r.cfg.Clock.Now()
	tr.enter("ready", st.StartedAt)
	st.Spec.ContainerID = eng.ContainerID
	if err := shardstate.Save(r.cfg.DataDir.ShardsDir(), st); err != nil {
		r.log.Error("save shard state", "err", err)
	}
	e.mu.Lock()
	st.ClaimStamp = e.state.ClaimStamp // a Reclaim meanwhile stands
	e.state = st
	e.readySince = time.Time{}
	e.startErr = ""
	e.gangNote = ""
	if gs != nil && gs.Rank == 0 {
		e.gangNote = fmt.Sprintf("waiting for %d more rank(s) to connect", gs.Size-1)
	}
	if e.status != gossip.ShardStopping {
		e.status = gossip.ShardStarting
	}
	notify(e.changes)
	e.mu.Unlock()
	r.log.Info("engine started", "shard", d.ShardID, "engine", e.id, "pid", eng.PID, "port", st.Spec.HTTPPort)
	return nil
}

// shardIndex is the index of d's shard within its replica: its rank in
// its gang, 0 for a replica of one shard.
func shardIndex(d Desired) int {
	j, _ := placement.ShardIndex(d.ShardID, d.ReplicaID)
	return j
}

// Clip keeps a text short enough for a node record (an error, a note, an
// autoscaling reason), cut at a character's start: half a UTF-8 sequence
// would make the record's text unprintable, and peers refuse a record
// with one.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
