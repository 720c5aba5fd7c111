package supervisor

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// scaleWorld is the gossip state of a few nodes as one of them holds it.
type scaleWorld struct {
	// mu guards the records for a test whose autoscaler runs its loop.
	mu      sync.Mutex
	self    string
	members []gossip.Member
	deps    []gossip.DeploymentRecord
	wall    int64
	updates int
}

// scaleOf is a copy of node name's published targets.
func (w *scaleWorld) scaleOf(name string) []gossip.ScaleTarget {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.record(name).Scale)
}

func (w *scaleWorld) Members() []gossip.Member               { return w.members }
func (w *scaleWorld) Deployments() []gossip.DeploymentRecord { return w.deps }

func (w *scaleWorld) record(name string) *gossip.NodeRecord {
	for _, m := range w.members {
		if m.Name == name {
			return m.Record
		}
	}
	return nil
}

func (w *scaleWorld) Local() gossip.NodeRecord {
	w.mu.Lock()
	defer w.mu.Unlock()
	return *w.record(w.self)
}

func (w *scaleWorld) UpdateLocal(fn func(r *gossip.NodeRecord)) gossip.NodeRecord {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.updates++
	fn(w.record(w.self))
	return *w.record(w.self)
}

func (w *scaleWorld) StampAfter(s gossip.Stamp) gossip.Stamp {
	w.wall = max(w.wall, s.Wall) + 1
	return gossip.Stamp{Wall: w.wall, Origin: w.self}
}

func newScaleWorld(self string, names ...string) *scaleWorld {
	w := &scaleWorld{self: self, wall: 1000}
	for _, n := range names {
		w.members = append(w.members, gossip.Member{Name: n, State: gossip.StateAlive, Record: &gossip.NodeRecord{Name: n}})
	}
	spec := placement.Deployment{Name: "chat", Model: "m", Engine: "fake", Replicas: 2, Autoscale: &placement.Autoscale{Min: 1, Max: 4}}
	w.deps = []gossip.DeploymentRecord{{Name: "chat", Spec: &spec, Stamp: gossip.Stamp{Wall: 500, Origin: "n1"}}}
	return w
}

func scalerOn(w *scaleWorld) *autoscaler {
	var settled atomic.Bool
	settled.Store(true)
	clk := clock.NewFake(time.Date(2026, 12, 4, 3, 0, 0, 0, time.UTC))
	first := status.Build(status.Input{Self: w.self, Now: clk.Now(), TTL: 3 * time.Second})
	return &autoscaler{self: w.self, clock: clk, log: slog.New(slog.DiscardHandler), cluster: w,
		reads: newReadModel(clk, first, make(chan struct{}), newWakeup()), settled: &settled, deciders: map[scaleKey]*deciding{}}
}

// The decider is the same for everyone who sees the same alive nodes, and
// a node's death moves only the deployments it decided.
func TestDeciderIsRendezvous(t *testing.T) {
	all := []string{"n1", "n2", "n3", "n4"}
	moved := 0
	for i := range 40 {
		dep := "d" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		d := decider(dep, all)
		if again := decider(dep, []string{"n4", "n3", "n2", "n1"}); again != d {
			t.Fatalf("%s: %s in one order, %s in another", dep, d, again)
		}
		var without []string
		for _, n := range all {
			if n != "n2" {
				without = append(without, n)
			}
		}
		if after := decider(dep, without); after != d {
			moved++
			if d != "n2" {
				t.Errorf("%s moved from %s to %s when n2 died", dep, d, after)
			}
		}
	}
	if moved == 0 || moved == 40 {
		t.Errorf("n2's death moved %d of 40 deployments", moved)
	}
}

// The decider writes a target even when it keeps the spec's count, so the
// count stands when the spec's replicas would not (its own record is the
// one in force); an unchanged target is not written again; a node that is
// not the decider writes nothing.
func TestDeciderPublishesAndOthersDoNot(t *testing.T) {
	names := []string{"n1", "n2", "n3"}
	dec := decider("chat", names)
	var other string
	for _, n := range names {
		if n != dec {
			other = n
		}
	}
	w := newScaleWorld(dec, names...)
	a := scalerOn(w)
	a.pass()
	got := w.record(dec).Scale
	if len(got) != 1 || got[0].Replicas != 2 || got[0].Spec != w.deps[0].Stamp || got[0].Reason != "no load reading yet: target kept" {
		t.Fatalf("decider %s published %+v, want chat at its spec's 2", dec, got)
	}
	a.pass()
	if w.updates != 1 {
		t.Errorf("an unchanged target was written again: %d updates", w.updates)
	}
	ow := newScaleWorld(other, names...)
	scalerOn(ow).pass()
	if len(ow.record(other).Scale) != 0 || ow.updates != 0 {
		t.Errorf("%s, not the decider, published %+v", other, ow.record(other).Scale)
	}
}

