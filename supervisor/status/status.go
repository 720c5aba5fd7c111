// Package status is the node's read model: it turns what one reconcile pass
// saw (the plan, the view it was computed from, the members and the
// deployment records) into one Snapshot of the cluster as this node judges
// it: members, deployments with how much of each is placed and ready and why
// not, and every shard with its holder, lease, readiness, engine URL and
// load.
//
// A Snapshot is built once per reconcile and then only read, by every
// consumer (the HTTP API, the page, the metrics, MCP), so they all show the
// same picture and none walks gossip or joins records per request. Leases
// lapse by the clock, not on an event: the snapshot keeps the moment each
// lease lapses, and a reader passes its own now, so a lease that lapsed
// since the last reconcile reads as lapsed.
//
// The package is pure: no I/O, no goroutines, no clock of its own.
package status

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

// Input is what one reconcile pass saw.
type Input struct {
	// Self is this node's name.
	Self string
	// Now is when View was built; TTL is the lease TTL it judged by.
	Now time.Time
	TTL time.Duration
	// Plan was computed from View, and View from Members and Deployments.
	Plan        placement.Plan
	View        placement.View
	Members     []gossip.Member
	Deployments []gossip.DeploymentRecord
	// ReconcileTook is how long the pass took.
	ReconcileTook time.Duration
	// Reconciles counts the node's passes so far, and PlansComputed those
	// that ran placement.Compute: the others found the view's plan inputs
	// unchanged (placement.SameInputs) and kept the plan.
	Reconciles, PlansComputed uint64
	// Isolated is since when this node has heard no peer while it expects
	// some (zero: it is not isolated); its own member row says so.
	Isolated time.Time
	// Settled says the node had heard the cluster when the pass began (it
	// joined a peer, had none to join, or stopped waiting for one): what
	// the pass saw is then the cluster's, not the partial view of a node
	// that has just started. The node reads it before the gossip state.
	Settled bool
	// ActiveVersion is the cluster protocol version this node ran at, and
	// VersionsMixedSince since when live members announce different
	// versions (zero: they do not) (gossip.Cluster).
	ActiveVersion      int
	VersionsMixedSince time.Time
}

// Snapshot is the cluster as one reconcile pass saw it. It is immutable:
// accessors return copies.
type Snapshot struct {
	self          string
	builtAt       time.Time
	reconcileTook time.Duration
	reconciles    uint64
	plansComputed uint64
	plan          placement.Plan
	planned       map[string]string // deployment → spec version the plan was computed from
	members       []MemberInfo
	deployments   []deployment
	shards        []shard
	settled       bool
	// activeVersion and mixedSince are Input's ActiveVersion and
	// VersionsMixedSince.
	activeVersion int
	mixedSince    time.Time
}

// deployment is one DeploymentInfo with what its Ready count rests on.
type deployment struct {
	info DeploymentInfo
	// readyUntil holds, per ready replica, when the first of its leases
	// lapses: the replica counts as ready until then.
	readyUntil []time.Time
}

// shard is one ShardInfo with what a later read needs to re-judge it.
type shard struct {
	info ShardInfo
	// planned: the plan counts on this copy (not a leftover holder).
	planned bool
	// load is the holder's reading, shown only while the lease is valid.
	load gossip.ShardLoad
}

// held identifies one shard copy: a holder, a shard and a spec version.
type held struct{ node, shard, spec string }

// Build makes the snapshot of one reconcile pass.
func Build(in Input) *Snapshot {
	s := &Snapshot{self: in.Self, builtAt: in.Now, reconcileTook: in.ReconcileTook, reconciles: in.Reconciles, plansComputed: in.PlansComputed, plan: in.Plan,
		planned: SpecVersions(in.View.Deployments), settled: in.Settled, activeVersion: in.ActiveVersion, mixedSince: in.VersionsMixedSince}
	leases := map[held]placement.LeaseState{}
	for _, nd := range in.View.Nodes {
		for _, h := range nd.Shards {
			leases[held{nd.Name, h.ShardID, h.SpecVersion}] = h.Lease
		}
	}
	// A lease judged live lapses TTL after its holder's last renewal was
	// seen here (see supervisor.BuildView).
	lapses := map[string]time.Time{}
	records := map[held]gossip.ShardRecord{}
	for _, m := range in.Members {
		mi := memberInfo(m)
		if m.Name == in.Self && !in.Isolated.IsZero() {
			mi.Isolated, mi.IsolatedSince = true, in.Isolated
		}
		s.members = append(s.members, mi)
		if m.Record == nil {
			continue
		}
		lapses[m.Name] = m.SeenAt.Add(in.TTL)
		for _, r := range m.Record.Shards {
			records[held{m.Name, r.ShardID, r.SpecVersion}] = r
		}
	}
	s.buildShards(in.Plan, leases, lapses, records)
	s.buildDeployments(in)
	return s
}

