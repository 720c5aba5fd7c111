package supervisor

import (
	"context"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/autoscale"
	"github.com/llmgw/llmgw/supervisor/engine"
	"github.com/llmgw/llmgw/supervisor/status"
)

// AutoscaleInterval is how often a node decides for the autoscaled
// deployments it is the decider of. Engine load reaches the records at
// most every 15 s, so this only bounds how late a publication is acted on.
const AutoscaleInterval = 5 * time.Second

// maxReason is where a published reason is cut: under the 256 bytes a
// record's scale target may carry, the ellipsis included.
const maxReason = 200

// autoscaler is the decider loop (see docs/architecture.md, "Autoscaling").
// For each autoscaled deployment one node decides: the alive node with the
// highest rendezvous hash of (deployment, node). It reads the load its
// read model holds, runs the rule (supervisor/autoscale), and publishes
// the target in its own record; every node places the newest target for
// the deployment's current spec (gossip.ScaleTargetFor, read by BuildView).
// What only the decider holds is the rule's memory of the last
// scale-down delay; a node that takes over starts without it and so
// scales down only after a delay of its own readings.
type autoscaler struct {
	self    string
	clock   clock.Clock
	log     *slog.Logger
	cluster scaleCluster
	reads   *readModel
	settled *atomic.Bool
	// deciders is the rule's memory per deployment spec this node decides.
	deciders map[scaleKey]*deciding
}

// deciding is what the decider of one deployment spec remembers: the
// rule's memory, and when it last woke the deployment from zero (zero:
// no wake under way), to time the cold start.
type deciding struct {
	autoscale.Decider
	wokeAt time.Time
}

// scaleCluster is what the autoscaler reads and writes of the gossip
// state (*gossip.Cluster).
type scaleCluster interface {
	Members() []gossip.Member
	Deployments() []gossip.DeploymentRecord
	Local() gossip.NodeRecord
	UpdateLocal(fn func(r *gossip.NodeRecord)) gossip.NodeRecord
	StampAfter(s gossip.Stamp) gossip.Stamp
}

type scaleKey struct {
	name string
	spec gossip.Stamp
}

func (a *autoscaler) run(ctx context.Context) {
	t := a.clock.NewTicker(AutoscaleInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
			a.pass()
		case <-a.reads.next():
			// A new snapshot: a deployment this node decides that is at
			// zero and now has a request held at a gateway wakes at once,
			// not at the next tick (up to AutoscaleInterval later).
			if a.wakeDue() {
				a.pass()
			}
		}
	}
}

// wakeDue reports whether a deployment at zero that this node decides has
// requests at a gateway in the stored snapshot. Cheap when nothing is at
// zero: it reads the published targets and the deployment list only.
func (a *autoscaler) wakeDue() bool {
	if !a.settled.Load() {
		return false
	}
	var zero []string
	for _, t := range a.cluster.Local().Scale {
		if t.Replicas == 0 {
			zero = append(zero, t.Deployment)
		}
	}
	if len(zero) == 0 {
		return false
	}
	for _, m := range a.reads.load().Members() {
		if m.State != gossip.StateAlive && m.State != gossip.StateSuspect {
			continue
		}
		for _, d := range zero {
			if m.GatewayRates[d] > 0 {
				return true
			}
		}
	}
	return false
}

