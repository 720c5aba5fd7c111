package engine

import (
	"context"
	"errors"
	"os"
	"strconv"

	"github.com/llmgw/llmgw/supervisor/runtime"
	"github.com/llmgw/llmgw/supervisor/shardstate"
)

// awaitIdle waits until e, already routed around, reports no running or
// waiting request on its /metrics (the profile's names), polled every Poll:
// the requests and streams in flight finish instead of being cut by the
// stop. It gives up waiting after DrainMax, and at once for an engine
// whose load it cannot read. It returns false if the agent closes meanwhile.
func (r *Runner) awaitIdle(e *managed) bool {
	prof, err := e.profile()
	if err != nil || prof.MetricsPath == "" || (prof.Metrics.Running == "" && prof.Metrics.Waiting == "") {
		return true
	}
	e.mu.Lock()
	port := e.state.Spec.HTTPPort
	e.mu.Unlock()
	scraper := r.probe.scraperOf(e, prof)
	url := "http://127.0.0.1:" + strconv.Itoa(port) + prof.MetricsPath
	deadline := r.cfg.Clock.Now().Add(r.cfg.DrainMax)
	tick := r.cfg.Clock.NewTicker(r.cfg.Poll)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(r.base, statusTimeout)
		s, err := scraper.Scrape(ctx, url)
		cancel()
		if err != nil || s.Running+s.Waiting == 0 {
			return true
		}
		if !r.cfg.Clock.Now().Before(deadline) {
			r.log.Warn("engine still busy at the drain bound; stopping it", "engine", e.id, "running", s.Running, "waiting", s.Waiting, "bound", r.cfg.DrainMax)
			return true
		}
		select {
		case <-r.quit:
			return false
		case <-tick.Chan():
		}
	}
}

// finish stops the engine and forgets it. One that served when it was told
// to stop keeps serving for DrainDelay first, then until the requests it
// has in hand are done (at most DrainMax; see awaitIdle). A stop that fails is tried
// again with backoff: forgetting an engine that still runs would leave its
// GPUs busy under no one's claim. If the agent closes meanwhile, the state
// file stays, and the next agent adopts the engine and stops it.
func (r *Runner) finish(e *managed) {
	e.mu.Lock()
	drain := e.drain
	e.mu.Unlock()
	if drain {
		t := r.cfg.Clock.NewTimer(r.cfg.DrainDelay)
		select {
		case <-r.quit:
			t.Stop()
			return // the next agent adopts it and decides
		case <-t.Chan():
		}
		if !r.awaitIdle(e) {
			return // the agent is closing: the next one decides
		}
	}
	for delay := r.cfg.BackoffMin; ; delay = min(2*delay, r.cfg.BackoffMax) {
		err := r.cfg.Runtime.Stop(context.Background(), e.id, r.cfg.Grace)
		if err == nil || errors.Is(err, runtime.ErrNotFound) {
			break
		}
		r.log.Error("stop engine failed; trying again", "engine", e.id, "err", err, "retry_in", delay)
		t := r.cfg.Clock.NewTimer(delay)
		select {
		case <-r.quit:
			t.Stop()
			return
		case <-t.Chan():
		}
	}
	_ = shardstate.Remove(r.cfg.DataDir.ShardsDir(), shardstate.FileID(e.state))
	r.probe.forget(e.id)
	// Its log goes with it: engine IDs change with every spec version, so
	// kept logs would pile up with each rolling update. Under logMu, and
	// after the engine leaves r.engines, so a cap cannot bring .1 back.
	r.logMu.Lock()
	r.mu.Lock()
	delete(r.engines, e.id)
	r.ports.release(e.id)
	notify(r.changes)
	r.mu.Unlock()
	logPath := r.cfg.DataDir.EngineLogFile(e.id)
	_ = os.Remove(logPath)
	_ = os.Remove(logPath + ".1")
	r.logMu.Unlock()
	r.log.Info("engine stopped", "shard", e.state.ShardID, "engine", e.id)
}
