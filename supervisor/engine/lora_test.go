package engine

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

// shardRecord is r's record of shard id (zero when it holds none).
func shardRecord(r *Runner, id string) gossip.ShardRecord {
	for _, s := range r.Shards() {
		if s.ShardID == id {
			return s
		}
	}
	return gossip.ShardRecord{}
}

// A ready engine gets its deployment's adapters registered through its
// own endpoints (the fake speaks vLLM's); the record says what the
// engine's models list names, not what was asked: an adapter whose path
// is missing is reported with the engine's words, retried with a backoff
// (and registered once the path exists), and the engine stays ready. A
// new list (out of the spec version) adds and removes adapters with no
// restart.
func TestAdaptersFollowTheSpecWithoutARestart(t *testing.T) {
	env := newRunnerEnv(t)
	weights := t.TempDir()
	for _, dir := range []string{"sql", "code"} {
		if err := os.MkdirAll(filepath.Join(weights, "adapters", dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r, f := env.openFake(func(c *Config) { c.WeightsDir = weights })
	defer func() {
		f.stopAll(r)
		r.Close()
	}()
	d := desired("chat")
	d.Spec.MaxLoras = 2
	d.Spec.Adapters = []placement.Adapter{{Name: "sql", Source: "adapters/sql"}, {Name: "late", Source: "adapters/late"}}
	d.SpecVersion = d.Spec.SpecVersion()
	f.runReady(r, d)
	pid := readyPID(r, d.ShardID)
	look := func(what string, cond func(s gossip.ShardRecord) bool) {
		t.Helper()
		f.until(what, func() (bool, string) {
			s := shardRecord(r, d.ShardID)
			return cond(s), fmt.Sprintf("ready=%v adapters=%v errors=%+v", s.Ready, s.Adapters, s.AdapterErrors)
		})
	}
	look("sql registered, late failing with the engine's words", func(s gossip.ShardRecord) bool {
		return s.Ready && slices.Equal(s.Adapters, []string{"sql"}) && len(s.AdapterErrors) == 1 &&
			s.AdapterErrors[0].Name == "late" && strings.Contains(s.AdapterErrors[0].Error, "404: Loading lora late failed: No adapter found for adapters/late")
	})
	// No such directory in the weights dir: the source went as a hub id,
	// for the engine to resolve. The directory appears: the next try,
	// after the backoff, registers it from there.
	if err := os.MkdirAll(filepath.Join(weights, "adapters", "late"), 0o755); err != nil {
		t.Fatal(err)
	}
	look("late registered on a retry", func(s gossip.ShardRecord) bool {
		return slices.Equal(s.Adapters, []string{"late", "sql"}) && len(s.AdapterErrors) == 0
	})
	// Placed again with another list: same spec version, same engine.
	d.Spec.Adapters = []placement.Adapter{{Name: "code", Source: "adapters/code"}, {Name: "late", Source: "adapters/late"}}
	if d.Spec.SpecVersion() != d.SpecVersion {
		t.Fatal("the adapter list changed the spec version")
	}
	r.Reconcile(t.Context(), []Desired{d})
	look("sql dropped, code added", func(s gossip.ShardRecord) bool {
		return slices.Equal(s.Adapters, []string{"code", "late"})
	})
	if got := readyPID(r, d.ShardID); got != pid {
		t.Errorf("the engine restarted for an adapter change: pid %d, then %d", pid, got)
	}
}
