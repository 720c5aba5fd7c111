package supervisor

import (
	"context"
	"math"
	"reflect"
	"strconv"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/supervisor/engine"
	"github.com/llmgw/llmgw/supervisor/status"
)

// loop is the control loop: on every gossip or engine change, and on a
// tick, it recomputes the plan and reconciles this node's engines; on the
// renew tick it renews this node's leases.
func (n *Node) loop(ctx context.Context) {
	defer n.wg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	renew := time.NewTicker(n.cfg.LeaseTTL / 3)
	defer renew.Stop()
	// settled wakes the loop when a replacement settles, so the copy it
	// replaces stops then rather than at the next tick.
	settled := time.NewTimer(time.Hour)
	defer settled.Stop()
	lastRenew := n.clock.Now()
	for {
		if ctx.Err() != nil {
			return
		}
		// Before a pass plans with this node's claims: a frozen agent
		// may wake on any of the channels below.
		if n.clock.Now().Sub(lastRenew) > n.cfg.LeaseTTL {
			lastRenew = n.renew(lastRenew)
		}
		n.reconcile(ctx)
		if next := n.handover.next; !next.IsZero() {
			settled.Reset(max(next.Sub(n.clock.Now()), 0))
		}
		select {
		case <-ctx.Done():
			return
		case <-n.cluster.Changes():
		case <-n.runner.Changes():
		case <-n.wake:
		case <-tick.C:
		case <-settled.C:
		case <-renew.C:
			lastRenew = n.renew(lastRenew)
		}
	}
}

// renew renews this node's leases and notes when on disk, so that a
// restarted agent can tell whether they lapsed while it was away. It
// returns the time of the renewal.
//
// A gap longer than the TTL since the last renewal (the agent was frozen,
// or starved) means this node's leases lapsed in every other node's view
// meanwhile, and its shards may run elsewhere now: it reclaims them before
// it renews. The check lives here, not only at the top of the loop,
// because a frozen agent may wake on the renew tick first, and a renewal
// that went unchecked would hide the gap for good.
func (n *Node) renew(last time.Time) time.Time {
	now := n.clock.Now()
	if gap := now.Sub(last); gap > n.cfg.LeaseTTL {
		n.reclaim("no renewal for " + gap.Round(time.Millisecond).String())
	}
	n.cluster.Renew()
	if err := n.dir.WriteRenewal(now); err != nil && !n.renewalWarned {
		n.renewalWarned = true
		n.log.Warn("cannot note the lease renewal on disk; after a restart this node's engines will claim afresh", "err", err)
	}
	return now
}

// reclaimIfLapsed reclaims at start what an earlier agent left running
// when its leases lapsed while no agent ran: it last renewed longer than
// the TTL ago, or did not say when.
func (n *Node) reclaimIfLapsed() {
	last, found, err := n.dir.ReadRenewal()
	switch away := n.started.Sub(last); {
	case err != nil:
		n.reclaim("the last renewal is unknown: " + err.Error())
	case !found:
		n.reclaim("no renewal noted")
	case away > n.cfg.LeaseTTL:
		n.reclaim("last renewal " + away.Round(time.Millisecond).String() + " before this start")
	}
}

// reclaim makes the runner claim what it holds afresh (see engine.Runner.
// Reclaim): this node's leases lapsed, so the cluster may have started
// replacements, and a copy that stayed valid must win over this node's.
func (n *Node) reclaim(why string) {
	r, ok := n.runner.(reclaimer)
	if !ok || len(n.runner.Shards()) == 0 {
		return
	}
	n.log.Warn("this node's leases lapsed; its engines claim their shards afresh, so copies that stayed valid elsewhere keep them", "why", why)
	r.Reclaim(n.clock.Now())
}