// A former decider keeps its target while it is the one in force (the
// new decider has not written yet: dropping it would put the spec's
// replicas back for a moment), and drops it once a newer one is out.
func TestFormerDeciderHandsOver(t *testing.T) {
	names := []string{"n1", "n2", "n3"}
	dec := decider("chat", names)
	var former string
	for _, n := range names {
		if n != dec {
			former = n
		}
	}
	w := newScaleWorld(former, names...)
	mine := gossip.ScaleTarget{Deployment: "chat", Spec: w.deps[0].Stamp, Replicas: 3, At: gossip.Stamp{Wall: 900, Origin: former}}
	w.record(former).Scale = []gossip.ScaleTarget{mine}
	a := scalerOn(w)
	a.pass()
	if got := w.record(former).Scale; len(got) != 1 || got[0] != mine {
		t.Fatalf("the former decider dropped the target in force: %+v", got)
	}
	if v := BuildView(w.members, w.deps, time.Now(), time.Hour); v.Deployments[0].Replicas != 3 {
		t.Errorf("the view places %d replicas, want the target 3", v.Deployments[0].Replicas)
	}
	w.record(dec).Scale = []gossip.ScaleTarget{{Deployment: "chat", Spec: w.deps[0].Stamp, Replicas: 3, At: gossip.Stamp{Wall: 950, Origin: dec}}}
	a.pass()
	if got := w.record(former).Scale; len(got) != 0 {
		t.Errorf("the former decider kept %+v after %s's newer target", got, dec)
	}
	// A target beyond the range (an operator narrowed it) is clamped; one
	// for an older spec is ignored.
	w.deps[0].Spec.Autoscale.Max = 2
	if v := BuildView(w.members, w.deps, time.Now(), time.Hour); v.Deployments[0].Replicas != 2 {
		t.Errorf("a target of 3 with max 2: the view places %d", v.Deployments[0].Replicas)
	}
	w.deps[0].Stamp = gossip.Stamp{Wall: 2000, Origin: "n1"}
	if v := BuildView(w.members, w.deps, time.Now(), time.Hour); v.Deployments[0].Replicas != 2 {
		t.Errorf("after a new place, a target for the old spec counts: the view places %d, want the spec's 2", v.Deployments[0].Replicas)
	}
}

// An autoscaled spec is refused until the cluster runs protocol 5: a
// protocol 4 node would place its replicas and relay it without the range.
func TestAutoscaleNeedsProtocol5(t *testing.T) {
	// And priority, which GPU sharing reads, protocol 6.
	for _, tc := range []struct {
		spec    placement.Deployment
		field   string
		version int
	}{
		{placement.Deployment{Name: "chat", Model: "m", Replicas: 1, Autoscale: &placement.Autoscale{Min: 1, Max: 3}}, "autoscale", 5},
		{placement.Deployment{Name: "chat", Model: "m", Replicas: 1, Priority: 5}, "priority", 6},
	} {
		err := knownToCluster(tc.spec, tc.version-1)
		want := fmt.Sprintf("%s needs cluster protocol %d", tc.field, tc.version)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), fmt.Sprintf("the cluster runs protocol %d", tc.version-1)) {
			t.Errorf("%s at protocol %d: %v, want %q", tc.field, tc.version-1, err, want)
		}
		if err := knownToCluster(tc.spec, tc.version); err != nil {
			t.Errorf("%s at protocol %d: %v", tc.field, tc.version, err)
		}
	}
}

