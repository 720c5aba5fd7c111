package supervisor

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/engine"
	"github.com/llmgw/llmgw/supervisor/publish"
	"github.com/llmgw/llmgw/supervisor/status"
)

// controlLoop is the node's control loop: on every gossip or engine
// change, when woken, and when a lease it judges would lapse, it recomputes
// the plan and reconciles this node's engines; on the renew tick it renews
// this node's leases.
// What it holds is its own: only its goroutine touches the handover
// memory, the lease keeper and the load publisher.
type controlLoop struct {
	name    string
	ttl     time.Duration
	profile gossip.Profile
	clock   clock.Clock
	log     *slog.Logger
	cluster *gossip.Cluster
	runner  Runner
	// leases renews this node's leases and reclaims once they lapsed.
	leases *leaseKeeper
	// isolation is judged at every pass.
	isolation *isolation
	// reads is where each pass's snapshot goes.
	reads *readModel
	// load puts what the runner holds, and the gateway's rates, in the
	// record.
	load *publish.Load
	// handover holds back the stop of copies whose replacements this node
	// has just seen ready.
	handover handover
	wake     wakeup
	// plans keeps the last plan while its inputs do not change.
	plans planCache
	// settled is the joiner's word that the node has heard the cluster.
	settled *atomic.Bool
	// evicting are the shards of this node that GPU sharing lets go,
	// each logged once (logEvictions).
	evicting map[string]bool
}

// wakeup makes the control loop reconcile now rather than at its next
// timer or event (the node settled; a write waits to be seen).
type wakeup chan struct{}

func newWakeup() wakeup { return make(wakeup, 1) }

func (w wakeup) poke() {
	select {
	case w <- struct{}{}:
	default:
	}
}

// run is the loop; it returns when ctx ends.
func (c *controlLoop) run(ctx context.Context) {
	// due wakes the loop when a lease this node judges lapses, or when
	// its silence makes it isolated: what changes with time alone. (A
	// tick every second did, with a pass each: O(members) a second on an
	// idle node.)
	due := c.clock.NewTimer(time.Hour)
	defer due.Stop()
	renew := c.clock.NewTicker(c.ttl / 3)
	defer renew.Stop()
	// settled wakes the loop when a replacement settles, so the copy it
	// replaces stops then rather than at the next event.
	settled := c.clock.NewTimer(time.Hour)
	defer settled.Stop()
	lastRenew := c.clock.Now()
	for {
		if ctx.Err() != nil {
			return
		}
		// Before a pass plans with this node's claims: a frozen agent
		// may wake on any of the channels below.
		if c.clock.Since(lastRenew) > c.ttl {
			lastRenew = c.leases.renew(lastRenew, c.cluster.Renew)
		}
		cost, next, republished := c.reconcile(ctx)
		due.Reset(max(next.Sub(c.clock.Now()), 0))
		// A pass costs O(members). When changes come faster than passes
		// (a large cluster settling: every record changes a few times,
		// and each change reached every node), the next pass waits so
		// that passes take at most 1/passDuty of the loop's time; the
		// changes meanwhile coalesce into it. A small cluster's pass is
		// a fraction of a millisecond, so its wait is too. (real time: the
		// pass's duration on this machine sets it.) The pass that judges
		// this node's own new record follows at once: until it does,
		// readers see the record's new shards beside leases judged from
		// the one before.
		if !republished && !clock.SleepReal(ctx, min(cost*(passDuty-1), maxPassGap)) {
			return
		}
		if next := c.handover.next; !next.IsZero() {
			settled.Reset(max(next.Sub(c.clock.Now()), 0))
		}
		select {
		case <-ctx.Done():
			return
		case <-c.cluster.Changes():
		case <-c.runner.Changes():
		case <-c.wake:
		case <-due.Chan():
		case <-settled.Chan():
		case <-renew.Chan():
			lastRenew = c.leases.renew(lastRenew, c.cluster.Renew)
		}
	}
}