// reconcile is one pass of the loop: view, plan, this node's part to the
// runner, what the runner holds into this node's record, and the read
// model of it all for the node's readers.
func (n *Node) reconcile(ctx context.Context) {
	start := time.Now()
	now := n.clock.Now()
	writes := n.writes.Load() // before the read: what it is sure to see
	members := n.cluster.Members()
	isolated := n.checkIsolation(now, members)
	deps := n.cluster.Deployments()
	view := BuildView(members, deps, now, n.cfg.LeaseTTL)
	n.handover.mark(&view, now, n.handoverPeriod(len(members)))
	plan := placement.Compute(view)
	specs := map[string]placement.Deployment{}
	for _, d := range view.Deployments {
		specs[d.Name] = d.WithDefaults()
	}
	var mine []engine.Desired
	for _, a := range plan.Assignments {
		if a.Node == n.cfg.Name {
			mine = append(mine, engine.Desired{Assignment: a, Spec: specs[a.Deployment]})
		}
	}
	gangViews(mine, plan, members, now, n.cfg.LeaseTTL)
	n.runner.Reconcile(ctx, mine)
	shards := n.runner.Shards()
	// One record for both: every UpdateLocal sends the whole record and
	// wakes this loop for another pass.
	shardsDue := n.recordNeedsShards(shards)
	rates, ratesDue := n.gatewayRatesDue(now)
	if shardsDue || ratesDue {
		n.cluster.UpdateLocal(func(r *gossip.NodeRecord) {
			if shardsDue {
				r.Shards = shards
			}
			if ratesDue {
				r.GatewayRates = rates
			}
		})
		// Readers see what this node now holds and sends, not the record
		// before.
		members = n.cluster.Members()
	}
	n.publish(status.Build(status.Input{Self: n.cfg.Name, Now: now, TTL: n.cfg.LeaseTTL, Plan: plan, View: view,
		Members: members, Deployments: deps, ReconcileTook: time.Since(start), Isolated: isolated}), writes)
}

// publish makes snap what readers see; it saw the first writes deployment
// writes this node accepted.
func (n *Node) publish(snap *status.Snapshot, writes uint64) {
	n.snap.Store(snap)
	n.snapWrites.Store(writes)
	n.mu.Lock()
	close(n.published)
	n.published = make(chan struct{})
	n.mu.Unlock()
}

// awaitWrite waits until a published snapshot has seen this node's write
// number w (bounded: the loop reconciles within milliseconds of being
// woken, but a stopping node never will).
func (n *Node) awaitWrite(w uint64) {
	n.wakeLoop()
	deadline := time.NewTimer(2 * time.Second)
	defer deadline.Stop()
	for n.snapWrites.Load() < w {
		n.mu.Lock()
		next := n.published
		n.mu.Unlock()
		if n.snapWrites.Load() >= w {
			return
		}
		select {
		case <-next:
		case <-deadline.C:
			return
		case <-n.closed:
			return
		}
	}
}

// loadPublishInterval spaces record updates that only carry new engine
// load: every change of content is a full record sent to the cluster, and
// load changes at every scrape.
const loadPublishInterval = 15 * time.Second

// recordNeedsShards says whether this node's record must be republished
// with the shards cur: always when anything but load changed, and for load
// alone at most every loadPublishInterval. It notes the time of a
// publication it allows.
func (n *Node) recordNeedsShards(cur []gossip.ShardRecord) bool {
	old := n.cluster.Local().Shards
	if reflect.DeepEqual(cur, old) {
		return false
	}
	if len(cur) == len(old) {
		same := true
		for i := range cur {
			a, b := cur[i], old[i]
			a.Load, b.Load = gossip.ShardLoad{}, gossip.ShardLoad{}
			if !reflect.DeepEqual(a, b) {
				same = false
				break
			}
		}
		if same && n.clock.Now().Sub(n.loadPublished) < loadPublishInterval {
			return false
		}
	}
	n.loadPublished = n.clock.Now()
	return true
}

// ratesPublishInterval is the least time between two record updates for
// the gateway's rates.
const ratesPublishInterval = 2 * time.Second

// gatewayRatesDue returns the gateway's rates when the record should carry
// them anew: a deployment started or stopped seeing traffic here, or a
// rate moved by a quarter and by at least one request a second, at most
// every ratesPublishInterval. Steady traffic leaves the record as it is
// (every change of content is a full record sent to the cluster); the
// other gateways need the rates' proportions, not their digits, which are
// rounded to two.
func (n *Node) gatewayRatesDue(now time.Time) (map[string]float64, bool) {
	if n.cfg.GatewayRates == nil || n.cfg.GatewayAddr == "" || now.Sub(n.ratesPublished) < ratesPublishInterval {
		return nil, false
	}
	cur := n.cfg.GatewayRates()
	if !ratesMoved(n.cluster.Local().GatewayRates, cur) {
		return nil, false
	}
	n.ratesPublished = now
	out := make(map[string]float64, len(cur))
	for d, r := range cur {
		out[d] = twoDigits(r)
	}
	return out, true
}

func ratesMoved(old, cur map[string]float64) bool {
	if old == nil || len(old) != len(cur) {
		return true
	}
	for d, c := range cur {
		o, ok := old[d]
		if !ok {
			return true
		}
		if diff := math.Abs(c - o); diff >= 1 && diff > max(c, o)/4 {
			return true
		}
	}
	return false
}

// twoDigits rounds x to two significant digits, through their decimal
// form so that the record says 7.8, not 7.800000000000001.
func twoDigits(x float64) float64 {
	if x <= 0 || math.IsInf(x, 0) || math.IsNaN(x) {
		return 0
	}
	r, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'g', 2, 64), 64)
	return r
}

