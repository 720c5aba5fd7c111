// Package clock is the one notion of time the node's loops share: a Clock
// is injected (the real one in the binary, a controlled one in tests), and
// Sleep waits on a context so that every wait ends with its loop.
package clock

import (
	"context"
	"time"
)

// Clock tells the time. Loops take one instead of calling time.Now, so the
// node and its engine runner judge leases, backoffs and timeouts by the
// same clock, and a test can move it.
type Clock interface {
	Now() time.Time
}

// Func adapts a function to a Clock.
type Func func() time.Time

// Now implements Clock.
func (f Func) Now() time.Time { return f() }

// Real is the system clock.
func Real() Clock { return Func(time.Now) }

// Sleep waits for d or until ctx ends, and reports whether the whole d
// passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
