package engine

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// missingMetrics counts, by metric name, the engines that did not export
// a metric their profile reads (llmgw_engine_missing_metrics_total). A
// missing metric is no failure: the reading is unknown (load.Sample's
// Unknown), and an engine release that renamed or dropped it (llama.cpp's
// llamacpp:kv_cache_usage_ratio, PR #13660) must be said, not shown as 0.
type missingMetrics struct {
	mu    sync.Mutex
	count map[string]uint64
}

// add counts names once for one engine.
func (m *missingMetrics) add(names []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.count == nil {
		m.count = map[string]uint64{}
	}
	for _, n := range names {
		m.count[n]++
	}
}

// snapshot is a copy of the counts.
func (m *missingMetrics) snapshot() map[string]uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.count)
}

// sawMissing records the metrics a scrape of e's page lacked and returns
// those not reported for e before: each is reported once per engine (one
// log line, one count), not at every scrape. e.mu must not be held.
func (e *managed) sawMissing(names []string, now time.Time) (fresh []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, n := range names {
		if !slices.Contains(e.missing, n) {
			e.missing = append(e.missing, n)
			fresh = append(fresh, n)
		}
	}
	if len(fresh) > 0 && e.missingAt.IsZero() {
		e.missingAt = now
	}
	return fresh
}

// missingNoteLocked is what e's record says of its missing metrics when
// nothing else is to be said (the note of a starting or unroutable engine
// wins: that one is what an operator must act on). e.mu is held.
func (e *managed) missingNoteLocked() string {
	if len(e.missing) == 0 {
		return ""
	}
	return "metrics not exported (shown unknown): " + strings.Join(e.missing, ", ")
}
