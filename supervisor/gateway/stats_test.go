package gateway

import (
	"testing"
	"time"
)

// Rates counts the requests of the last window per deployment, and when the
// ring no longer reaches back that far, over the span it holds.
func TestRatesCountTheWindow(t *testing.T) {
	s := newStats(time.Minute)
	for i := range 50 { // 5 req/s over the last 10 s
		s.record("chat", t0.Add(-time.Duration(i)*200*time.Millisecond), time.Millisecond, 200)
	}
	s.record("chat", t0.Add(-11*time.Second), time.Millisecond, 200) // before the window
	s.record("old", t0.Add(-30*time.Second), time.Millisecond, 200)
	got := s.rates(t0, 10*time.Second)
	if got["chat"] != 5 {
		t.Errorf("chat: %v req/s, want 5", got["chat"])
	}
	if _, ok := got["old"]; ok || len(got) != 1 {
		t.Errorf("rates %v: want chat alone (old sent nothing within the window)", got)
	}
	// A full ring of 2,048 requests within the last second: the window is
	// the second it covers, not 10 s.
	for i := range statsRing {
		s.record("busy", t0.Add(-time.Duration(i)*time.Second/statsRing), time.Millisecond, 200)
	}
	if r := s.rates(t0, 10*time.Second)["busy"]; r < 2000 || r > 2100 {
		t.Errorf("busy: %v req/s, want about 2,048", r)
	}
	if r := newStats(time.Minute).rates(t0, 10*time.Second); r == nil || len(r) != 0 {
		t.Errorf("no traffic: %v, want an empty map", r)
	}
}

// What a gateway publishes follows a rise within the short window: a door
// whose traffic began a second ago at 20 req/s reads 10 req/s (20
// requests over 2 s), not the long window's 2, and a door whose traffic
// stopped keeps the long window's figure while it decays.
func TestPublishedRatesFollowARiseAtOnce(t *testing.T) {
	s := newStats(time.Minute)
	for i := range 20 { // 20 req/s for the last second
		s.record("rising", t0.Add(-time.Duration(i)*50*time.Millisecond), time.Millisecond, 200)
	}
	for i := range 40 { // 5 req/s for 8 s, then nothing for the last 2 s
		s.record("falling", t0.Add(-2*time.Second-time.Duration(i)*200*time.Millisecond), time.Millisecond, 200)
	}
	got := s.published(t0)
	if got["rising"] != 10 {
		t.Errorf("rising: %v req/s, want 10 (the short window's)", got["rising"])
	}
	if got["falling"] != 4 {
		t.Errorf("falling: %v req/s, want 4 (the long window's 40 requests over 10 s)", got["falling"])
	}
}
