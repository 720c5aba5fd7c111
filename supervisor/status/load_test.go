package status

import (
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
)

// Totals sum the shards with a reading; KV cache is their mean and the
// prefix-cache hit rate is weighted by each engine's lookups.
func TestLoadTotalsSumReadingsAndWeighHits(t *testing.T) {
	at := time.Unix(1000, 0)
	shards := []ShardInfo{
		{Deployment: "chat", Load: gossip.ShardLoad{Running: 3, Waiting: 1, KVCacheUsage: 0.2, RatesValid: true, PromptTPS: 100, GenerationTPS: 10,
			PrefixHitRate: 1, PrefixQueriesPS: 300, ScrapedAt: at}},
		{Deployment: "chat", Load: gossip.ShardLoad{Running: 2, KVCacheUsage: 0.6, PrefixHitRate: 0, PrefixQueriesPS: 100, ScrapedAt: at}},
		{Deployment: "chat", Load: gossip.ShardLoad{Running: 50, ScrapedAt: at, Error: "connection refused"}}, // a failed read
		{Deployment: "chat", Load: gossip.ShardLoad{Running: 50}},                                             // never read
		{Deployment: "idle"},
	}
	got := LoadTotals(shards)
	c := got["chat"]
	if c.Running != 5 || c.Waiting != 1 || c.Engines != 2 || !c.Rates || c.PromptTPS != 100 || c.GenerationTPS != 10 {
		t.Fatalf("chat: %+v", c)
	}
	if kv := c.KVCacheUsage(); kv < 0.3999 || kv > 0.4001 {
		t.Errorf("KV %v, want the mean 0.4", kv)
	}
	if r, ok := c.PrefixHitRate(); !ok || r != 0.75 {
		t.Errorf("hit rate %v %v, want 0.75 (300 of 400 lookups)", r, ok)
	}
	if _, ok := got["idle"]; ok {
		t.Errorf("a deployment without readings has a total: %+v", got["idle"])
	}
	if _, ok := (LoadTotal{}).PrefixHitRate(); ok {
		t.Error("a hit rate without lookups")
	}
}

// An engine that does not export its KV usage (llama.cpp) counts as
// unknown: it stays out of the mean, and a deployment of such engines only
// says its KV usage is unknown rather than 0.
func TestUnknownKVUsageIsNotZero(t *testing.T) {
	at := time.Unix(1000, 0)
	unknown := []string{gossip.ReadingKVCache}
	got := LoadTotals([]ShardInfo{
		{Deployment: "mixed", Load: gossip.ShardLoad{Running: 1, KVCacheUsage: 0.8, ScrapedAt: at}},
		{Deployment: "mixed", Load: gossip.ShardLoad{Running: 1, ScrapedAt: at, Unknown: unknown}},
		{Deployment: "gguf", Load: gossip.ShardLoad{Running: 2, ScrapedAt: at, Unknown: unknown}},
	})
	if m := got["mixed"]; !m.KVKnown() || m.KVCacheUsage() != 0.8 || m.Engines != 2 {
		t.Errorf("mixed: KV %v known %v over %d engines, want 0.8 from the one that exports it", m.KVCacheUsage(), m.KVKnown(), m.Engines)
	}
	if g := got["gguf"]; g.KVKnown() || g.Running != 2 {
		t.Errorf("gguf: KV known %v, running %v: want unknown, 2", g.KVKnown(), g.Running)
	}
}
