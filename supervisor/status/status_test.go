package status

import (
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

const ttl = 3 * time.Second

// cluster is a small world: deployment "chat" (pipeline_parallel pp) with
// one replica whose shards run on n1 (and n2), each holder last seen at
// seen[node].
type cluster struct {
	spec    placement.Deployment
	members []gossip.Member
	view    placement.View
	plan    placement.Plan
}

func newCluster(pp int) *cluster {
	spec := placement.Deployment{Name: "chat", Model: "m", Engine: "fake", Replicas: 1, PipelineParallel: pp}.WithDefaults()
	return &cluster{spec: spec, view: placement.View{Deployments: []placement.Deployment{spec}}}
}

// hold makes node hold shard of replica chat-0 with lease, ready or not,
// its record last seen at seen, and plans it there.
func (c *cluster) hold(node, shard string, lease placement.LeaseState, seen time.Time, rec gossip.ShardRecord) {
	rec.ShardID, rec.ReplicaID, rec.Deployment, rec.SpecVersion = shard, "chat-0", "chat", c.spec.SpecVersion()
	if rec.Status == "" {
		rec.Status = gossip.ShardReady
	}
	c.members = append(c.members, gossip.Member{Name: node, State: gossip.StateAlive, SeenAt: seen,
		Record: &gossip.NodeRecord{Name: node, Shards: []gossip.ShardRecord{rec}}})
	c.view.Nodes = append(c.view.Nodes, placement.Node{Name: node, Alive: true,
		Shards: []placement.HeldShard{{ShardID: shard, SpecVersion: c.spec.SpecVersion(), Lease: lease}}})
	c.plan.Assignments = append(c.plan.Assignments, placement.Assignment{ShardID: shard, ReplicaID: "chat-0", Deployment: "chat",
		SpecVersion: c.spec.SpecVersion(), Node: node, GPUs: []int{0}})
}

func (c *cluster) build() *Snapshot {
	return Build(Input{Self: "n1", Now: t0, TTL: ttl, Plan: c.plan, View: c.view, Members: c.members,
		Deployments: []gossip.DeploymentRecord{{Name: "chat", Spec: &c.spec}}})
}

// A lease lapses by the clock: read after its holder's last renewal plus
// the TTL, it is lapsed, its load is gone and its replica is not ready,
// although no reconcile ran since.
func TestLeaseLapsesWhenReadLater(t *testing.T) {
	c := newCluster(1)
	c.hold("n1", "chat-0", placement.LeaseValid, t0.Add(-time.Second), gossip.ShardRecord{Ready: true, Load: gossip.ShardLoad{Running: 3}})
	snap := c.build()

	before := snap.Shards(t0.Add(time.Second))
	if got, want := before[0].LeaseExpires, t0.Add(2*time.Second); !got.Equal(want) {
		t.Fatalf("LeaseExpires = %v, want %v (last seen 1 s ago, TTL 3 s)", got, want)
	}
	if len(before) != 1 || before[0].Lease != placement.LeaseValid || before[0].Load.Running != 3 || before[0].LeaseExpires.IsZero() {
		t.Fatalf("within the TTL: %+v, want a valid lease with its load and expiry", before)
	}
	if d := snap.Deployments(t0.Add(time.Second)); d[0].Ready != 1 {
		t.Fatalf("within the TTL: ready = %d, want 1", d[0].Ready)
	}
	after := snap.Shards(t0.Add(2*time.Second + time.Millisecond))
	if after[0].Lease != placement.LeaseLapsed || !reflect.DeepEqual(after[0].Load, gossip.ShardLoad{}) || !after[0].LeaseExpires.IsZero() {
		t.Fatalf("past the TTL: %+v, want lapsed, no load, no expiry", after[0])
	}
	if d := snap.Deployments(t0.Add(3 * time.Second)); d[0].Ready != 0 || d[0].Placed != 1 {
		t.Fatalf("past the TTL: ready %d placed %d, want 0 and 1", d[0].Ready, d[0].Placed)
	}
	// Reading never changes the snapshot.
	if again := snap.Shards(t0); again[0].Lease != placement.LeaseValid {
		t.Fatalf("a later read changed the snapshot: %+v", again[0])
	}
}

// A gang replica is ready only while every one of its shards holds a valid
// lease: its readiness ends with the first lease to lapse.
func TestGangReplicaIsReadyUntilItsFirstLeaseLapses(t *testing.T) {
	c := newCluster(2)
	c.hold("n1", "chat-0-s0", placement.LeaseValid, t0, gossip.ShardRecord{Ready: true})
	c.hold("n2", "chat-0-s1", placement.LeaseValid, t0.Add(-2*time.Second), gossip.ShardRecord{Ready: true})
	snap := c.build()
	if d := snap.Deployments(t0.Add(500 * time.Millisecond)); d[0].Ready != 1 {
		t.Fatalf("both leases valid: ready = %d, want 1", d[0].Ready)
	}
	if d := snap.Deployments(t0.Add(1500 * time.Millisecond)); d[0].Ready != 0 {
		t.Fatalf("n2's lease lapsed at t0+1s: ready = %d, want 0", d[0].Ready)
	}

	c = newCluster(2)
	c.hold("n1", "chat-0-s0", placement.LeaseValid, t0, gossip.ShardRecord{Ready: true})
	c.hold("n2", "chat-0-s1", placement.LeaseStarting, t0, gossip.ShardRecord{Status: gossip.ShardStarting})
	if d := c.build().Deployments(t0); d[0].Ready != 0 || d[0].Placed != 1 {
		t.Fatalf("one shard still starting: ready %d placed %d, want 0 and 1", d[0].Ready, d[0].Placed)
	}
}

// Start errors come from the holders the plan counts on, ordered by holder;
// a held copy the plan no longer counts on says its node stops it, and once
// its lease lapses, that it is not routable.
func TestReasons(t *testing.T) {
	c := newCluster(2)
	c.hold("n2", "chat-0-s1", placement.LeaseStarting, t0, gossip.ShardRecord{Status: gossip.ShardBackoff, Error: "no image"})
	c.hold("n1", "chat-0-s0", placement.LeaseStarting, t0, gossip.ShardRecord{Status: gossip.ShardBackoff, Error: "no binary"})
	// n3 holds an old copy the plan does not count on.
	c.members = append(c.members, gossip.Member{Name: "n3", State: gossip.StateAlive, SeenAt: t0,
		Record: &gossip.NodeRecord{Name: "n3", Shards: []gossip.ShardRecord{{ShardID: "chat-0-s0", ReplicaID: "chat-0", Deployment: "chat",
			SpecVersion: "old", Status: gossip.ShardReady, Ready: true, Error: "stale"}}}})
	c.view.Nodes = append(c.view.Nodes, placement.Node{Name: "n3", Alive: true,
		Shards: []placement.HeldShard{{ShardID: "chat-0-s0", SpecVersion: "old", Lease: placement.LeaseValid}}})
	snap := c.build()

	want := []string{"chat-0-s0 on n1: start failed: no binary", "chat-0-s1 on n2: start failed: no image"}
	if got := snap.Deployments(t0)[0].Why; !slices.Equal(got, want) {
		t.Fatalf("why = %q, want %q", got, want)
	}
	reason := func(now time.Time) string {
		for _, s := range snap.Shards(now) {
			if s.Node == "n3" {
				return s.Reason
			}
		}
		return "(n3's copy missing)"
	}
	if got := reason(t0); got != ReasonNotPlanned {
		t.Fatalf("n3's copy: reason %q, want %q", got, ReasonNotPlanned)
	}
	if got := reason(t0.Add(ttl + time.Second)); got != lapsedReason {
		t.Fatalf("n3's copy after its lease lapsed: reason %q, want %q", got, lapsedReason)
	}
}

// Unplaced shards are listed with the reason placement gave, and a
// snapshot of an empty cluster lists nothing without failing.
func TestUnplacedAndEmpty(t *testing.T) {
	c := newCluster(1)
	c.plan.Unplaced = []placement.Unplaced{{ShardID: "chat-0", ReplicaID: "chat-0", Deployment: "chat", Reason: "needs 1 GPU"}}
	snap := c.build()
	sh := snap.Shards(t0)
	if len(sh) != 1 || sh[0].Status != gossip.ShardUnplaced || sh[0].Reason != "needs 1 GPU" || sh[0].Lease != LeaseNone {
		t.Fatalf("shards = %+v, want one unplaced shard with its reason", sh)
	}
	if d := snap.Deployments(t0); d[0].Placed != 0 || !slices.Equal(d[0].Why, []string{"chat-0: needs 1 GPU"}) {
		t.Fatalf("deployment = %+v", d[0])
	}

	empty := Build(Input{Self: "n1", Now: t0, TTL: ttl})
	if len(empty.Shards(t0)) != 0 || len(empty.Deployments(t0)) != 0 || empty.Self() != "n1" {
		t.Fatalf("empty snapshot: %+v", empty)
	}
}

// The gateways clients can use are the alive members' with their scheme:
// https where the record says the gateway speaks TLS.
func TestGateways(t *testing.T) {
	s := Build(Input{Self: "a", Now: t0, TTL: ttl, Members: []gossip.Member{
		{Name: "a", State: gossip.StateAlive, Record: &gossip.NodeRecord{Name: "a", Gateway: "10.0.0.1:8000"}},
		{Name: "b", State: gossip.StateAlive, Record: &gossip.NodeRecord{Name: "b", Gateway: "10.0.0.2:8443", GatewayTLS: true}},
		{Name: "c", State: gossip.StateAlive, Record: &gossip.NodeRecord{Name: "c"}},                          // runs none
		{Name: "d", State: gossip.StateDead, Record: &gossip.NodeRecord{Name: "d", Gateway: "10.0.0.4:8000"}}, // not reachable
	}})
	got := Gateways(s.Members())
	want := []GatewayInfo{{Node: "a", URL: "http://10.0.0.1:8000"}, {Node: "b", URL: "https://10.0.0.2:8443"}}
	if !slices.Equal(got, want) {
		t.Fatalf("Gateways = %v, want %v", got, want)
	}
	if g := Gateways(nil); g == nil || len(g) != 0 {
		t.Errorf("no members: %#v, want an empty list (JSON [])", g)
	}
}

// An autoscaled deployment reads, wherever it is shown, the target the
// view placed (the decider's), with who decided it and why; a fixed one
// has no scale part.
func TestAutoscaledDeploymentShowsItsTarget(t *testing.T) {
	spec := placement.Deployment{Name: "chat", Model: "m", Engine: "fake", Replicas: 1, Autoscale: &placement.Autoscale{Min: 1, Max: 4}}.WithDefaults()
	stamp := gossip.Stamp{Wall: t0.UnixMilli(), Origin: "n1"}
	placed := spec
	placed.Replicas = 3
	members := []gossip.Member{{Name: "n2", State: gossip.StateAlive, SeenAt: t0, Record: &gossip.NodeRecord{Name: "n2",
		Scale: []gossip.ScaleTarget{{Deployment: "chat", Spec: stamp, Replicas: 3, At: gossip.Stamp{Wall: t0.UnixMilli() + 5000, Origin: "n2"}, Reason: "scaling up: 20 in flight"}}}}}
	fixed := placement.Deployment{Name: "other", Model: "m", Engine: "fake", Replicas: 2}.WithDefaults()
	snap := Build(Input{Self: "n1", Now: t0, TTL: ttl, Members: members,
		View:        placement.View{Deployments: []placement.Deployment{placed, fixed}},
		Deployments: []gossip.DeploymentRecord{{Name: "chat", Spec: &spec, Stamp: stamp}, {Name: "other", Spec: &fixed, Stamp: stamp}}})
	ds := snap.Deployments(t0)
	if len(ds) != 2 {
		t.Fatalf("%d deployments", len(ds))
	}
	chat, other := ds[0], ds[1]
	if chat.Name != "chat" {
		chat, other = other, chat
	}
	if chat.Replicas != 3 || chat.Scale == nil || chat.Scale.Target != 3 || chat.Scale.Decider != "n2" || chat.Scale.Reason != "scaling up: 20 in flight" ||
		!chat.Scale.DecidedAt.Equal(t0.Add(5*time.Second)) {
		t.Errorf("chat = replicas %d, scale %+v", chat.Replicas, chat.Scale)
	}
	if other.Replicas != 2 || other.Scale != nil {
		t.Errorf("the fixed deployment = replicas %d, scale %+v", other.Replicas, other.Scale)
	}
}

// An adapter a request cannot reach by name says why: a deployment of
// that name wins, and of two deployments with an adapter of one name the
// one whose name sorts first.
func TestAdapterShadows(t *testing.T) {
	spec := func(name string, adapters ...string) gossip.DeploymentRecord {
		d := placement.Deployment{Name: name, Model: "m", Replicas: 1, MaxLoras: 1}
		for _, a := range adapters {
			d.Adapters = append(d.Adapters, placement.Adapter{Name: a, Source: "s/" + a})
		}
		return gossip.DeploymentRecord{Name: name, Spec: &d}
	}
	snap := Build(Input{Self: "n1", Now: time.Unix(1_800_000_000, 0), TTL: time.Second,
		Deployments: []gossip.DeploymentRecord{spec("b", "x"), spec("a", "x", "c"), spec("c")}})
	got := map[string]string{}
	for _, d := range snap.Deployments(time.Unix(1_800_000_000, 0)) {
		for _, a := range d.AdapterStatus {
			got[d.Name+"/"+a.Name] = a.Shadowed
		}
	}
	want := map[string]string{
		"a/x": "",
		"a/c": "shadowed: deployment c has that name",
		"b/x": "shadowed: requests for x go to deployment a's adapter",
	}
	if !maps.Equal(got, want) {
		t.Errorf("shadows %v, want %v", got, want)
	}
}