func memberInfo(m gossip.Member) MemberInfo {
	mi := MemberInfo{Name: m.Name, State: m.State, Gossip: m.Address, LastChange: m.Since, SeenAt: m.SeenAt, ClockOffset: m.ClockOffset, TokenMismatch: m.TokenMismatch,
		Protocol: m.Protocol}
	if r := m.Record; r != nil {
		mi.API, mi.Gateway, mi.GatewayTLS, mi.Labels, mi.GPUs, mi.Shards = r.API, r.Gateway, r.GatewayTLS, r.Labels, r.GPUs, r.Shards
		mi.Version, mi.StartedAt, mi.AgentVersion, mi.Runtime, mi.Probes, mi.Telemetry = r.Version, r.StartedAt, r.AgentVersion, r.Runtime, r.Probes, r.Telemetry
		mi.CachedModels, mi.GatewayRates, mi.GatewayQueued = r.CachedModels, r.GatewayRates, r.GatewayQueued
		if mi.Gossip == "" {
			mi.Gossip = r.Gossip
		}
	}
	if mi.GPUs == nil {
		mi.GPUs = []placement.GPU{}
	}
	return mi
}

func (s *Snapshot) buildShards(plan placement.Plan, leases map[held]placement.LeaseState, lapses map[string]time.Time, records map[held]gossip.ShardRecord) {
	fill := func(sh *shard, r gossip.ShardRecord) {
		si := &sh.info
		si.Status, si.URL, si.PID, si.Container = r.Status, r.URL, r.PID, r.Container
		si.Private = r.Private
		si.Restarts, si.LastExit, si.StartedAt, si.Gang = r.Restarts, r.LastExit, r.StartedAt, r.Gang
		si.Note, si.NoteAt = r.Note, r.NoteAt
		si.PullMs, si.LoadMs = r.PullMs, r.LoadMs
		si.Adapters, si.AdapterErrors = r.Adapters, r.AdapterErrors
		si.KVPort = r.KVPort
		if si.Role == "" {
			si.Role = r.Role
		}
		sh.load = r.Load
		if r.Error != "" && si.Reason == "" {
			si.Reason = "start failed: " + r.Error
		}
		if si.Lease != placement.LeaseLapsed {
			si.LeaseExpires = lapses[si.Node]
		}
	}
	for _, a := range plan.Assignments {
		k := held{a.Node, a.ShardID, a.SpecVersion}
		lease, held := leases[k]
		if !held {
			lease = LeaseNone
		}
		sh := shard{planned: true, info: ShardInfo{ShardID: a.ShardID, ReplicaID: a.ReplicaID, Deployment: a.Deployment, Role: a.Role, SpecVersion: a.SpecVersion,
			Node: a.Node, GPUs: a.GPUs, Draining: a.Draining, Status: gossip.ShardPending, Lease: lease}}
		if r, ok := records[k]; ok {
			fill(&sh, r)
			delete(records, k)
		}
		s.shards = append(s.shards, sh)
	}
	// What is left is held but not planned.
	for k, r := range records {
		sh := shard{info: ShardInfo{ShardID: r.ShardID, ReplicaID: r.ReplicaID, Deployment: r.Deployment, SpecVersion: r.SpecVersion,
			Node: k.node, GPUs: r.GPUs, Lease: leases[k], Reason: ReasonNotPlanned}}
		if sh.info.Lease == placement.LeaseLapsed {
			sh.info.Reason = lapsedReason
		}
		fill(&sh, r)
		s.shards = append(s.shards, sh)
	}
	for _, u := range plan.Unplaced {
		s.shards = append(s.shards, shard{info: ShardInfo{ShardID: u.ShardID, ReplicaID: u.ReplicaID, Deployment: u.Deployment, Role: roleOf(u.ReplicaID),
			GPUs: []int{}, Status: gossip.ShardUnplaced, Lease: LeaseNone, Reason: u.Reason}})
	}
	// Sorted as indices, then moved once: a shard is hundreds of bytes,
	// and a stable sort comparing and swapping the shards themselves was
	// a sixth of a 100-node cluster's CPU (scaletest's profile).
	order := make([]int, len(s.shards))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int {
		a, b := &s.shards[i].info, &s.shards[j].info
		return cmp.Or(strings.Compare(a.ShardID, b.ShardID), strings.Compare(a.Node, b.Node), strings.Compare(a.SpecVersion, b.SpecVersion))
	})
	sorted := make([]shard, len(s.shards))
	for k, i := range order {
		sorted[k] = s.shards[i]
	}
	s.shards = sorted
}

