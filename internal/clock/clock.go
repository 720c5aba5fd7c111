// Package clock is the one notion of time the node's loops share: a Clock
// is injected (the real one in the binary, a fake one in tests), and every
// wait of the supervisor, gossip and probe loops (tickers, timers,
// deadlines) is made from it, so a test moves time with Advance instead
// of waiting for it.
//
// The implementation is clockwork's (its real clock and its FakeClock);
// this package names the part of it our loops use, so that a consumer
// depends on five methods, not on the library.
package clock

import (
	"context"
	"time"

	"github.com/jonboulle/clockwork"
)

// Clock tells the time and makes the timers that wait on it. Loops take
// one instead of calling time.Now or time.NewTimer, so the node and its
// engine runner judge leases, backoffs and timeouts by the same clock, and
// a test can move it.
type Clock interface {
	Now() time.Time
	Since(t time.Time) time.Duration
	NewTimer(d time.Duration) Timer
	NewTicker(d time.Duration) Ticker
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a one-shot timer of a Clock; Chan fires once (for AfterFunc
// timers it never does: the function runs instead).
type Timer = clockwork.Timer

// Ticker fires on Chan every period of its Clock.
type Ticker = clockwork.Ticker

// Real is the system clock.
func Real() Clock { return clockwork.NewRealClock() }

// Fake is a clock that moves only when told (Advance), firing the timers
// and tickers it passes; BlockUntilContext waits until a number of them
// wait on it, so that a test advances after a loop has armed its timer,
// not before.
type Fake = clockwork.FakeClock

// NewFake is a Fake clock that says at.
func NewFake(at time.Time) *Fake { return clockwork.NewFakeClockAt(at) }

// Offset is c read off by a varying offset: Now is c.Now()+by(); timers
// and tickers are c's. It is a node whose wall clock is wrong (its
// timers still measure durations right, as a skewed system clock's do).
func Offset(c Clock, by func() time.Duration) Clock { return offset{c, by} }

type offset struct {
	Clock
	by func() time.Duration
}

func (o offset) Now() time.Time                  { return o.Clock.Now().Add(o.by()) }
func (o offset) Since(t time.Time) time.Duration { return o.Now().Sub(t) }

// Sleep waits d on c or until ctx ends, and reports whether the whole d
// passed.
func Sleep(ctx context.Context, c Clock, d time.Duration) bool {
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.Chan():
		return true
	}
}

// SleepReal is Sleep on the system clock, for the simulators of real time
// (the fake engine, the load generator) whose waits are their subject.
func SleepReal(ctx context.Context, d time.Duration) bool { return Sleep(ctx, Real(), d) }