// pass decides once for every autoscaled deployment this node decides,
// and publishes the targets that changed. A node that has not heard the
// cluster yet decides nothing: its view of the load is empty.
func (a *autoscaler) pass() {
	if !a.settled.Load() {
		return
	}
	deps := a.cluster.Deployments()
	published := a.cluster.Local().Scale
	if !slices.ContainsFunc(deps, autoscaled) && len(published) == 0 {
		return // the common case: nothing autoscaled, nothing published
	}
	members := a.cluster.Members()
	alive := aliveDeciders(members)
	snap := a.reads.load()
	now := a.clock.Now()
	mine := map[string]gossip.ScaleTarget{}
	for _, t := range published {
		mine[t.Deployment] = t
	}
	// Once per pass, for every deployment: the shards (a copy of the
	// snapshot's), the deployments waiting for room and the rates.
	shards := snap.Shards(now)
	waiting := map[string]bool{}
	for _, u := range snap.Plan().Unplaced {
		waiting[u.Deployment] = true
	}
	rates, queued := gatewayRates(snap)
	var out []gossip.ScaleTarget
	keep := map[scaleKey]bool{}
	for _, d := range deps {
		if !autoscaled(d) {
			continue
		}
		cur, has := gossip.ScaleTargetFor(members, d)
		if decider(d.Name, alive) != a.self {
			// Not ours (any more): our last target stays out only while
			// it is the one in force, so that the deployment never falls
			// back to its spec's replicas between two deciders.
			if t, ok := mine[d.Name]; ok && has && t.Spec == d.Stamp && t.At == cur.At {
				out = append(out, t)
			}
			continue
		}
		key := scaleKey{d.Name, d.Stamp}
		keep[key] = true
		dec := a.deciders[key]
		if dec == nil {
			dec = &deciding{}
			a.deciders[key] = dec
		}
		current := d.Spec.Replicas
		if has {
			current = cur.Replicas
		}
		reading := scaleReading(shards, waiting[d.Name], *d.Spec, now, current)
		reading.Requests = rates[d.Name]
		reading.Demand += float64(queued[d.Name])
		got := dec.Decide(scaleSettings(*d.Spec), reading)
		coldStart, pull, load := cur.ColdStartMs, cur.ColdStartPullMs, cur.ColdStartLoadMs
		switch {
		case current == 0 && got.Target > 0:
			dec.wokeAt = now
		case got.Target == 0:
			dec.wokeAt = time.Time{}
		case !dec.wokeAt.IsZero() && reading.Ready > 0:
			// Woken and ready: the cold start as the decider saw it, from
			// its wake to its first reading with a ready replica, and the
			// parts of it that replica's holder measured.
			coldStart, dec.wokeAt = now.Sub(dec.wokeAt).Milliseconds(), time.Time{}
			pull, load = readyStartParts(shards, *d.Spec)
			pull, load = min(pull, coldStart), min(load, max(coldStart-pull, 0))
			a.log.Info("autoscale: woke from zero", "deployment", d.Name, "cold_start", time.Duration(coldStart)*time.Millisecond,
				"pull", time.Duration(pull)*time.Millisecond, "load", time.Duration(load)*time.Millisecond)
		}
		// The last request's minute is published only while idle (what
		// GPU sharing orders idle deployments by), so that a busy
		// deployment's target is not republished every minute.
		var last int64
		if got.Idle {
			last = cur.LastRequest // the previous decider's, if it saw later
			if !got.LastBusy.IsZero() {
				last = max(last, got.LastBusy.Unix()/60)
			}
		}
		if has && cur.At.Origin == a.self && cur.Replicas == got.Target && cur.ColdStartMs == coldStart &&
			cur.ColdStartPullMs == pull && cur.ColdStartLoadMs == load &&
			cur.Idle == got.Idle && cur.LastRequest == last {
			out = append(out, cur) // in force and unchanged: no new record
			continue
		}
		t := gossip.ScaleTarget{Deployment: d.Name, Spec: d.Stamp, Replicas: got.Target, At: a.cluster.StampAfter(cur.At), Reason: engine.Clip(got.Reason, maxReason),
			ColdStartMs: coldStart, ColdStartPullMs: pull, ColdStartLoadMs: load, Idle: got.Idle, LastRequest: last}
		if !has || cur.Replicas != got.Target {
			a.log.Info("autoscale", "deployment", d.Name, "from", current, "to", got.Target, "why", got.Reason)
		}
		out = append(out, t)
	}
	for k := range a.deciders {
		if !keep[k] {
			delete(a.deciders, k)
		}
	}
	if !slices.Equal(out, published) {
		a.cluster.UpdateLocal(func(r *gossip.NodeRecord) { r.Scale = out })
	}
}

func autoscaled(d gossip.DeploymentRecord) bool {
	return !d.Deleted && d.Spec != nil && d.Spec.Autoscale != nil
}

// aliveDeciders are the nodes that may decide: alive (or suspect, as
// placement counts them) and not leaving, by name.
func aliveDeciders(members []gossip.Member) []string {
	var out []string
	for _, m := range members {
		if (m.State == gossip.StateAlive || m.State == gossip.StateSuspect) && m.Record != nil && !m.Record.Leaving {
			out = append(out, m.Name)
		}
	}
	return out
}

