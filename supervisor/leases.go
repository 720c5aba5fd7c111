package supervisor

import (
	"log/slog"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/supervisor/datadir"
)

// leaseKeeper is this node's side of its leases: it renews them, notes
// each renewal on disk so that a restarted agent can tell whether they
// lapsed while it was away, and makes the runner claim afresh what it
// holds once they lapsed. The control loop owns it (Start uses it once,
// before the loop runs).
type leaseKeeper struct {
	ttl    time.Duration
	clock  clock.Clock
	log    *slog.Logger
	runner Runner
	dir    datadir.Dir
	// warned: a failed note of the renewal on disk was logged.
	warned bool
}

// renew renews this node's leases (beat: the record's renewal) and notes
// when on disk. It returns the time of the renewal.
//
// A gap longer than the TTL since the last renewal (the agent was frozen,
// or starved) means this node's leases lapsed in every other node's view
// meanwhile, and its shards may run elsewhere now: it reclaims them before
// it renews. The check lives here, not only at the top of the loop,
// because a frozen agent may wake on the renew tick first, and a renewal
// that went unchecked would hide the gap for good.
func (k *leaseKeeper) renew(last time.Time, beat func()) time.Time {
	now := k.clock.Now()
	if gap := now.Sub(last); gap > k.ttl {
		k.reclaim("no renewal for " + gap.Round(time.Millisecond).String())
	}
	beat()
	if err := k.dir.WriteRenewal(now); err != nil && !k.warned {
		k.warned = true
		k.log.Warn("cannot note the lease renewal on disk; after a restart this node's engines will claim afresh", "err", err)
	}
	return now
}

// reclaimIfLapsed reclaims, at a start at started, what an earlier agent
// left running when its leases lapsed while no agent ran: it last renewed
// longer than the TTL ago, or did not say when.
func (k *leaseKeeper) reclaimIfLapsed(started time.Time) {
	last, found, err := k.dir.ReadRenewal()
	switch away := started.Sub(last); {
	case err != nil:
		k.reclaim("the last renewal is unknown: " + err.Error())
	case !found:
		k.reclaim("no renewal noted")
	case away > k.ttl:
		k.reclaim("last renewal " + away.Round(time.Millisecond).String() + " before this start")
	}
}

// reclaim makes the runner claim what it holds afresh (see engine.Runner.
// Reclaim): this node's leases lapsed, so the cluster may have started
// replacements, and a copy that stayed valid must win over this node's.
func (k *leaseKeeper) reclaim(why string) {
	r, ok := k.runner.(reclaimer)
	if !ok || len(k.runner.Shards()) == 0 {
		return
	}
	k.log.Warn("this node's leases lapsed; its engines claim their shards afresh, so copies that stayed valid elsewhere keep them", "why", why)
	r.Reclaim(k.clock.Now())
}