// At zero, a gateway's published rate for the deployment wakes it to one;
// its first ready replica ends the cold start, which the decider times
// and publishes with the target.
func TestWakeFromZeroIsTimed(t *testing.T) {
	w := newScaleWorld("n1", "n1")
	spec := w.deps[0].Spec
	spec.Autoscale.Min, spec.Replicas = 0, 0
	a := scalerOn(w)
	clk := a.clock.(*clock.Fake)
	snapshot := func(rate float64, ready bool) *status.Snapshot {
		now := clk.Now()
		placed := *spec
		placed.Replicas = 0
		rec := &gossip.NodeRecord{Name: "n1", Gateway: "127.0.0.1:8000", GatewayRates: map[string]float64{"chat": rate}}
		var view placement.View
		var plan placement.Plan
		node := placement.Node{Name: "n1", Alive: true}
		if ready {
			placed.Replicas = 1
			ver := spec.WithDefaults().SpecVersion()
			rec.Shards = []gossip.ShardRecord{{ShardID: "chat-0", ReplicaID: "chat-0", Deployment: "chat", SpecVersion: ver, GPUs: []int{0},
				Status: gossip.ShardReady, Ready: true, URL: "http://127.0.0.1:8100", PullMs: 1500, LoadMs: 2000}}
			node.Shards = []placement.HeldShard{{ShardID: "chat-0", SpecVersion: ver, Lease: placement.LeaseValid}}
			plan.Assignments = []placement.Assignment{{ShardID: "chat-0", ReplicaID: "chat-0", Deployment: "chat", SpecVersion: ver, Node: "n1", GPUs: []int{0}}}
		}
		view.Nodes, view.Deployments = []placement.Node{node}, []placement.Deployment{placed}
		return status.Build(status.Input{Self: "n1", Now: now, TTL: time.Hour, View: view, Plan: plan, Settled: true,
			Members: []gossip.Member{{Name: "n1", State: gossip.StateAlive, SeenAt: now, Record: rec}}, Deployments: w.deps})
	}
	a.reads.snap.Store(snapshot(0, false))
	a.pass()
	if got := w.record("n1").Scale; len(got) != 1 || got[0].Replicas != 0 {
		t.Fatalf("idle at zero: %+v", got)
	}
	a.reads.snap.Store(snapshot(0.1, false))
	a.pass()
	if got := w.record("n1").Scale; len(got) != 1 || got[0].Replicas != 1 || !strings.HasPrefix(got[0].Reason, "waking") {
		t.Fatalf("a request at a gateway: %+v, want woken to 1", got)
	}
	clk.Advance(7 * time.Second)
	a.reads.snap.Store(snapshot(0.1, true))
	a.pass()
	if got := w.record("n1").Scale; len(got) != 1 || got[0].Replicas != 1 || got[0].ColdStartMs != 7000 ||
		got[0].ColdStartPullMs != 1500 || got[0].ColdStartLoadMs != 2000 {
		t.Errorf("ready 7 s after the wake: %+v, want a cold start of 7000 ms, of which the holder's pull 1500 and load 2000", got)
	}
}

// The decider says its deployment is idle, with the minute of its last
// request, once its yield window passed without one, and that is what
// every node's view reads as the deployment's use; a request makes it
// busy again (and the minute is dropped: a busy deployment's target is
// not republished every minute).
func TestDeciderPublishesIdleForSharing(t *testing.T) {
	w := newScaleWorld("n1", "n1")
	spec := w.deps[0].Spec
	spec.Autoscale.Min, spec.Autoscale.ScaleDownDelay = 0, placement.Duration(20*time.Second)
	a := scalerOn(w)
	clk := a.clock.(*clock.Fake)
	rate := func(r float64) {
		now := clk.Now()
		rec := &gossip.NodeRecord{Name: "n1", Gateway: "127.0.0.1:8000", GatewayRates: map[string]float64{"chat": r}}
		a.reads.snap.Store(status.Build(status.Input{Self: "n1", Now: now, TTL: time.Hour, Settled: true,
			Members: []gossip.Member{{Name: "n1", State: gossip.StateAlive, SeenAt: now, Record: rec}}, Deployments: w.deps}))
		a.pass()
	}
	rate(1)
	busyAt := clk.Now()
	clk.Advance(10 * time.Second)
	rate(0)
	if got := w.record("n1").Scale[0]; got.Idle || got.LastRequest != 0 {
		t.Fatalf("10 s after a request: %+v, want busy", got)
	}
	clk.Advance(10 * time.Second)
	rate(0)
	got := w.record("n1").Scale[0]
	if !got.Idle || got.LastRequest != busyAt.Unix()/60 {
		t.Fatalf("20 s (the scale-down delay) after a request: %+v, want idle since minute %d", got, busyAt.Unix()/60)
	}
	w.members[0].Record.Scale = []gossip.ScaleTarget{got}
	v := BuildView(w.members, w.deps, clk.Now(), time.Hour)
	if u := v.Usage["chat"]; !u.Idle || u.LastRequest != got.LastRequest || v.Share {
		t.Errorf("the view reads %+v (share %v), want idle since %d and sharing left to the caller", u, v.Share, got.LastRequest)
	}
	clk.Advance(5 * time.Second)
	rate(0.1)
	if got := w.record("n1").Scale[0]; got.Idle || got.LastRequest != 0 {
		t.Errorf("a request again: %+v, want busy", got)
	}
}