// Reasons of shards that are held but not planned. ReasonNotPlanned is
// exported for readers of /v1/shards that must tell a copy being stopped
// from one the plan counts on (the scenario runner).
const (
	ReasonNotPlanned = "not in the plan: its node stops it"
	lapsedReason     = "lease lapsed (holder dead, restarted or not renewing); not routable"
)

func (s *Snapshot) buildDeployments(in Input) {
	// Shards by deployment, current spec version only, in shard order.
	byDep := map[string][]*shard{}
	for i := range s.shards {
		sh := &s.shards[i]
		byDep[sh.info.Deployment] = append(byDep[sh.info.Deployment], sh)
	}
	unplaced := map[string][]string{}
	for _, u := range in.Plan.Unplaced {
		unplaced[u.Deployment] = append(unplaced[u.Deployment], u.ShardID+": "+u.Reason)
	}
	// An autoscaled deployment's replicas are its decider's target, as
	// the view placed them.
	placedReplicas := map[string]int{}
	for _, d := range in.View.Deployments {
		placedReplicas[d.Name] = d.Replicas
	}
	shadow := adapterShadows(in.Deployments)
	for _, rec := range in.Deployments {
		if rec.Deleted || rec.Spec == nil {
			continue
		}
		d := rec.Spec.WithDefaults()
		var scale *ScaleInfo
		if d.Autoscale != nil {
			if r, ok := placedReplicas[d.Name]; ok {
				d.Replicas = r
			}
			scale = &ScaleInfo{Target: d.Replicas, Reason: "no target decided yet: the spec's replicas stand"}
			if t, ok := gossip.ScaleTargetFor(in.Members, rec); ok {
				scale.Decider, scale.Reason, scale.DecidedAt = t.At.Origin, t.Reason, time.UnixMilli(t.At.Wall).UTC()
				scale.LastColdStart = time.Duration(t.ColdStartMs) * time.Millisecond
				scale.LastColdStartPull = time.Duration(t.ColdStartPullMs) * time.Millisecond
				scale.LastColdStartLoad = time.Duration(t.ColdStartLoadMs) * time.Millisecond
				scale.Idle = t.Idle
				if t.LastRequest > 0 {
					scale.LastRequest = time.Unix(t.LastRequest*60, 0).UTC()
				}
			}
		}
		dep := deployment{info: DeploymentInfo{Deployment: d, SpecVersion: d.SpecVersion(), Stamp: rec.Stamp, Nodes: []string{}, Scale: scale}}
		info := &dep.info
		placed := map[string]bool{}
		nodes := map[string]bool{}
		// serving: replica → its shards with a valid lease, and when the
		// first of those leases lapses.
		type serving struct {
			shards map[string]bool
			until  time.Time
		}
		live := map[string]*serving{}
		type failed struct{ node, shard, why string }
		var starts []failed
		adapters := map[string]*AdapterInfo{}
		for _, a := range d.Adapters {
			info.AdapterStatus = append(info.AdapterStatus, AdapterInfo{Name: a.Name, Source: a.Source, Replicas: []string{},
				Shadowed: shadow[d.Name+"/"+a.Name]})
		}
		for i := range info.AdapterStatus {
			adapters[info.AdapterStatus[i].Name] = &info.AdapterStatus[i]
		}
		for _, sh := range byDep[d.Name] {
			si := sh.info
			if !sh.planned || si.SpecVersion != info.SpecVersion {
				continue
			}
			if si.Lease == placement.LeaseValid {
				for _, name := range si.Adapters {
					if a := adapters[name]; a != nil {
						a.Replicas = append(a.Replicas, si.ReplicaID)
					}
				}
				for _, e := range si.AdapterErrors {
					if a := adapters[e.Name]; a != nil {
						a.Errors = append(a.Errors, si.ReplicaID+": "+e.Error)
					}
				}
			}
			// Draining shards (replicas scaled away, a copy on a faulted
			// GPU) are not what was asked for, so they are not "placed";
			// but a copy on a faulted GPU still serves its replica.
			if !si.Draining {
				placed[si.ReplicaID] = true
				nodes[si.Node] = true
			}
			if si.Lease == placement.LeaseValid {
				sv := live[si.ReplicaID]
				if sv == nil {
					sv = &serving{shards: map[string]bool{}, until: si.LeaseExpires}
					live[si.ReplicaID] = sv
				}
				sv.shards[si.ShardID] = true
				if si.LeaseExpires.Before(sv.until) {
					sv.until = si.LeaseExpires
				}
			}
			// Placed but failing to start (a missing image or engine
			// binary): the holder says why in its record. Only holders the
			// plan still counts on: a dead node's last record, or an old
			// version's, would keep an error that no longer holds.
			if si.Reason != "" {
				starts = append(starts, failed{si.Node, si.ShardID, si.Reason})
			}
			// A gang member that is not serving says what holds the
			// gang back ("waiting for rank 0's address").
			if g := si.Gang; g != nil && g.Note != "" && si.Lease != placement.LeaseValid && si.Reason == "" {
				starts = append(starts, failed{si.Node, fmt.Sprintf("%s (rank %d)", si.ShardID, g.Rank), g.Note})
			}
		}
		roleReady := map[string]int{}
		for r, sv := range live {
			if placed[r] && len(sv.shards) == d.PipelineParallel {
				dep.readyUntil = append(dep.readyUntil, sv.until)
				roleReady[roleOf(r)]++
			}
		}
		for _, role := range d.Roles() {
			rs := RoleStatus{Role: role, Replicas: d.ForRole(role).Replicas, Ready: roleReady[role]}
			for r := range placed {
				if roleOf(r) == role {
					rs.Placed++
				}
			}
			info.Roles = append(info.Roles, rs)
		}
		slices.SortFunc(dep.readyUntil, time.Time.Compare)
		info.Placed, info.Ready = len(placed), len(dep.readyUntil)
		for node := range nodes {
			info.Nodes = append(info.Nodes, node)
		}
		sort.Strings(info.Nodes)
		info.Why = unplaced[d.Name]
		// By holder, then shard: the order of the records they come from.
		sort.SliceStable(starts, func(i, j int) bool { return starts[i].node < starts[j].node })
		for _, f := range starts {
			info.Why = append(info.Why, fmt.Sprintf("%s on %s: %s", f.shard, f.node, f.why))
		}
		s.deployments = append(s.deployments, dep)
	}
}

