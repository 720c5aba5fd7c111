package engine

import (
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/supervisor/shardstate"
)

// restartPolicy turns what a poll found (ready or not, a crash, a gang
// member's stop) into an engine's status, crash count and next start, by
// Config's rules: crashes count in a row until the engine has been ready
// for StableAfter, each doubles the delay before the next start (from
// BackoffMin up to BackoffMax), and FailingAfter in a row report the shard
// failing, so placement may move it.
//
// It holds only settings; its methods take the engine's lock (managed.mu)
// themselves.
type restartPolicy struct {
	clock                  clock.Clock
	backoffMin, backoffMax time.Duration
	failingAfter           int
	stableAfter            time.Duration
	// shards is the state files' directory: a crash is saved in the
	// engine's.
	shards string
}

func newRestartPolicy(cfg Config) restartPolicy {
	return restartPolicy{clock: cfg.Clock, backoffMin: cfg.BackoffMin, backoffMax: cfg.BackoffMax,
		failingAfter: cfg.FailingAfter, stableAfter: cfg.StableAfter, shards: cfg.DataDir.ShardsDir()}
}

// crashed records a crash of e (an exit, a failed start, a start timeout)
// and returns when to try again.
func (p restartPolicy) crashed(e *managed, code *int) time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := p.clock.Now()
	if !e.readySince.IsZero() && now.Sub(e.readySince) >= p.stableAfter {
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
	e.failing = e.crashes >= p.failingAfter
	_ = shardstate.Save(p.shards, e.state)
	notify(e.changes)
	delay := p.backoffMin << min(e.crashes-1, 16)
	return p.clock.Now().Add(min(delay, p.backoffMax))
}

// setReady records a poll's readiness verdict on e (and the engine's pid,
// when the runtime told it), notifying on a change. Ready for StableAfter,
// the engine's crashes start over.
func (p restartPolicy) setReady(e *managed, ready bool, pid int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.status == gossip.ShardStopping {
		return
	}
	status := gossip.ShardStarting
	now := p.clock.Now()
	if ready {
		status = gossip.ShardReady
		if e.readySince.IsZero() {
			e.readySince = now
		}
		if (e.crashes > 0 || e.failing) && now.Sub(e.readySince) >= p.stableAfter {
			e.crashes, e.failing = 0, false
			notify(e.changes)
		}
	} else {
		e.readySince = time.Time{}
	}
	if e.ready != ready || e.status != status || (pid > 0 && e.state.PID != pid) {
		e.ready, e.status = ready, status
		if pid > 0 {
			e.state.PID = pid
		}
		notify(e.changes)
	}
}
