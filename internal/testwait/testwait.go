// Package testwait is how tests wait for what the system does on its own
// time: poll a condition with a deadline, never sleep a guess.
package testwait

import (
	"testing"
	"time"
)

// Until polls cond until it holds, failing tb with cond's last detail when
// it does not hold within the deadline.
func Until(tb testing.TB, within time.Duration, what string, cond func() (bool, string)) {
	tb.Helper()
	deadline := time.Now().Add(within)
	var last string
	for time.Now().Before(deadline) {
		var ok bool
		if ok, last = cond(); ok {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	tb.Fatalf("%s: not true within %v; last: %s", what, within, last)
}

// StaysTrue asserts that cond holds at every poll for the whole window:
// how a test shows that something does not happen (no restart, no
// readiness). The window is an observation, not a wait for an event.
func StaysTrue(tb testing.TB, window time.Duration, what string, cond func() (bool, string)) {
	tb.Helper()
	for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if ok, detail := cond(); !ok {
			tb.Fatalf("%s: broken: %s", what, detail)
		}
	}
}
