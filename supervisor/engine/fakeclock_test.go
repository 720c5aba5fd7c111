package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/testwait"
)

// fakeTime is the fake clock of a runner under test. The runner's waits
// are on it: each engine's poll, backoffs, start timeouts, the drain delay
// and bound, stop retries. Its engines are real processes on real time.
// So a test moves the clock one poll at a time while it waits for what an
// engine does (until), and by a whole backoff, timeout or delay at once
// where the runner is the one waiting (advance): no test sits out a
// runner's wait on the wall clock.
type fakeTime struct {
	t    *testing.T
	clk  *clock.Fake
	poll time.Duration
}

// openFake is openWith with a fake clock in the runner. The clock starts
// years from the wall clock's time, so a stamp taken from the wrong clock
// shows.
func (e *runnerEnv) openFake(mutate func(*Config)) (*Runner, *fakeTime) {
	e.t.Helper()
	f := &fakeTime{t: e.t, clk: clock.NewFake(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))}
	r := e.openWith(func(c *Config) {
		c.Clock = f.clk
		mutate(c)
		f.poll = c.Poll
	})
	return r, f
}

// Waiters on a fake runner clock with one engine: the log loop's ticker
// and the engine watcher's poll ticker; a drain adds its delay timer.
// Backoffs and start timeouts are no timers (a poll compares the clock
// with them), so advance(oneEngineWaits, …) only waits for the watcher
// to run; drainWaits waits for the drain's timer to be armed.
const (
	oneEngineWaits = 2
	drainWaits     = oneEngineWaits + 1
)

// until is testwait.Until for a runner on the fake clock: after each
// look that fails the clock moves one poll, so the runner polls (and
// passes any wait shorter than a poll).
func (f *fakeTime) until(what string, cond func() (bool, string)) {
	f.t.Helper()
	f.untilBy(f.poll, what, cond)
}

// untilBy is until with the clock moved by step after each failed look,
// for a runner that waits for longer than a poll at every turn.
func (f *fakeTime) untilBy(step time.Duration, what string, cond func() (bool, string)) {
	f.t.Helper()
	testwait.Until(f.t, 15*time.Second, what, func() (bool, string) {
		ok, detail := cond()
		if !ok {
			f.clk.Advance(step)
		}
		return ok, detail
	})
}

// waitShard is waitShard with the runner's clock moved by until.
func (f *fakeTime) waitShard(r *Runner, what string, cond func(s []string) bool) {
	f.t.Helper()
	f.until(what, func() (bool, string) {
		desc := describeShards(r)
		return cond(desc), fmt.Sprint(desc)
	})
}

// advance moves the clock by d once at least n timers and tickers wait
// on it (clockwork's BlockUntilContext), that is once the runner has
// armed the wait d is to pass.
func (f *fakeTime) advance(n int, d time.Duration) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.clk.BlockUntilContext(ctx, n); err != nil {
		f.t.Fatalf("waiting for %d timers and tickers on the runner's clock: %v", n, err)
	}
	f.clk.Advance(d)
}

// runReady is runReady on the fake clock.
func (f *fakeTime) runReady(r *Runner, d Desired) {
	f.t.Helper()
	r.Reconcile(context.Background(), []Desired{d})
	f.waitShard(r, d.ShardID+" ready", func([]string) bool { return readyPID(r, d.ShardID) > 0 })
}

// stopAll unplans everything and waits until r has stopped it, a drain
// included.
func (f *fakeTime) stopAll(r *Runner) {
	f.t.Helper()
	r.Reconcile(context.Background(), nil)
	f.waitShard(r, "stopped", func(s []string) bool { return len(s) == 0 })
}