// reconcile is one pass of the loop: view, plan, this node's part to the
// runner, what the runner holds into this node's record, and the read
// model of it all for the node's readers. It returns what the pass cost
// but for the runner's part (an engine's start may block for a while, and
// is no measure of the cluster's size), when the next pass is due, and
// whether it republished this node's record.
func (c *controlLoop) reconcile(ctx context.Context) (cost time.Duration, due time.Time, republished bool) {
	start := time.Now() // real time: how long the pass took on this machine, for /metrics
	now := c.clock.Now()
	writes := c.reads.written() // before the read: what it is sure to see
	// Before the read too: a snapshot that says settled saw what the join
	// brought in.
	settled := c.settled.Load()
	members := c.cluster.Members()
	isolated := c.isolation.check(now, c.cluster.LastHeard(), members)
	deps := c.cluster.Deployments()
	view := BuildView(members, deps, now, c.ttl)
	// One read for the pass: its plan, its gangs and its snapshot follow
	// the same version. Every node must evict alike, so GPU sharing
	// waits until every member speaks its version.
	active := c.cluster.ActiveVersion()
	view.Share = active >= protocol.V6
	if !view.Share {
		view.Usage = nil // read only with Share; it would only miss the plan cache
	}
	c.handover.mark(&view, now, c.handoverPeriod(len(members)))
	plan := c.plans.plan(view)
	c.logEvictions(plan)
	specs := map[string]placement.Deployment{}
	for _, d := range view.Deployments {
		specs[d.Name] = d.WithDefaults()
	}
	var mine []engine.Desired
	for _, a := range plan.Assignments {
		if a.Node == c.name {
			mine = append(mine, engine.Desired{Assignment: a, Spec: specs[a.Deployment].ForRole(a.Role)})
		}
	}
	gangViews(mine, plan, members, now, c.ttl)
	failovers(mine, members, c.name, now, c.ttl)
	for i := range mine {
		mine[i].ClusterVersion = active
		if mine[i].Gang != nil {
			mine[i].Gang.ClusterVersion = active
		}
	}
	ranAt := time.Now() // real time: what the runner took is left out of the pass's cost
	c.runner.Reconcile(ctx, mine)
	held := c.runner.Shards()
	engines := time.Since(ranAt)
	republished = c.load.Publish(now, held)
	if republished {
		// Readers see what this node now holds and sends, not the record
		// before.
		members = c.cluster.Members()
		// This pass's view (and leases) is of the record before: the next
		// pass judges the new one at once.
		c.wake.poke()
	}
	c.reads.store(status.Build(status.Input{Self: c.name, Now: now, TTL: c.ttl, Plan: plan, View: view,
		Members: members, Deployments: deps, ReconcileTook: time.Since(start), Isolated: isolated, Settled: settled,
		Reconciles: c.plans.reconciles, PlansComputed: c.plans.computed,
		ActiveVersion: active, VersionsMixedSince: c.cluster.VersionsMixedSince()}), writes)
	return time.Since(start) - engines, c.nextDue(now, members, c.cluster.LastHeard()), republished
}

// nextDue is the next moment a pass would judge differently with no
// event in between: the earliest lapse of a lease that is still fresh
// (a holder's last renewal seen plus the TTL), or the moment this node's
// silence since heard makes it isolated. An hour when there is none: renewals, gossip
// and engine events wake the loop meanwhile.
func (c *controlLoop) nextDue(now time.Time, members []gossip.Member, heard time.Time) time.Time {
	next := now.Add(time.Hour)
	soonest := func(t time.Time) {
		if t.After(now) && t.Before(next) {
			next = t
		}
	}
	for _, m := range members {
		if m.Record != nil && len(m.Record.Shards) > 0 {
			// A moment past the lapse, so the pass judges it lapsed.
			soonest(m.SeenAt.Add(c.ttl + time.Millisecond))
		}
	}
	soonest(c.isolation.due(heard))
	return next
}

// passDuty and maxPassGap bound how much of a core the loop's passes take
// when changes keep coming: a pass is followed by a wait of passDuty-1
// times its duration, at most maxPassGap: a starved node, whose passes
// take long because it gets no CPU, throttles itself hardest.
const (
	passDuty   = 10
	maxPassGap = time.Second
)

// handoverPeriod is how long a replacement settles in a cluster of n
// members with this node's gossip profile.
func (c *controlLoop) handoverPeriod(members int) time.Duration {
	return max(minHandover, c.profile.SpreadBound(members))
}

// planCache keeps the last plan and the view it came from. Most passes
// are woken by what placement does not read (an engine's load, a
// gateway's rates, GPU telemetry, a renewal that changes no judged
// lease), and placement.Compute is a pure function of its view: a pass
// whose view has the same plan inputs (placement.SameInputs) keeps the
// plan. Leases are judged into the view at every pass, so a lapse, a
// handover's settling or a claim changes the view and plans anew.
type planCache struct {
	last  placement.View
	kept  placement.Plan
	valid bool
	// reconciles counts passes, computed the plans computed (/metrics).
	reconciles, computed uint64
}

func (p *planCache) plan(v placement.View) placement.Plan {
	p.reconciles++
	if p.valid && placement.SameInputs(p.last, v) {
		return p.kept
	}
	p.last, p.kept, p.valid = v, placement.Compute(v), true
	p.computed++
	return p.kept
}

// logEvictions says once, on the node that holds it, that GPU sharing
// takes a shard's GPUs for a deployment with demand (placement/share.go):
// the engine's stop that follows says only that it is no longer planned.
func (c *controlLoop) logEvictions(plan placement.Plan) {
	var evicted []placement.Unplaced
	for _, u := range plan.Unplaced {
		if strings.HasPrefix(u.Reason, placement.EvictionPrefix) {
			evicted = append(evicted, u)
		}
	}
	if len(evicted) == 0 && len(c.evicting) == 0 {
		return // every pass but those of an eviction: no look at the runner
	}
	held := map[string]bool{}
	for _, h := range c.runner.Shards() {
		held[h.ShardID] = true
	}
	now := map[string]bool{}
	for _, u := range evicted {
		if !held[u.ShardID] {
			continue
		}
		now[u.ShardID] = true
		if !c.evicting[u.ShardID] {
			c.log.Info("GPU sharing: stopping an idle replica", "shard", u.ShardID, "why", u.Reason)
		}
	}
	c.evicting = now
}
