package gateway

import (
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// Route is one replica a request can be sent to: the engine that serves it
// (for a gang, the rank-0 shard's, which is the one that listens for
// requests).
type Route struct {
	Deployment  string
	ReplicaID   string
	ShardID     string
	SpecVersion string
	// EngineID is "<shard>-<spec version>", the name the engine's API key
	// is looked up by.
	EngineID string
	Node     string
	// URL is the engine's, as its record says: where the gateway sends
	// the request, unless Local or Relay is set.
	URL string
	// Local is set for an engine on this node that listens on loopback
	// only: "http://127.0.0.1:<port>", dialled in place of URL.
	Local string
	// Relay is set when the engine listens on another node's loopback
	// only (gossip.ShardRecord.Private): the base of its holder's relay,
	// "http://<holder API>/llmgw/relay/<engine ID>", through which the
	// request goes, signed (see relay_holder.go). Empty: URL is dialled
	// directly with the engine's key.
	Relay string
	// Suspect: memberlist suspects the node of one of the replica's shards.
	// Such routes are used only when nothing else is routable.
	Suspect bool
	// Draining: an old or displaced copy that serves until its replacement
	// is ready.
	Draining bool
	// LeaseExpires is when the first of the replica's leases lapses unless
	// renewed; a request after it skips the route without waiting for the
	// next view.
	LeaseExpires time.Time
	// Load is the gossiped running plus waiting requests of the rank-0
	// engine, the fallback when the gateway has no fresh scrape of its own.
	Load float64
	// Adapters are the LoRA adapters the engine has registered, by its
	// holder's record (from the engine's own models list), sorted.
	Adapters []string
	// Role is the replica's role in a disaggregated deployment, and
	// KVPort its engine's KV transfer port (an SGLang prefill's bootstrap
	// port), by its record.
	Role   string
	KVPort int
}

// key identifies a route's engine across table rebuilds. The URL is part of
// it: an engine restarted on another port is a new upstream, and its
// predecessor's failures must not eject it.
func (r *Route) key() string { return r.EngineID + "@" + r.URL }

// base is where the gateway dials the engine itself (not through a relay).
func (r *Route) base() string {
	if r.Local != "" {
		return r.Local
	}
	return r.URL
}

// Entry is one deployment as the gateway serves it.
type Entry struct {
	Name   string
	Model  string
	Engine string
	// Created is when the deployment was last placed (Unix seconds), for
	// /v1/models.
	Created int64
	// Routes are the routable replicas, sorted by replica, spec version and
	// node.
	Routes []Route
	// Why says, when Routes is empty, why nothing is routable: placement's
	// reasons and the state of the shards it placed.
	Why string
	// Wakes: the deployment may scale to zero (autoscaled, min 0), so a
	// request that finds no routable replica is held until one is
	// (wake.go); Replicas is its target in force, 0 when scaled to zero.
	Wakes    bool
	Replicas int
	// Bound is the requests one replica should hold at once, by this
	// gateway's estimate, before new ones wait in the gateway's queue
	// (queue.go): the autoscaler's target_inflight when set, else
	// max_num_seqs when set; 0, neither: no queue.
	Bound int
	// PD is set for a deployment of prefill and decode roles: its
	// requests go as two legs (pdroute.go).
	PD *pdSettings
}

// Table is the routing table of one view: every deployment with its
// routable replicas. It is immutable once built.
type Table struct {
	builtAt time.Time
	// settled: the snapshot was built once the node had heard the
	// cluster (status.Snapshot.Settled). Until then a deployment missing
	// from the table may not have reached this node yet.
	settled bool
	// otherRates sums, per deployment, the published rates of the other
	// live nodes that run a gateway, and silent counts those of them that
	// publish none.
	otherRates map[string]float64
	silent     int
	entries    map[string]*Entry
	names      []string
	// adapters maps a LoRA adapter's name to its deployment: a
	// deployment's own name wins over an adapter's, and of two
	// deployments with an adapter of one name, the one that sorts first.
	adapters      map[string]string
	adapterSource map[string]string
	// byModel maps a model id to the deployments serving it, sorted.
	byModel map[string][]string
	// unready holds the engines ("<engine ID>@<node>") whose holder is
	// alive and renewing but whose engine is not ready, and that are
	// neither stopping nor draining: a replica of one that leaves the
	// table has its requests in flight cut (Gateway.Update).
	unready map[string]bool
	// holderSilent holds the engines ("<engine ID>@<node>") whose lease
	// lapsed while they were not stopping: their holder renews no more. A
	// request through such a holder's relay is cut (Gateway.Update).
	holderSilent map[string]bool
}

// BuildTable makes the routing table from a snapshot, judging leases at now
// (Snapshot.Shards(now)), so a lease that lapsed since the reconcile pass is
// not routed to. It is pure: the gateway calls it on every view change and
// never looks at records per request.
//
// A replica is routable when every one of its shards (one, or
// pipeline_parallel for a gang) is ready, holds a valid lease, is one the
// plan counts on (a copy left out of the plan is being stopped by its node),
// and sits on a node memberlist calls alive or suspect. Old and new spec
// versions of a replica are both routable during a rollout: the plan keeps
// old copies as draining until their replacements are ready. A gang is
// routed to through its rank-0 shard only.
func BuildTable(snap *status.Snapshot, now time.Time) *Table {
	t := &Table{builtAt: now, entries: map[string]*Entry{}, byModel: map[string][]string{}, otherRates: map[string]float64{}, adapters: map[string]string{}, adapterSource: map[string]string{},
		unready: map[string]bool{}, holderSilent: map[string]bool{}}
	if snap == nil {
		return t
	}
	t.settled = snap.Settled()
	state := map[string]gossip.MemberState{}
	apis := map[string]string{}
	for _, m := range snap.Members() {
		state[m.Name] = m.State
		apis[m.Name] = m.API
		if m.Gateway == "" || (m.State != gossip.StateAlive && m.State != gossip.StateSuspect) {
			continue
		}
		switch {
		case m.Name == snap.Self():
		case m.GatewayRates == nil:
			t.silent++
		default:
			for dep, r := range m.GatewayRates {
				t.otherRates[dep] += r
			}
		}
	}
	type copyKey struct{ node, shard, spec string }
	planned := map[copyKey]bool{}
	for _, a := range snap.Plan().Assignments {
		planned[copyKey{a.Node, a.ShardID, a.SpecVersion}] = true
	}

	// One group per (replica, spec version): the shards that must all be
	// routable for the replica to be.
	type groupKey struct{ replica, spec string }
	type group struct {
		valid map[int]status.ShardInfo
		// maxIndex is the largest shard index seen whatever its lease, and
		// single whether the replica's only shard is the replica itself:
		// together the gang size of a spec version other than the
		// current one, whose spec the snapshot no longer has.
		maxIndex int
		single   bool
	}
	groups := map[string]map[groupKey]*group{}
	byDep := map[string][]status.ShardInfo{}
	for _, si := range snap.Shards(now) {
		byDep[si.Deployment] = append(byDep[si.Deployment], si)
		if si.Node == "" {
			continue // unplaced
		}
		// A starting lease is a live holder that renews it while its
		// engine is not ready (supervisor.JudgeLease): after having been
		// ready, that is an engine its runner judged unready (hung,
		// crashed, restarting). A stopping copy's lease reads lapsed
		// instead, and a draining or unplanned one is being let go of on
		// purpose: both finish their requests whole.
		if si.Lease == placement.LeaseStarting && si.Status != gossip.ShardStopping && !si.Draining &&
			planned[copyKey{si.Node, si.ShardID, si.SpecVersion}] {
			t.unready[engineAt(placement.EngineID(si.ShardID, si.SpecVersion), si.Node)] = true
		}
		if si.Lease == placement.LeaseLapsed && si.Status != gossip.ShardStopping {
			t.holderSilent[engineAt(placement.EngineID(si.ShardID, si.SpecVersion), si.Node)] = true
		}
		idx, ok := placement.ShardIndex(si.ShardID, si.ReplicaID)
		if !ok {
			continue
		}
		if groups[si.Deployment] == nil {
			groups[si.Deployment] = map[groupKey]*group{}
		}
		k := groupKey{si.ReplicaID, si.SpecVersion}
		g := groups[si.Deployment][k]
		if g == nil {
			g = &group{valid: map[int]status.ShardInfo{}, maxIndex: -1}
			groups[si.Deployment][k] = g
		}
		g.maxIndex = max(g.maxIndex, idx)
		g.single = g.single || si.ShardID == si.ReplicaID
		ms := state[si.Node]
		// Only rank 0 of a gang serves HTTP: the other ranks have no URL.
		if si.Lease == placement.LeaseValid && si.Status == gossip.ShardReady && (si.URL != "" || idx > 0) &&
			planned[copyKey{si.Node, si.ShardID, si.SpecVersion}] &&
			(ms == gossip.StateAlive || ms == gossip.StateSuspect) {
			g.valid[idx] = si
		}
	}

	deps := map[string]placement.Deployment{}
	for _, d := range snap.Deployments(now) {
		deps[d.Name] = d.Deployment
		e := &Entry{Name: d.Name, Model: d.Model, Engine: d.Engine, Created: d.Stamp.Wall / 1000,
			Wakes: d.Autoscale != nil && d.Autoscale.Min == 0, Replicas: d.Replicas, Bound: replicaBound(d.Deployment), PD: pdSettingsOf(d.Deployment)}
		for k, g := range groups[d.Name] {
			size := d.PipelineParallel
			if k.spec != d.SpecVersion {
				size = g.maxIndex + 1
				if g.single {
					size = 1
				}
			}
			if size < 1 || len(g.valid) != size {
				continue
			}
			r0, ok := g.valid[0]
			if !ok || r0.URL == "" || !sameGeneration(g.valid) {
				continue
			}
			rt := Route{Deployment: d.Name, ReplicaID: k.replica, ShardID: r0.ShardID, SpecVersion: k.spec,
				EngineID: placement.EngineID(r0.ShardID, k.spec), Node: r0.Node, URL: strings.TrimRight(r0.URL, "/"),
				LeaseExpires: r0.LeaseExpires, Load: r0.Load.Running + r0.Load.Waiting, Adapters: r0.Adapters,
				Role: r0.Role, KVPort: r0.KVPort}
			if r0.Private {
				if !reachPrivate(&rt, snap.Self(), apis[r0.Node]) {
					continue
				}
			}
			for _, si := range g.valid {
				rt.Suspect = rt.Suspect || state[si.Node] == gossip.StateSuspect
				rt.Draining = rt.Draining || si.Draining
				if !si.LeaseExpires.IsZero() && (rt.LeaseExpires.IsZero() || si.LeaseExpires.Before(rt.LeaseExpires)) {
					rt.LeaseExpires = si.LeaseExpires
				}
			}
			e.Routes = append(e.Routes, rt)
		}
		slices.SortFunc(e.Routes, func(a, b Route) int {
			return strings.Compare(a.ReplicaID+"\x00"+a.SpecVersion+"\x00"+a.Node, b.ReplicaID+"\x00"+b.SpecVersion+"\x00"+b.Node)
		})
		if len(e.Routes) == 0 {
			e.Why = whyNot(d, byDep[d.Name])
		}
		t.entries[d.Name] = e
		t.names = append(t.names, d.Name)
		t.byModel[d.Model] = append(t.byModel[d.Model], d.Name)
	}
	slices.Sort(t.names)
	for _, ns := range t.byModel {
		slices.Sort(ns)
	}
	for _, name := range t.names {
		d := deps[name]
		for _, a := range d.Adapters {
			if _, taken := t.entries[a.Name]; taken {
				continue
			}
			if _, taken := t.adapters[a.Name]; !taken {
				t.adapters[a.Name], t.adapterSource[a.Name] = name, a.Source
			}
		}
	}
	return t
}

// adapter is the deployment whose LoRA adapter model names, if model
// names one (and no deployment).
func (t *Table) adapter(model string) (deployment string, ok bool) {
	if _, dep := t.entries[model]; dep {
		return "", false
	}
	deployment, ok = t.adapters[model]
	return deployment, ok
}

// replicaBound is the absolute bound on one replica's requests that the
// gateway's queue holds it to (Entry.Bound): what the operator said one
// replica should carry (target_inflight), else what its engine runs at
// once (max_num_seqs, as the autoscaler reads it too: past it the engine
// queues first come, first served, where no priority reaches). Without
// either the gateway knows no bound, and queues nothing.
func replicaBound(d placement.Deployment) int {
	if d.Autoscale != nil && d.Autoscale.TargetInflight > 0 {
		return d.Autoscale.TargetInflight
	}
	return max(d.MaxNumSeqs, 0)
}

// reachPrivate sets how rt reaches an engine that listens on its holder's
// loopback only: on this node at 127.0.0.1, on another through the
// holder's relay at its API address. False when the holder's API address
// is unknown or unusable: the route is left out.
func reachPrivate(rt *Route, self, holderAPI string) bool {
	u, err := url.Parse(rt.URL)
	if err != nil || u.Port() == "" {
		return false
	}
	if rt.Node == self {
		rt.Local = "http://" + net.JoinHostPort("127.0.0.1", u.Port())
		return true
	}
	if _, _, err := net.SplitHostPort(holderAPI); err != nil {
		return false
	}
	rt.Relay = "http://" + holderAPI + RelayPath + rt.EngineID
	return true
}

// engineAt names one engine on one node, as Table.unready holds them.
func engineAt(engineID, node string) string { return engineID + "@" + node }

// sameGeneration reports whether every member of a gang runs against
// rank 0's generation: a member still in the one before (rank 0 restarted
// the gang and its record has not caught up) makes the gang not whole.
func sameGeneration(members map[int]status.ShardInfo) bool {
	r0 := members[0]
	if r0.Gang == nil {
		return true
	}
	for _, si := range members {
		if si.Gang == nil || si.Gang.Generation != r0.Gang.Generation {
			return false
		}
	}
	return true
}

// maxWhy bounds the reasons quoted in one error: a deployment of many
// replicas would otherwise answer with a page.
const maxWhy = 6

// whyNot explains a deployment with no routable replica: placement's own
// reasons (unplaced shards, start errors), then the state of each copy of
// the current version it placed.
func whyNot(d status.DeploymentInfo, shards []status.ShardInfo) string {
	if d.Replicas == 0 {
		return "the deployment is scaled to zero (replicas: 0)"
	}
	parts := slices.Clone(d.Why)
	for _, si := range shards {
		if si.Node == "" || si.SpecVersion != d.SpecVersion || si.Reason != "" {
			continue // unplaced and failing shards are in d.Why already
		}
		switch {
		case si.Lease == placement.LeaseStarting:
			parts = append(parts, fmt.Sprintf("%s on %s: engine %s, not ready yet", si.ShardID, si.Node, si.Status))
		case si.Lease == placement.LeaseLapsed:
			parts = append(parts, fmt.Sprintf("%s on %s: lease lapsed", si.ShardID, si.Node))
		case si.Lease == placement.LeaseValid && d.PipelineParallel > 1:
			parts = append(parts, fmt.Sprintf("%s on %s: ready, waiting for the rest of its gang", si.ShardID, si.Node))
		}
	}
	if len(parts) == 0 {
		return "no replica is ready"
	}
	if len(parts) > maxWhy {
		parts = append(parts[:maxWhy], fmt.Sprintf("and %d more", len(parts)-maxWhy))
	}
	return strings.Join(parts, "; ")
}

// Others is how many requests the other gateways of the view may be
// sending to dep's replicas for each one this gateway sends, own being this
// gateway's requests/s to dep (Gateway.Rates): the others' published rates
// over own, and one more for each other gateway that publishes none (an
// older agent), taken to send as much as this one. own counts as at least
// one request per rate window: a gateway that has sent next to nothing
// lately knows next to nothing of the replicas' load, and judges so.
//
// It is the policies' share of a replica's unseen load: with gateways
// that all send alike it is one per other gateway, the worst case; with
// one door taking all the traffic it is zero for that door, whose view of
// its own requests is then the whole truth.
func (t *Table) Others(dep string, own float64) float64 {
	return float64(t.silent) + t.otherRates[dep]/max(own, 1/rateWindow.Seconds())
}

// BuiltAt is the moment the table judged leases at.
func (t *Table) BuiltAt() time.Time { return t.builtAt }

// Settled reports whether the table's snapshot was built once the node
// had heard the cluster; a table of no snapshot is not.
func (t *Table) Settled() bool { return t.settled }

// Names lists every deployment, sorted.
func (t *Table) Names() []string { return slices.Clone(t.names) }

// Entry returns one deployment by name.
func (t *Table) Entry(name string) (*Entry, bool) {
	e, ok := t.entries[name]
	return e, ok
}

// Routes lists a deployment's routable replicas as of the table's view.
func (t *Table) Routes(name string) []Route {
	if e, ok := t.entries[name]; ok {
		return slices.Clone(e.Routes)
	}
	return nil
}

// resolve finds the deployment a request's model names: a deployment name
// first, else a model id exactly one deployment serves. byID says the
// request used the model id, so its body must be rewritten to the name the
// engine serves.
func (t *Table) resolve(model string) (e *Entry, byID bool, err *apiError) {
	if e, ok := t.entries[model]; ok {
		return e, false, nil
	}
	// A LoRA adapter: its deployment, whose replicas that registered it
	// serve it (exchange.adapterRoutes).
	if dep, ok := t.adapters[model]; ok {
		return t.entries[dep], false, nil
	}
	switch deps := t.byModel[model]; len(deps) {
	case 0:
		served := slices.Concat(t.names, slices.Collect(maps.Keys(t.adapters)))
		slices.Sort(served)
		return nil, false, errUnknownModel(model, served)
	case 1:
		return t.entries[deps[0]], true, nil
	default:
		return nil, false, errAmbiguousModel(model, deps)
	}
}
