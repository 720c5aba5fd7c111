package gateway

import (
	"slices"
	"sync"
	"time"
)

// ModelStats is one deployment's recent traffic through this gateway, for
// `llmgw top`.
type ModelStats struct {
	Model string `json:"model"`
	// Requests is how many requests arrived within Window, and Rate the
	// same per second.
	Requests int           `json:"requests"`
	Rate     float64       `json:"rate"`
	Window   time.Duration `json:"window"`
	// Errors counts the 5xx answers among them.
	Errors int `json:"errors"`
	// TTFBP50 and TTFBP99 are the time to first byte of the answered
	// requests (2xx) among them; zero when there were none.
	TTFBP50 time.Duration `json:"ttfb_p50"`
	TTFBP99 time.Duration `json:"ttfb_p99"`
}

// statsRing is how many recent requests are kept per deployment. Past it,
// the window shrinks to what the ring holds, so memory stays fixed at any
// request rate.
const statsRing = 2048

type sample struct {
	at     time.Time
	ttfb   time.Duration
	status int
}

type modelRing struct {
	mu   sync.Mutex
	buf  [statsRing]sample
	next int
	full bool
}

// stats keeps, per deployment, a ring of its recent requests.
type stats struct {
	window time.Duration
	mu     sync.RWMutex
	models map[string]*modelRing
}

func newStats(window time.Duration) *stats {
	return &stats{window: window, models: map[string]*modelRing{}}
}

func (s *stats) record(model string, at time.Time, ttfb time.Duration, status int) {
	s.mu.RLock()
	r := s.models[model]
	s.mu.RUnlock()
	if r == nil {
		s.mu.Lock()
		if r = s.models[model]; r == nil {
			r = &modelRing{}
			s.models[model] = r
		}
		s.mu.Unlock()
	}
	r.mu.Lock()
	r.buf[r.next] = sample{at: at, ttfb: ttfb, status: status}
	r.next++
	if r.next == statsRing {
		r.next, r.full = 0, true
	}
	r.mu.Unlock()
}

// forget drops deployments that no longer exist.
func (s *stats) forget(keep func(model string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for m := range s.models {
		if !keep(m) {
			delete(s.models, m)
		}
	}
}

// rates is the requests/s of each deployment over window up to now (over
// the span the ring covers, when it does not reach back that far).
func (s *stats) rates(now time.Time, window time.Duration) map[string]float64 {
	s.mu.RLock()
	rings := make(map[string]*modelRing, len(s.models))
	for m, r := range s.models {
		rings[m] = r
	}
	s.mu.RUnlock()
	out := make(map[string]float64, len(rings))
	from := now.Add(-window)
	for m, r := range rings {
		count, oldest := 0, now
		r.mu.Lock()
		n := r.next
		if r.full {
			n = statsRing
		}
		for i := range n {
			at := r.buf[i].at
			if at.Before(from) || at.After(now) {
				continue
			}
			count++
			if at.Before(oldest) {
				oldest = at
			}
		}
		full := r.full
		r.mu.Unlock()
		span := window
		if full && count == statsRing && now.Sub(oldest) > 0 {
			span = now.Sub(oldest)
		}
		if count > 0 {
			out[m] = float64(count) / span.Seconds()
		}
	}
	return out
}

// published is Gateway.Rates: per deployment the higher of the rates over
// rateWindow and over rateRise.
func (s *stats) published(now time.Time) map[string]float64 {
	out := s.rates(now, rateWindow)
	for m, r := range s.rates(now, rateRise) {
		out[m] = max(out[m], r)
	}
	return out
}

func (s *stats) snapshot(now time.Time) []ModelStats { return s.over(now, s.window) }

// over is the traffic within window of now.
func (s *stats) over(now time.Time, window time.Duration) []ModelStats {
	s.mu.RLock()
	names := make([]string, 0, len(s.models))
	rings := make(map[string]*modelRing, len(s.models))
	for m, r := range s.models {
		names = append(names, m)
		rings[m] = r
	}
	s.mu.RUnlock()
	slices.Sort(names)
	out := make([]ModelStats, 0, len(names))
	from := now.Add(-window)
	for _, m := range names {
		r := rings[m]
		ms := ModelStats{Model: m, Window: window}
		var ttfbs []time.Duration
		oldest := now
		r.mu.Lock()
		n := r.next
		if r.full {
			n = statsRing
		}
		for i := range n {
			sm := r.buf[i]
			if sm.at.Before(from) || sm.at.After(now) {
				continue
			}
			ms.Requests++
			if sm.at.Before(oldest) {
				oldest = sm.at
			}
			if sm.status >= 500 {
				ms.Errors++
			}
			if sm.status >= 200 && sm.status < 300 && sm.ttfb > 0 {
				ttfbs = append(ttfbs, sm.ttfb)
			}
		}
		full := r.full
		r.mu.Unlock()
		// A full ring may not reach back over the whole window: the rate
		// is then over the span it does cover.
		if full && ms.Requests == statsRing && now.Sub(oldest) > 0 {
			ms.Window = now.Sub(oldest)
		}
		if ms.Window > 0 {
			ms.Rate = float64(ms.Requests) / ms.Window.Seconds()
		}
		if len(ttfbs) > 0 {
			slices.Sort(ttfbs)
			ms.TTFBP50 = quantile(ttfbs, 0.50)
			ms.TTFBP99 = quantile(ttfbs, 0.99)
		}
		out = append(out, ms)
	}
	return out
}

// quantile of sorted values, nearest rank.
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