// decider is the node of alive with the highest rendezvous hash of
// (deployment, node): every node that sees the same alive set names the
// same one, and a node's death moves only its own deployments.
func decider(deployment string, alive []string) string {
	best, bestHash := "", uint64(0)
	for _, n := range alive {
		h := fnv.New64a()
		h.Write([]byte(deployment))
		h.Write([]byte{0})
		h.Write([]byte(n))
		if v := h.Sum64(); best == "" || v > bestHash || (v == bestHash && n < best) {
			best, bestHash = n, v
		}
	}
	return best
}

// scaleSettings are d's scaling fields with their defaults.
func scaleSettings(d placement.Deployment) autoscale.Settings {
	a := d.Autoscale
	s := autoscale.Settings{Min: a.Min, Max: a.Max, TargetInflight: float64(a.TargetInflight), ScaleDownDelay: time.Duration(a.ScaleDownDelay)}
	if s.TargetInflight == 0 {
		s.TargetInflight = autoscale.DefaultTargetInflight
		if d.MaxNumSeqs > 0 {
			s.TargetInflight = float64(d.MaxNumSeqs)
		}
	}
	if s.ScaleDownDelay == 0 {
		s.ScaleDownDelay = autoscale.DefaultScaleDownDelay
	}
	s.IdleWindow = time.Duration(a.IdleWindow)
	if s.IdleWindow == 0 {
		s.IdleWindow = autoscale.DefaultIdleWindow
	}
	return s
}

// scaleReading is deployment d as the read model's shards hold it: its
// replicas of the current spec by state, the running and waiting requests
// their engines last reported, and, when a replica waits for room
// (waitsForRoom: placement left one unplaced), how many are placed. The
// gateways' rates are the caller's (gatewayRates). Replicas being drained away are left out: their requests
// are finishing, not demand.
func scaleReading(shards []status.ShardInfo, waitsForRoom bool, d placement.Deployment, now time.Time, current int) autoscale.Reading {
	r := autoscale.Reading{Now: now, Current: current, Fits: -1}
	version := d.WithDefaults().SpecVersion()
	ready, starting, placed := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, s := range shards {
		if s.Deployment != d.Name || s.SpecVersion != version || s.Draining || s.Node == "" {
			continue
		}
		placed[s.ReplicaID] = true
		switch {
		case s.Lease == placement.LeaseValid && s.Status == gossip.ShardReady:
			ready[s.ReplicaID] = true
		case s.Lease == placement.LeaseStarting || s.Status == gossip.ShardStarting:
			starting[s.ReplicaID] = true
		}
		if l := s.Load; !l.ScrapedAt.IsZero() && l.Error == "" {
			r.Demand += l.Running + l.Waiting
			r.Readings++
		}
	}
	for id := range starting {
		delete(ready, id) // a gang half started is starting
	}
	r.Ready, r.Starting = len(ready), len(starting)
	if waitsForRoom {
		r.Fits = len(placed)
	}
	return r
}

// readyStartParts is the pull and the load of a ready replica of d's
// current spec, as its holder reported its engine's start (the first
// such replica by shard ID: a wake starts one).
func readyStartParts(shards []status.ShardInfo, d placement.Deployment) (pull, load int64) {
	version := d.WithDefaults().SpecVersion()
	for _, s := range shards {
		if s.Deployment == d.Name && s.SpecVersion == version && s.Status == gossip.ShardReady && s.LoadMs > 0 {
			return s.PullMs, s.LoadMs
		}
	}
	return 0, 0
}

// gatewayRates sums, per deployment, the rates the live gateways
// published: requests they sent or hold, which wake a deployment at zero
// and keep one from idling there. Once per pass, for every deployment.
//
// queued sums, likewise, the requests the gateways' queues hold (the
// replicas are at their bound, so the engines' load does not show them):
// demand, added to the engines'.
func gatewayRates(snap *status.Snapshot) (rates map[string]float64, queued map[string]int) {
	rates, queued = map[string]float64{}, map[string]int{}
	for _, m := range snap.Members() {
		if m.State == gossip.StateAlive || m.State == gossip.StateSuspect {
			for d, r := range m.GatewayRates {
				rates[d] += r
			}
			for d, n := range m.GatewayQueued {
				queued[d] += n
			}
		}
	}
	return rates, queued
}
