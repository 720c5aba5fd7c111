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
// readiness). The window is an observation, not a wait for an event, so
// on its own it proves nothing on a machine too slow for the event to
// come: pair it with BreaksWithin on a build where the event is made to
// happen (the negative control).
func StaysTrue(tb testing.TB, window time.Duration, what string, cond func() (bool, string)) {
	tb.Helper()
	if broken, detail := breaks(window, cond); broken {
		tb.Fatalf("%s: broken: %s", what, detail)
	}
}

// BreaksWithin is StaysTrue's negative control: it asserts that cond
// stops holding within the window, on a setup where the thing StaysTrue
// watches for is made to happen. A window too short for the system to
// act in fails here, instead of passing StaysTrue without proof.
func BreaksWithin(tb testing.TB, window time.Duration, what string, cond func() (bool, string)) {
	tb.Helper()
	if broken, detail := breaks(window, cond); !broken {
		tb.Fatalf("%s: the negative control held for all of %v (last: %s): the window cannot see the event it guards against", what, window, detail)
	}
}

// breaks polls cond over window and reports whether it ever failed, with
// its detail then (or its last detail).
func breaks(window time.Duration, cond func() (bool, string)) (bool, string) {
	var last string
	for end := time.Now().Add(window); ; time.Sleep(20 * time.Millisecond) {
		ok, detail := cond()
		if !ok {
			return true, detail
		}
		last = detail
		if !time.Now().Before(end) {
			return false, last
		}
	}
}
