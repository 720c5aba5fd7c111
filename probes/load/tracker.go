package load

import (
	"math"
	"sync"
	"time"
)

// Load is an engine's load as the node reports it; its JSON matches the
// gossip record's.
type Load struct {
	Running      float64 `json:"running"`
	Waiting      float64 `json:"waiting"`
	KVCacheUsage float64 `json:"kv_cache_usage"`
	// PromptTPS and GenerationTPS are tokens per second since the previous
	// sample. They are apart on purpose: a long prefill shows as prompt
	// tokens with generation at zero, which is what tells a busy engine
	// from a stalled one.
	PromptTPS     float64 `json:"prompt_tokens_per_s"`
	GenerationTPS float64 `json:"generation_tokens_per_s"`
	// RatesValid is false when there is no previous sample to difference
	// against: the first sample of an engine, or the first after it
	// restarted. The rates are then 0, which is not the same as idle.
	RatesValid bool `json:"rates_valid"`
	// PrefixHitRate is the share of prompt tokens looked up in the prefix
	// cache since the previous sample that it held, and PrefixQueriesPS
	// how many were looked up per second (the weight of the rate when
	// engines are summed). Both 0 without lookups or without rates.
	PrefixHitRate   float64   `json:"prefix_cache_hit_rate,omitempty"`
	PrefixQueriesPS float64   `json:"prefix_cache_queries_per_s,omitempty"`
	ScrapedAt       time.Time `json:"scraped_at,omitzero"`
	Error           string    `json:"error,omitempty"`
	// Unknown names the readings the engine's page does not give (see
	// Sample.Unknown): their figures above are 0 for want of a value, and
	// are shown as unknown, never as 0.
	Unknown []string `json:"unknown,omitempty"`
}

// Tracker keeps the previous sample of each engine and computes token rates
// from counter deltas. It is safe for concurrent use.
type Tracker struct {
	mu   sync.Mutex
	prev map[string]Sample
}

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker { return &Tracker{prev: make(map[string]Sample)} }

// Observe records engine's sample and returns its load.
//
//   - First sample: it becomes the baseline; no rates.
//   - A counter went down, or the start time changed: the engine restarted
//     and its counters began again at zero. The difference would be
//     negative or meaningless, so the sample becomes the new baseline and
//     there are no rates this time.
//   - The clock did not advance since the baseline (two scrapes stamped
//     alike, or a clock step backwards): no rates, and the baseline is kept
//     so the next sample is measured over a real interval.
//   - Otherwise: rates over the interval, and the sample is the new
//     baseline.
func (t *Tracker) Observe(engine string, s Sample) Load {
	l := Load{Running: s.Running, Waiting: s.Waiting, KVCacheUsage: s.KVCacheUsage, ScrapedAt: s.At, Unknown: s.Unknown}
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.prev[engine]
	switch {
	case !ok || restarted(p, s):
		t.prev[engine] = s
	case !s.At.After(p.At):
	default:
		dt := s.At.Sub(p.At).Seconds()
		pr := (s.PromptTokens - p.PromptTokens) / dt
		gr := (s.GenerationTokens - p.GenerationTokens) / dt
		t.prev[engine] = s
		// Only absurd pages (counters near MaxFloat64) overflow; a Load
		// must stay JSON-encodable.
		if !math.IsInf(pr, 0) && !math.IsInf(gr, 0) {
			l.PromptTPS, l.GenerationTPS, l.RatesValid = pr, gr, true
		}
		if dq := s.PrefixQueries - p.PrefixQueries; dq > 0 && !math.IsInf(dq, 0) {
			dh := s.PrefixHits - p.PrefixHits
			l.PrefixHitRate = min(max(dh/dq, 0), 1)
			l.PrefixQueriesPS = dq / dt
		}
	}
	return l
}

func restarted(p, s Sample) bool {
	if s.PromptTokens < p.PromptTokens || s.GenerationTokens < p.GenerationTokens ||
		s.PrefixHits < p.PrefixHits || s.PrefixQueries < p.PrefixQueries {
		return true
	}
	return p.StartTime != 0 && s.StartTime != 0 && p.StartTime != s.StartTime
}

// Failed returns the load of an engine whose scrape failed at at. The
// baseline is kept: if the engine comes back without restarting, the next
// rate covers the whole gap; if it restarted, Observe sees that.
func (t *Tracker) Failed(engine string, at time.Time, err error) Load {
	return Load{ScrapedAt: at, Error: err.Error()}
}

// Forget drops an engine's baseline, for engines that are gone.
func (t *Tracker) Forget(engine string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.prev, engine)
}