// Requests a gateway queues (every replica at its bound by its estimate)
// are demand the engines do not show: the decider adds them to the
// engines' running and waiting, and scales up for them.
func TestQueuedRequestsAreDemand(t *testing.T) {
	w := newScaleWorld("n1", "n1")
	spec := w.deps[0].Spec
	spec.Replicas, spec.MaxNumSeqs = 1, 2
	a := scalerOn(w)
	clk := a.clock.(*clock.Fake)
	decide := func(queued int) gossip.ScaleTarget {
		now := clk.Now()
		ver := spec.WithDefaults().SpecVersion()
		rec := &gossip.NodeRecord{Name: "n1", Gateway: "127.0.0.1:8000", GatewayRates: map[string]float64{"chat": 3},
			Shards: []gossip.ShardRecord{{ShardID: "chat-0", ReplicaID: "chat-0", Deployment: "chat", SpecVersion: ver, GPUs: []int{0},
				Status: gossip.ShardReady, Ready: true, URL: "http://127.0.0.1:8100", Load: gossip.ShardLoad{Running: 2, ScrapedAt: now}}}}
		if queued > 0 {
			rec.GatewayQueued = map[string]int{"chat": queued}
		}
		node := placement.Node{Name: "n1", Alive: true, Shards: []placement.HeldShard{{ShardID: "chat-0", SpecVersion: ver, Lease: placement.LeaseValid}}}
		plan := placement.Plan{Assignments: []placement.Assignment{{ShardID: "chat-0", ReplicaID: "chat-0", Deployment: "chat", SpecVersion: ver, Node: "n1", GPUs: []int{0}}}}
		a.reads.snap.Store(status.Build(status.Input{Self: "n1", Now: now, TTL: time.Hour, Settled: true, Plan: plan,
			View:    placement.View{Nodes: []placement.Node{node}, Deployments: []placement.Deployment{*spec}},
			Members: []gossip.Member{{Name: "n1", State: gossip.StateAlive, SeenAt: now, Record: rec}}, Deployments: w.deps}))
		a.pass()
		clk.Advance(5 * time.Second)
		return w.record("n1").Scale[0]
	}
	if got := decide(0); got.Replicas != 1 {
		t.Fatalf("two running on one replica of two: %+v, want 1", got)
	}
	if got := decide(5); got.Replicas != 4 {
		t.Errorf("two running and five queued at a gateway, two per replica: %+v, want ceil(7/2) = 4", got)
	}
}

// A deployment at zero that this node decides wakes as soon as a snapshot
// shows a request held at a gateway, not at the next tick: the clock does
// not move here.
func TestWakeAtOnceOnARequest(t *testing.T) {
	w := newScaleWorld("n1", "n1")
	spec := w.deps[0].Spec
	spec.Autoscale.Min, spec.Replicas = 0, 0
	a := scalerOn(w)
	snapshot := func(rate float64) *status.Snapshot {
		now := a.clock.Now()
		rec := &gossip.NodeRecord{Name: "n1", Gateway: "127.0.0.1:8000", GatewayRates: map[string]float64{"chat": rate}}
		return status.Build(status.Input{Self: "n1", Now: now, TTL: time.Hour, Settled: true,
			Members: []gossip.Member{{Name: "n1", State: gossip.StateAlive, SeenAt: now, Record: rec}}, Deployments: w.deps})
	}
	a.reads.store(snapshot(0), 0)
	a.pass() // at zero, published
	if got := w.record("n1").Scale; len(got) != 1 || got[0].Replicas != 0 {
		t.Fatalf("idle at zero: %+v", got)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { a.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	// The loop waits for the next snapshot; a store while it waits wakes it.
	testwait.Until(t, 5*time.Second, "woken to 1 by a request held at a gateway, the clock standing still", func() (bool, string) {
		a.reads.store(snapshot(0.1), 0)
		got := w.scaleOf("n1")
		return len(got) == 1 && got[0].Replicas == 1, fmt.Sprintf("%+v", got)
	})
}
