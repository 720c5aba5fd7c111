package gateway

import (
	"sync"
	"time"
)

// health is passive outlier detection of one engine: what a broken engine
// shows the gateway, counted in a row, ejects it for a while; any answer
// it gives clears the count and lifts the ejection. Busy is not broken:
// only connection failures, 500/502/504 answers and first-byte timeouts
// count (see exchange.forward), and a refused engine key ejects at once.
type health struct {
	mu           sync.Mutex
	failures     int
	ejectedUntil time.Time
}

// ejected reports whether the engine is skipped now.
func (h *health) ejected(now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return now.Before(h.ejectedUntil)
}

// failed counts a failure at now; after failures in a row the engine is
// ejected for ejectFor, and the count starts over. It reports whether this
// call ejected it.
func (h *health) failed(now time.Time, after int, ejectFor time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failures++
	if h.failures >= after {
		h.ejectedUntil = now.Add(ejectFor)
		h.failures = 0
		return true
	}
	return false
}

// eject skips the engine for d from now, at once (an engine that refuses
// the gateway's key will refuse every request).
func (h *health) eject(now time.Time, d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ejectedUntil = now.Add(d)
	h.failures = 0
}

// answered resets the failure count and lifts an ejection: the engine is
// reachable and answers (a request tried it in panic mode, and the first
// byte of an answer came back, or a busy answer).
func (h *health) answered() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failures, h.ejectedUntil = 0, time.Time{}
}
