package fakeengine

import (
	"context"
	"net/http"
)

// HangPath is the fake's test hook that freezes the engine (see Hang).
const HangPath = "/debug/hang"

// Hang freezes the engine's loop for good, as a deadlocked engine core or
// a wedged GPU leaves a real engine: from now on every request (health,
// models, metrics, generation) blocks without writing a byte, streams in
// flight emit no further event, and the token counters stop. The process
// stays up and its port open; only a restart ends it, which llmgw's
// supervisor must decide on from probes timing out and counters frozen.
// Blocked requests end when their client leaves or the engine stops.
func (s *Server) Hang() {
	s.hangOnce.Do(func() {
		close(s.hung)
		s.logf("fake engine hung (scripted): every request now blocks")
	})
}

// Hung reports whether Hang was called.
func (s *Server) Hung() bool {
	select {
	case <-s.hung:
		return true
	default:
		return false
	}
}

// step reports whether the engine may take its next step for a request:
// true at once while it runs; once hung, it blocks until ctx ends or the
// engine stops, then reports false.
func (s *Server) step(ctx context.Context) bool {
	if !s.Hung() {
		return true
	}
	s.stuck.Add(1)
	defer s.stuck.Add(-1)
	select {
	case <-ctx.Done():
	case <-s.stopped:
	}
	return false
}

// stop releases every request blocked by Hang; Run calls it before it
// shuts the server down, whose graceful shutdown would otherwise wait on
// them.
func (s *Server) stop() { s.stopOnce.Do(func() { close(s.stopped) }) }

// debugHang is POST /debug/hang. It is a test hook that takes the engine
// down, so when the engine has a key it demands it as a bearer token,
// whatever the personality leaves open; it answers 200 itself, since the
// freeze applies to what comes after it. It works while loading and,
// idempotently, once hung.
func (s *Server) debugHang(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "use POST", badRequest, "")
		return
	}
	if s.cfg.APIKey != "" {
		key, ok := PersonalityNone.presentedKey(r)
		if !ok || !keyMatches(key, s.cfg.APIKey) {
			PersonalityNone.unauthorized(w)
			return
		}
	}
	s.Hang()
	writeJSON(w, http.StatusOK, map[string]bool{"hung": true})
}
