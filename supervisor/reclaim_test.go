package supervisor

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
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

// startHolding starts node "a" of a fresh harness with a holdingRunner,
// after noting a renewal at renewed in its data dir (none when zero);
// adjust, when given, changes the config first.
func startHolding(t *testing.T, renewed time.Time, adjust func(*Config)) (*Node, *holdingRunner, Config) {
	t.Helper()
	cfg := newHarness(t).config("a")
	if !renewed.IsZero() {
		if err := datadir.New(cfg.DataDir).WriteRenewal(renewed); err != nil {
			t.Fatal(err)
		}
	}
	r := &holdingRunner{}
	cfg.Runner = r
	if adjust != nil {
		adjust(&cfg)
	}
	n, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Kill() })
	return n, r, cfg
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
			var at time.Time
			if tt.renewed != 0 {
				at = time.Now().Add(tt.renewed)
			}
			_, r, cfg := startHolding(t, at, nil)
			if got := r.count(); got != tt.want {
				t.Fatalf("%d reclaims at start, want %d", got, tt.want)
			}
			// The loop notes its renewals for the next start.
			testwait.Until(t, 5*time.Second, "a renewal noted on disk", func() (bool, string) {
				at, found, err := datadir.New(cfg.DataDir).ReadRenewal()
				return found && err == nil && at.After(time.Now().Add(-time.Minute)), fmt.Sprint(at, found, err)
			})
		})
	}
}

// A node whose loop did not renew for longer than the TTL (its agent was
// frozen) reclaims what it holds before it plans again.
func TestLeaseGapReclaims(t *testing.T) {
	var skew atomic.Int64
	_, r, cfg := startHolding(t, time.Now(), func(cfg *Config) {
		cfg.Clock = clock.Offset(clock.Real(), func() time.Duration { return time.Duration(skew.Load()) })
	})
	testwait.StaysTrue(t, 2*cfg.LeaseTTL/3, "no reclaim while the node renews", func() (bool, string) {
		return r.count() == 0, fmt.Sprint(r.count(), " reclaims")
	})
	skew.Store(int64(2 * cfg.LeaseTTL)) // as if frozen for two TTLs
	testwait.Until(t, 5*time.Second, "a reclaim after the gap", func() (bool, string) {
		return r.count() == 1, fmt.Sprint(r.count(), " reclaims")
	})
}

// The gap is judged at the renewal itself: a frozen agent may wake on the
// renew tick before any other, and a renewal that did not look back would
// hide the lapse for good (the loop's select picks among ready channels at
// random, so TestLeaseGapReclaims alone passes most runs without it).
func TestARenewalAfterTheTTLReclaimsFirst(t *testing.T) {
	n, r, cfg := startHolding(t, time.Now(), nil)
	n.Kill() // the loop is gone: the renewals below are the only ones
	before := r.count()
	n.renew(time.Now().Add(-cfg.LeaseTTL / 2))
	if got := r.count() - before; got != 0 {
		t.Fatalf("a renewal within the TTL reclaimed %d times", got)
	}
	at := n.renew(time.Now().Add(-2 * cfg.LeaseTTL))
	if got := r.count() - before; got != 1 {
		t.Fatalf("a renewal two TTLs after the last reclaimed %d times, want 1", got)
	}
	if found, ok, err := datadir.New(cfg.DataDir).ReadRenewal(); err != nil || !ok || !found.Equal(at) {
		t.Fatalf("renewal noted on disk: %v %v %v, want %v", found, ok, err, at)
	}
}
