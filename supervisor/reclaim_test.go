package supervisor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/engine"
)

// holdingRunner holds one shard and notes every Reclaim.
type holdingRunner struct {
	mu       sync.Mutex
	reclaims []time.Time
}

func (h *holdingRunner) Reconcile(context.Context, []engine.Desired) {}
func (h *holdingRunner) Shards() []gossip.ShardRecord {
	return []gossip.ShardRecord{{ShardID: "chat-0", ReplicaID: "chat-0", Deployment: "chat", SpecVersion: "v1", Status: gossip.ShardReady, Ready: true}}
}
func (h *holdingRunner) Changes() <-chan struct{} { return nil }
func (h *holdingRunner) OwnPIDs() []int           { return nil }
func (h *holdingRunner) Reclaim(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reclaims = append(h.reclaims, now)
}

func (h *holdingRunner) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.reclaims)
}

// startHolding starts node "a" of a fresh harness on the fake clock clk
// with a holdingRunner, after noting a renewal at renewed in its data dir
// (none when zero).
func startHolding(t *testing.T, clk *clock.Fake, renewed time.Time) (*Node, *holdingRunner, Config) {
	t.Helper()
	cfg := newHarness(t).config("a")
	cfg.Clock = clk
	if !renewed.IsZero() {
		if err := datadir.New(cfg.DataDir).WriteRenewal(renewed); err != nil {
			t.Fatal(err)
		}
	}
	r := &holdingRunner{}
	cfg.Runner = r
	n, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Kill() })
	return n, r, cfg
}

// loopArmed returns once n's control loop has made a pass since the call:
// it made its tickers before its first pass, so a test may advance the
// fake clock then, and they fire. (Counting the clock's waiters would
// count the other loops' too, armed in any order.)
func loopArmed(t *testing.T, n *Node) {
	t.Helper()
	next := n.Published()
	n.control.wake.poke()
	select {
	case <-next:
	case <-time.After(5 * time.Second):
		t.Fatal("the control loop made no pass within 5s of being woken")
	}
}

// renewedAt waits until the renewal noted in dir is at, the fake clock's
// now after an advance: the loop renewed on its tick.
func renewedAt(t *testing.T, dir string, at time.Time) {
	t.Helper()
	testwait.Until(t, 5*time.Second, "a renewal at "+at.Format(time.RFC3339Nano)+" noted on disk", func() (bool, string) {
		got, found, err := datadir.New(dir).ReadRenewal()
		return found && err == nil && got.Equal(at), fmt.Sprint(got, found, err)
	})
}

// An agent that starts longer than the lease TTL after the last renewal
// noted in its data dir (or with none noted) has lost its leases: what it
// adopts claims afresh. A quick restart keeps its claims.
func TestRestartAfterTheTTLReclaims(t *testing.T) {
	for _, tt := range []struct {
		name    string
		renewed time.Duration // before the start; 0: nothing noted
		want    int
	}{
		{"renewed just before", -100 * time.Millisecond, 0},
		{"renewed a minute before", -time.Minute, 1},
		{"no renewal noted", 0, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := clock.NewFake(time.Now())
			var at time.Time
			if tt.renewed != 0 {
				at = clk.Now().Add(tt.renewed)
			}
			n, r, cfg := startHolding(t, clk, at)
			if got := r.count(); got != tt.want {
				t.Fatalf("%d reclaims at start, want %d", got, tt.want)
			}
			// The loop notes its renewals for the next start.
			loopArmed(t, n)
			clk.Advance(cfg.LeaseTTL / 3)
			renewedAt(t, cfg.DataDir, clk.Now())
		})
	}
}

// A node whose loop did not renew for longer than the TTL (its agent was
// frozen) reclaims what it holds before it plans again; while it renews
// on time, it never does.
func TestLeaseGapReclaims(t *testing.T) {
	clk := clock.NewFake(time.Now())
	n, r, cfg := startHolding(t, clk, clk.Now())
	loopArmed(t, n)
	// Two TTLs of renewals on the renew tick: no gap, no reclaim.
	for range 6 {
		clk.Advance(cfg.LeaseTTL / 3)
		renewedAt(t, cfg.DataDir, clk.Now())
		if got := r.count(); got != 0 {
			t.Fatalf("%d reclaims while the node renews every TTL/3", got)
		}
	}
	clk.Advance(2 * cfg.LeaseTTL) // as if frozen for two TTLs
	testwait.Until(t, 5*time.Second, "a reclaim after the gap", func() (bool, string) {
		return r.count() == 1, fmt.Sprint(r.count(), " reclaims")
	})
	renewedAt(t, cfg.DataDir, clk.Now())
	if got := r.count(); got != 1 {
		t.Fatalf("%d reclaims after one gap, want 1", got)
	}
}

// The gap is judged at the renewal itself: a frozen agent may wake on the
// renew tick before any other, and a renewal that did not look back would
// hide the lapse for good (the loop's select picks among ready channels at
// random, so TestLeaseGapReclaims alone passes most runs without it).
func TestARenewalAfterTheTTLReclaimsFirst(t *testing.T) {
	const ttl = 3 * time.Second
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	r := &holdingRunner{}
	dir := datadir.New(t.TempDir())
	k := &leaseKeeper{ttl: ttl, clock: clk, log: slog.New(slog.NewTextHandler(io.Discard, nil)), runner: r, dir: dir}
	beats := 0
	beat := func() { beats++ }
	k.renew(clk.Now().Add(-ttl/2), beat)
	if got := r.count(); got != 0 {
		t.Fatalf("a renewal within the TTL reclaimed %d times", got)
	}
	at := k.renew(clk.Now().Add(-2*ttl), beat)
	if got := r.count(); got != 1 {
		t.Fatalf("a renewal two TTLs after the last reclaimed %d times, want 1", got)
	}
	if beats != 2 {
		t.Fatalf("%d renewals sent, want 2", beats)
	}
	if found, ok, err := dir.ReadRenewal(); err != nil || !ok || !found.Equal(at) {
		t.Fatalf("renewal noted on disk: %v %v %v, want %v", found, ok, err, at)
	}
}
