package status

import "github.com/llmgw/llmgw/gossip"

// LoadTotal is one deployment's engine load summed over its shards that
// have a reading (the read model gives load only under a valid lease, and
// engines are scraped only while ready), as the page and `llmgw top` show
// it.
type LoadTotal struct {
	Running, Waiting float64
	// Engines is how many shards had a reading; kvSum over kvEngines (those
	// that export it) is the mean KV cache usage.
	Engines   int
	kvSum     float64
	kvEngines int
	// PromptTPS and GenerationTPS sum the shards with valid rates; Rates
	// says there was at least one.
	PromptTPS, GenerationTPS float64
	Rates                    bool
	// PrefixQueriesPS is the prompt tokens looked up in the engines'
	// prefix caches per second, prefixHitsPS those found.
	PrefixQueriesPS float64
	prefixHitsPS    float64
}

// KVCacheUsage is the shards' mean KV cache usage (0-1) over the engines
// that export it, 0 without readings (KVKnown says which).
func (t LoadTotal) KVCacheUsage() float64 {
	if t.kvEngines == 0 {
		return 0
	}
	return t.kvSum / float64(t.kvEngines)
}

// KVKnown reports whether any engine of the deployment exports its KV
// cache usage (llama.cpp's does not): without, the usage is unknown, not 0.
func (t LoadTotal) KVKnown() bool { return t.kvEngines > 0 }

// PrefixHitRate is the share of looked-up prompt tokens the prefix caches
// held, each engine weighted by its lookups; false without lookups.
func (t LoadTotal) PrefixHitRate() (float64, bool) {
	if t.PrefixQueriesPS <= 0 {
		return 0, false
	}
	return t.prefixHitsPS / t.PrefixQueriesPS, true
}

// LoadTotals sums the shards' load per deployment. A deployment none of
// whose shards has a reading is absent.
func LoadTotals(shards []ShardInfo) map[string]LoadTotal {
	out := map[string]LoadTotal{}
	for _, s := range shards {
		l := s.Load
		if l.ScrapedAt.IsZero() || l.Error != "" {
			continue
		}
		t := out[s.Deployment]
		t.Running += l.Running
		t.Waiting += l.Waiting
		if l.Knows(gossip.ReadingKVCache) {
			t.kvSum += l.KVCacheUsage
			t.kvEngines++
		}
		t.Engines++
		if l.RatesValid {
			t.PromptTPS += l.PromptTPS
			t.GenerationTPS += l.GenerationTPS
			t.Rates = true
		}
		t.prefixHitsPS += l.PrefixHitRate * l.PrefixQueriesPS
		t.PrefixQueriesPS += l.PrefixQueriesPS
		out[s.Deployment] = t
	}
	return out
}
