package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/llmgw/llmgw/supervisor/shardstate"
)

// An engine that an agent of the previous release (9f0749d) left running,
// with its state file in that release's layout (no "protocol" field), is
// adopted by this build: the same pid, no restart, its claim kept.
func TestAdoptsAnEngineOfThePreviousRelease(t *testing.T) {
	env := newRunnerEnv(t)
	r := env.open()
	d := desired("chat")
	runReady(t, r, d)
	pid := readyPID(r, "chat-0")
	claim := r.Shards()[0].ClaimStamp
	r.Close()

	states, bad := shardstate.Read(env.dir.ShardsDir())
	if len(states) != 1 || len(bad) != 0 {
		t.Fatalf("state files: %+v, bad %v", states, bad)
	}
	path := filepath.Join(env.dir.ShardsDir(), "shard-"+shardstate.FileID(states[0])+".json")
	old := previousReleaseLayout(t, path)
	if err := os.WriteFile(path, old, 0o600); err != nil {
		t.Fatal(err)
	}

	r2 := env.open()
	t.Cleanup(func() {
		r2.Reconcile(context.Background(), nil)
		waitShard(t, r2, "stopped", func(s []string) bool { return len(s) == 0 })
	})
	r2.Reconcile(context.Background(), []Desired{d})
	waitShard(t, r2, "the previous release's engine adopted and ready", func([]string) bool { return readyPID(r2, "chat-0") == pid })
	if s := r2.Shards()[0]; s.Restarts != 0 || s.ClaimStamp != claim {
		t.Fatalf("adopted shard %+v; want 0 restarts and claim stamp %d", s, claim)
	}
}

// previousReleaseLayout rewrites the state file at path as 9f0749d wrote
// it: without "protocol", and with no key that release's file did not
// have (checked against the file its own Save wrote, in shardstate's
// testdata).
func previousReleaseLayout(t *testing.T, path string) []byte {
	t.Helper()
	var m, pinned map[string]any
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Numbers stay as written: a claim stamp does not fit a float64.
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	p, err := os.ReadFile("../shardstate/testdata/9f0749d/shard-chat-0-abc123def456.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(p, &pinned); err != nil {
		t.Fatal(err)
	}
	if m["protocol"] != json.Number("2") {
		t.Fatalf("this build wrote protocol %v, want 2", m["protocol"])
	}
	delete(m, "protocol")
	for k := range m {
		if _, ok := pinned[k]; !ok {
			t.Fatalf("key %q is not in the previous release's layout %v", k, slices.Sorted(maps.Keys(pinned)))
		}
	}
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return out
}