// SpecVersions maps each deployment's name to its spec version.
func SpecVersions(ds []placement.Deployment) map[string]string {
	out := make(map[string]string, len(ds))
	for _, d := range ds {
		out[d.Name] = d.WithDefaults().SpecVersion()
	}
	return out
}

// Self is the name of the node that built the snapshot.
func (s *Snapshot) Self() string { return s.self }

// BuiltAt is when the view behind the snapshot was taken.
func (s *Snapshot) BuiltAt() time.Time { return s.builtAt }

// Settled reports whether the node had heard the cluster when the pass
// began (Input.Settled). Until a snapshot says so, a deployment missing
// from it may simply not have reached this node yet: the gateway holds a
// request for it rather than answer that it does not exist.
func (s *Snapshot) Settled() bool { return s.settled }

// ActiveVersion is the cluster protocol version the node ran at (0 in a
// snapshot built before the first pass).
func (s *Snapshot) ActiveVersion() int { return s.activeVersion }

// VersionsMixedSince is since when live members announce different
// protocol versions (zero: they do not).
func (s *Snapshot) VersionsMixedSince() time.Time { return s.mixedSince }

// ReconcileTook is how long the reconcile pass that built it took.
func (s *Snapshot) ReconcileTook() time.Duration { return s.reconcileTook }

