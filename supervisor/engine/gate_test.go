package engine

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
)

// shardByID is the record of shard id, if the runner reports it.
func shardByID(r *Runner, id string) (gossip.ShardRecord, bool) {
	for _, s := range r.Shards() {
		if s.ShardID == id {
			return s, true
		}
	}
	return gossip.ShardRecord{}, false
}

// Two engines placed on one GPU start one after the other: the second
// waits, saying for whom, while the first is starting (here it never gets
// ready), and starts once the first held the gate for startGateMax. An
// engine on another GPU does not wait.
func TestEnginesOnOneGPUStartOneAfterTheOther(t *testing.T) {
	env := newRunnerEnv(t)
	r, f := env.openFake(func(c *Config) {})
	defer func() {
		f.stopAll(r)
		r.Close()
	}()
	a, b, c := desired("a", "--fail-health"), desired("b", "--fail-health"), desired("c", "--fail-health")
	c.GPUs = []int{1}
	r.Reconcile(context.Background(), []Desired{a, b, c})
	var first, second gossip.ShardRecord
	f.until("one engine of GPU 0 started, the other waiting for it", func() (bool, string) {
		sa, _ := shardByID(r, "a-0")
		sb, _ := shardByID(r, "b-0")
		sc, _ := shardByID(r, "c-0")
		first, second = sa, sb
		if sb.PID > 0 {
			first, second = sb, sa
		}
		ok := first.PID > 0 && sc.PID > 0 && strings.HasPrefix(second.Note, "waiting for ")
		return ok, fmt.Sprintf("a %d %q; b %d %q; c %d %q", sa.PID, sa.Note, sb.PID, sb.Note, sc.PID, sc.Note)
	})
	if second.PID != 0 {
		t.Fatalf("%s started (pid %d) while %s was starting on the same GPU", second.ShardID, second.PID, first.ShardID)
	}
	want := fmt.Sprintf("waiting for %s-%s to finish starting on GPU 0", first.ShardID, first.SpecVersion)
	if second.Note != want {
		t.Fatalf("note %q, want %q", second.Note, want)
	}
	// Polls go by: still one at a time.
	for range 5 {
		f.advance(1, f.poll)
		if s, _ := shardByID(r, second.ShardID); s.PID != 0 {
			t.Fatalf("%s started while %s was still starting", second.ShardID, first.ShardID)
		}
	}
	f.clk.Advance(startGateMax)
	f.until(second.ShardID+" started after the gate's bound", func() (bool, string) {
		s, _ := shardByID(r, second.ShardID)
		return s.PID > 0 && !strings.HasPrefix(s.Note, "waiting for "), fmt.Sprintf("pid %d note %q", s.PID, s.Note)
	})
}

// The second engine starts as soon as the first is ready: at no moment
// are both started and neither ready.
func TestSecondEngineStartsWhenTheFirstIsReady(t *testing.T) {
	env := newRunnerEnv(t)
	r, f := env.openFake(func(c *Config) {})
	defer func() {
		f.stopAll(r)
		r.Close()
	}()
	r.Reconcile(context.Background(), []Desired{desired("a"), desired("b")})
	f.until("both ready", func() (bool, string) {
		sa, _ := shardByID(r, "a-0")
		sb, _ := shardByID(r, "b-0")
		if sa.PID > 0 && sb.PID > 0 && !sa.Ready && !sb.Ready {
			t.Fatalf("both started and neither ready: a %+v, b %+v", sa, sb)
		}
		return sa.Ready && sb.Ready, fmt.Sprintf("a %v %q; b %v %q", sa.Ready, sa.Note, sb.Ready, sb.Note)
	})
}

func TestStartGate(t *testing.T) {
	g := newStartGate()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if w := g.acquire("a", []int{0, 1}, t0); w != "" {
		t.Fatal(w)
	}
	if w := g.acquire("b", []int{2, 1}, t0); w != "waiting for a to finish starting on GPU 1" {
		t.Fatalf("b: %q", w)
	}
	if w := g.acquire("c", []int{2}, t0); w != "" {
		t.Fatalf("c on a GPU b did not take: %q", w)
	}
	g.release("a")
	if w := g.acquire("b", []int{1}, t0); w != "" {
		t.Fatalf("b after a's release: %q", w)
	}
	if w := g.acquire("d", []int{1}, t0.Add(startGateMax)); w != "" {
		t.Fatalf("d after b held GPU 1 for startGateMax: %q", w)
	}
}
