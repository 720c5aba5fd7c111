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