// Plans is how many passes the node has made, and how many of them
// computed a plan (the rest kept the last one: nothing it reads changed).
func (s *Snapshot) Plans() (reconciles, computed uint64) { return s.reconciles, s.plansComputed }

// Plan is the plan of the pass.
func (s *Snapshot) Plan() placement.Plan { return s.plan }

// PlannedFrom maps each deployment the plan was computed from to its spec
// version.
func (s *Snapshot) PlannedFrom() map[string]string {
	out := make(map[string]string, len(s.planned))
	for k, v := range s.planned {
		out[k] = v
	}
	return out
}

// Members lists every member this node knows, sorted by name.
func (s *Snapshot) Members() []MemberInfo { return slices.Clone(s.members) }

// Member returns one member by name.
func (s *Snapshot) Member(name string) (MemberInfo, bool) {
	for _, m := range s.members {
		if m.Name == name {
			return m, true
		}
	}
	return MemberInfo{}, false
}

// Deployments lists the live deployments as of now: a replica whose lease
// lapsed since the snapshot no longer counts as ready.
func (s *Snapshot) Deployments(now time.Time) []DeploymentInfo {
	out := make([]DeploymentInfo, 0, len(s.deployments))
	for _, d := range s.deployments {
		info := d.info
		info.Nodes, info.Why = slices.Clone(info.Nodes), slices.Clone(info.Why)
		// readyUntil is sorted: the replicas still ready are at its end.
		lapsed, _ := slices.BinarySearchFunc(d.readyUntil, now, time.Time.Compare)
		info.Ready = len(d.readyUntil) - lapsed
		out = append(out, info)
	}
	return out
}

// Shards lists every shard (planned, held, or unplaced) as of now: a lease
// past its lapse moment reads lapsed, and its holder's load is left out.
func (s *Snapshot) Shards(now time.Time) []ShardInfo {
	out := make([]ShardInfo, 0, len(s.shards))
	for _, sh := range s.shards {
		si := sh.info
		if si.Lease != placement.LeaseLapsed && !si.LeaseExpires.IsZero() && now.After(si.LeaseExpires) {
			si.Lease, si.LeaseExpires = placement.LeaseLapsed, time.Time{}
			if !sh.planned {
				si.Reason = lapsedReason
			}
		}
		// Load only from a holder with a valid lease: a dead node's last
		// record still carries its last reading, which every consumer
		// (MCP load, the page, llmgw top) would otherwise add to its
		// replacement's.
		if si.Lease == placement.LeaseValid {
			si.Load = sh.load
		}
		out = append(out, si)
	}
	return out
}

// adapterShadows says, by "deployment/adapter", which LoRA adapters a
// request cannot reach by name, and why: a deployment of that name wins,
// and of two deployments with an adapter of one name, the one whose name
// sorts first (the gateways' rule, supervisor/gateway Table.adapter).
func adapterShadows(recs []gossip.DeploymentRecord) map[string]string {
	if !slices.ContainsFunc(recs, func(r gossip.DeploymentRecord) bool { return r.Spec != nil && len(r.Spec.Adapters) > 0 }) {
		return nil // every pass of a cluster without adapters
	}
	names := map[string]bool{}
	var live []gossip.DeploymentRecord
	for _, r := range recs {
		if !r.Deleted && r.Spec != nil {
			names[r.Name] = true
			live = append(live, r)
		}
	}
	slices.SortFunc(live, func(a, b gossip.DeploymentRecord) int { return strings.Compare(a.Name, b.Name) })
	out := map[string]string{}
	first := map[string]string{}
	for _, r := range live {
		for _, a := range r.Spec.Adapters {
			switch owner, taken := first[a.Name]; {
			case names[a.Name]:
				out[r.Name+"/"+a.Name] = "shadowed: deployment " + a.Name + " has that name"
			case taken:
				out[r.Name+"/"+a.Name] = "shadowed: requests for " + a.Name + " go to deployment " + owner + "'s adapter"
			default:
				first[a.Name] = r.Name
			}
		}
	}
	return out
}

// roleOf is the role a replica ID names (placement.RoleReplicaID), "" for
// a replica of a deployment without roles.
func roleOf(replica string) string {
	_, role, _, _ := placement.ParseReplicaID(replica)
	return role
}