func (n *Node) gpuLoop(ctx context.Context) {
	defer n.wg.Done()
	tick := time.NewTicker(n.cfg.GPUInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		snap, err := n.cfg.GPUs.Discover(ctx)
		if err != nil {
			n.log.Warn("GPU re-read failed; keeping the last reading", "err", err)
			continue
		}
		local := n.cluster.Local()
		gpus, probes := n.withFaults(ctx, n.foreignAdjusted(snap), local.GPUs, local.Probes)
		gpus = n.simulatedClaims(gpus)
		n.mu.Lock()
		n.gpuSnap = snap
		n.mu.Unlock()
		tel, telChanged := n.telemetryDue(ctx, local.Telemetry)
		if gpuChanged(local.GPUs, gpus) || !sameProbes(probes, local.Probes) || telChanged {
			n.cluster.UpdateLocal(func(r *gossip.NodeRecord) {
				r.GPUs, r.Probes = gpus, probes
				if telChanged {
					r.Telemetry = tel
				}
			})
		}
	}
}

// withFaults marks the GPUs with recent driver faults (all of them for a
// fault that names no GPU) and updates the
// fault counts in probes. When the kernel log cannot be read this time, the
// marks of the last reading (prev) stay: a read error must not make a
// faulting GPU placeable again.
func (n *Node) withFaults(ctx context.Context, gpus, prev []placement.GPU, probes gossip.ProbeSummary) ([]placement.GPU, gossip.ProbeSummary) {
	if n.cfg.DriverFaults == nil {
		return gpus, probes
	}
	f, err := n.cfg.DriverFaults(ctx)
	if err != nil {
		n.log.Warn("reading driver faults failed; keeping the last fault marks", "err", err)
		for i := range gpus {
			for _, p := range prev {
				if p.UUID == gpus[i].UUID && p.Faulted {
					gpus[i].Faulted = true
				}
			}
		}
		return gpus, probes
	}
	gpus = host.MarkFaulted(gpus, f, n.clock.Now())
	probes.DriverFaultsRecent, probes.DriverFaultsBoot, probes.XidRecent = f.FaultRecent, f.FaultTotal, f.XidRecent
	probes.LastDriverFault, probes.LastDriverFaultAt = "", time.Time{}
	if f.NewestFault != nil {
		probes.LastDriverFault, probes.LastDriverFaultAt = faultLine(f.NewestFault.Message), f.NewestFault.Time
	}
	return gpus, probes
}

// GPUSnapshot is the last GPU reading.
func (n *Node) GPUSnapshot() gpu.Snapshot {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.gpuSnap
}

// simulatedClaims fills simulated GPUs' used memory with what this node's
// shards claimed, so nodes, the page and top read like a real cluster's.
// Real GPUs report their own.
func (n *Node) simulatedClaims(gpus []placement.GPU) []placement.GPU {
	if !n.cfg.GPUsSimulated {
		return gpus
	}
	var claims []gpu.Claim
	for _, s := range n.runner.Shards() {
		for _, g := range s.GPUs {
			claims = append(claims, gpu.Claim{Index: g, Bytes: s.MemoryPerGPU})
		}
	}
	return gpu.WithClaims(gpus, claims)
}

func (n *Node) foreignAdjusted(s gpu.Snapshot) []placement.GPU {
	own := map[int]bool{}
	for _, p := range n.runner.OwnPIDs() {
		own[p] = true
	}
	return gpu.ForeignMemory(s, own)
}

// gpuChanged ignores memory churn under 256 MiB: re-gossiping every
// allocator wobble would flood the cluster for no placement decision.
func gpuChanged(old, cur []placement.GPU) bool {
	if len(old) != len(cur) {
		return true
	}
	const q = 256 << 20
	for i := range old {
		a, b := old[i], cur[i]
		if a.UUID != b.UUID || a.Faulted != b.Faulted || a.MIG != b.MIG || a.MemoryTotal != b.MemoryTotal ||
			a.MemoryUsed/q != b.MemoryUsed/q || a.MemoryForeign/q != b.MemoryForeign/q {
			return true
		}
	}
	return false
}

// sameProbes compares probe summaries, the fault's time by the instant it
// names (== would also compare its location).
func sameProbes(a, b gossip.ProbeSummary) bool {
	ta, tb := a.LastDriverFaultAt, b.LastDriverFaultAt
	a.LastDriverFaultAt, b.LastDriverFaultAt = time.Time{}, time.Time{}
	return a == b && ta.Equal(tb)
}
