package gateway

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

func routeIDs(rs []Route) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.ShardID+"@"+r.Node)
	}
	return out
}

func sameStrings(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }

// Only ready copies with a valid lease, planned, on a live node, are
// routable; starting, lapsed, crashed, unplanned and dead-node copies are
// not.
func TestTableRoutesOnlyReadyValidPlannedCopies(t *testing.T) {
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat", Replicas: 6})
	for _, n := range []string{"n1", "n2", "n3", "n4", "n5"} {
		w.node(n, gossip.StateAlive)
	}
	w.node("n6", gossip.StateDead)
	w.hold(cp{dep: "chat", replica: 0, node: "n1", url: "http://n1:8100"})
	w.hold(cp{dep: "chat", replica: 1, node: "n2", url: "http://n2:8100", lease: placement.LeaseStarting})
	w.hold(cp{dep: "chat", replica: 2, node: "n3", url: "http://n3:8100", lease: placement.LeaseLapsed, status: gossip.ShardReady})
	w.hold(cp{dep: "chat", replica: 3, node: "n4", url: "http://n4:8100", lease: placement.LeaseStarting, status: gossip.ShardCrashed})
	w.hold(cp{dep: "chat", replica: 4, node: "n5", url: "http://n5:8100", planned: ptr(false)})
	w.hold(cp{dep: "chat", replica: 5, node: "n6", url: "http://n6:8100"})
	tb := BuildTable(w.snapshot(), t0)

	rs := tb.Routes("chat")
	if !sameStrings(routeIDs(rs), []string{"chat-0@n1"}) {
		t.Fatalf("routes = %v, want only chat-0 on n1", routeIDs(rs))
	}
	r := rs[0]
	if r.URL != "http://n1:8100" || r.EngineID != "chat-0-"+w.specs["chat"].SpecVersion() || r.Suspect || r.Draining {
		t.Fatalf("route = %+v", r)
	}
	if want := t0.Add(ttl); !r.LeaseExpires.Equal(want) {
		t.Fatalf("lease expires %v, want %v", r.LeaseExpires, want)
	}
}

// A table built after the leases lapsed routes nothing, and explains.
func TestTableJudgesLeasesAtItsNow(t *testing.T) {
	w := oneDeployment("http://n1:8100")
	snap := w.snapshot()
	if got := BuildTable(snap, t0.Add(ttl-time.Millisecond)).Routes("chat"); len(got) != 1 {
		t.Fatalf("within the TTL: %d routes, want 1", len(got))
	}
	tb := BuildTable(snap, t0.Add(ttl+time.Millisecond))
	if got := tb.Routes("chat"); len(got) != 0 {
		t.Fatalf("past the TTL: routes %v, want none", routeIDs(got))
	}
	e, _ := tb.Entry("chat")
	if !strings.Contains(e.Why, "chat-0 on n1: lease lapsed") {
		t.Fatalf("why = %q, want the lapsed lease named", e.Why)
	}
}

// Suspect nodes' replicas are in the table, marked, and the gateway uses
// them only when nothing else is routable.
func TestTableMarksSuspectNodes(t *testing.T) {
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat", Replicas: 2})
	w.node("n1", gossip.StateAlive)
	w.node("n2", gossip.StateSuspect)
	w.hold(cp{dep: "chat", replica: 0, node: "n1", url: "http://n1:8100"})
	w.hold(cp{dep: "chat", replica: 1, node: "n2", url: "http://n2:8100"})
	rs := BuildTable(w.snapshot(), t0).Routes("chat")
	if len(rs) != 2 || rs[0].Suspect || !rs[1].Suspect {
		t.Fatalf("routes = %+v, want chat-0 healthy and chat-1 suspect", rs)
	}
}

// During a rollout the old version's copy drains and stays routable until
// its replacement is ready; then both serve.
func TestTableRoutesDrainingCopies(t *testing.T) {
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat"})
	w.node("n1", gossip.StateAlive)
	w.node("n2", gossip.StateAlive)
	w.hold(cp{dep: "chat", node: "n1", url: "http://n1:8100", spec: "oldversion00", drain: true})
	w.hold(cp{dep: "chat", node: "n2", url: "http://n2:8100", lease: placement.LeaseStarting})
	rs := BuildTable(w.snapshot(), t0).Routes("chat")
	if len(rs) != 1 || rs[0].SpecVersion != "oldversion00" || !rs[0].Draining {
		t.Fatalf("routes = %+v, want the draining old copy", rs)
	}

	w = newWorld()
	w.deploy(placement.Deployment{Name: "chat"})
	w.node("n1", gossip.StateAlive)
	w.node("n2", gossip.StateAlive)
	w.hold(cp{dep: "chat", node: "n1", url: "http://n1:8100", spec: "oldversion00", drain: true})
	w.hold(cp{dep: "chat", node: "n2", url: "http://n2:8100"})
	if rs := BuildTable(w.snapshot(), t0).Routes("chat"); len(rs) != 2 {
		t.Fatalf("routes = %v, want old and new", routeIDs(rs))
	}
}

// A gang is routable only whole, and only through its rank-0 shard.
func TestTableGangOnlyWholeViaRankZero(t *testing.T) {
	mk := func(s1 placement.LeaseState) *world {
		w := newWorld()
		w.deploy(placement.Deployment{Name: "big", PipelineParallel: 2})
		w.node("n1", gossip.StateAlive)
		w.node("n2", gossip.StateAlive)
		w.hold(cp{dep: "big", shard: 0, node: "n1", url: "http://n1:8100", load: gossip.ShardLoad{Running: 2, Waiting: 1}})
		w.hold(cp{dep: "big", shard: 1, node: "n2", url: "http://n2:8100", lease: s1})
		return w
	}
	rs := BuildTable(mk(placement.LeaseValid).snapshot(), t0).Routes("big")
	if !sameStrings(routeIDs(rs), []string{"big-0-s0@n1"}) || rs[0].URL != "http://n1:8100" || rs[0].Load != 3 {
		t.Fatalf("whole gang: routes %+v, want one via big-0-s0 on n1 with load 3", rs)
	}
	if rs[0].EngineID != "big-0-s0-"+mk(placement.LeaseValid).specs["big"].SpecVersion() {
		t.Fatalf("engine ID %q", rs[0].EngineID)
	}
	tb := BuildTable(mk(placement.LeaseStarting).snapshot(), t0)
	if rs := tb.Routes("big"); len(rs) != 0 {
		t.Fatalf("rank 1 starting: routes %v, want none", routeIDs(rs))
	}
	if e, _ := tb.Entry("big"); !strings.Contains(e.Why, "big-0-s0 on n1: ready, waiting for the rest of its gang") {
		t.Fatalf("why = %q", e.Why)
	}

	// Rank 0 missing, rank 1 valid: nothing to route to.
	w := newWorld()
	w.deploy(placement.Deployment{Name: "big", PipelineParallel: 2})
	w.node("n2", gossip.StateAlive)
	w.hold(cp{dep: "big", shard: 1, node: "n2", url: "http://n2:8100"})
	if rs := BuildTable(w.snapshot(), t0).Routes("big"); len(rs) != 0 {
		t.Fatalf("no rank 0: routes %v", routeIDs(rs))
	}

	// An old version's gang, whose spec the snapshot lacks, is sized from
	// its shards: with one of its three shards lapsed it is not routable.
	w = newWorld()
	w.deploy(placement.Deployment{Name: "big", PipelineParallel: 2})
	for _, n := range []string{"n1", "n2", "n3"} {
		w.node(n, gossip.StateAlive)
	}
	w.hold(cp{dep: "big", shard: 0, pp: 3, spec: "old000000000", node: "n1", url: "http://n1:8100", drain: true})
	w.hold(cp{dep: "big", shard: 1, pp: 3, spec: "old000000000", node: "n2", url: "http://n2:8100", drain: true})
	w.hold(cp{dep: "big", shard: 2, pp: 3, spec: "old000000000", node: "n3", url: "http://n3:8100", lease: placement.LeaseLapsed, planned: ptr(false)})
	if rs := BuildTable(w.snapshot(), t0).Routes("big"); len(rs) != 0 {
		t.Fatalf("old gang missing a shard: routes %v", routeIDs(rs))
	}
}

// A model id resolves when exactly one deployment serves it; a deployment
// name always wins.
func TestTableResolve(t *testing.T) {
	w := newWorld()
	w.deploy(placement.Deployment{Name: "a", Model: "org/shared"})
	w.deploy(placement.Deployment{Name: "b", Model: "org/shared"})
	w.deploy(placement.Deployment{Name: "c", Model: "org/only"})
	tb := BuildTable(w.snapshot(), t0)
	if e, byID, err := tb.resolve("c"); err != nil || e.Name != "c" || byID {
		t.Fatalf("by name: %v %v %v", e, byID, err)
	}
	if e, byID, err := tb.resolve("org/only"); err != nil || e.Name != "c" || !byID {
		t.Fatalf("by unique id: %v %v %v", e, byID, err)
	}
	if _, _, err := tb.resolve("org/shared"); err == nil || err.status != 400 || !strings.Contains(err.message, "(a, b)") {
		t.Fatalf("ambiguous id: %v", err)
	}
	if _, _, err := tb.resolve("nope"); err == nil || err.status != 404 || !strings.Contains(err.message, "a, b, c") {
		t.Fatalf("unknown: %v", err)
	}
	if BuildTable(nil, t0).Names() != nil {
		t.Fatal("an empty table has names")
	}
}

// A gateway weighs the others' unseen load by the rates they publish: all
// alike gives one per other gateway, a lone door zero, and a gateway whose
// record says nothing (an older agent) counts as sending as much as this
// one. Dead nodes and nodes without a gateway do not count.
func TestOthersWeighsTheGatewaysByTheirRates(t *testing.T) {
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat"})
	for _, n := range []string{"n1", "n2", "n3"} {
		w.node(n, gossip.StateAlive)
		w.members[n].Record.Gateway = n + ":8000"
		w.members[n].Record.GatewayRates = map[string]float64{}
	}
	w.node("n4", gossip.StateDead)
	w.members["n4"].Record.Gateway, w.members["n4"].Record.GatewayRates = "n4:8000", map[string]float64{"chat": 500}
	w.node("n5", gossip.StateAlive) // no gateway
	rates := func(r1, r2, r3 float64) {
		w.members["n1"].Record.GatewayRates["chat"] = r1
		w.members["n2"].Record.GatewayRates["chat"] = r2
		w.members["n3"].Record.GatewayRates["chat"] = r3
	}
	cases := []struct {
		why        string
		r1, r2, r3 float64
		own        float64 // n1's own rate, fresher than its record
		want       float64
	}{
		{"all alike", 20, 20, 20, 20, 2},
		{"n1 the only door", 30, 0, 0, 30, 0},
		{"n1 a quarter of the traffic", 10, 15, 15, 10, 3},
		{"n1 idle: one request per window", 0, 5, 5, 0, 100},
	}
	for _, c := range cases {
		rates(c.r1, c.r2, c.r3)
		tab := BuildTable(w.snapshotOf("n1", t0), t0)
		if got := tab.Others("chat", c.own); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: others %v, want %v", c.why, got, c.want)
		}
		if got := tab.Others("other", c.own); got != 0 {
			t.Errorf("%s: a deployment nobody sends to: others %v, want 0", c.why, got)
		}
	}
	w.members["n3"].Record.GatewayRates = nil // an agent that does not publish rates
	two := func(r1, r2 float64) {
		w.members["n1"].Record.GatewayRates["chat"] = r1
		w.members["n2"].Record.GatewayRates["chat"] = r2
	}
	two(20, 20)
	if got := BuildTable(w.snapshotOf("n1", t0), t0).Others("chat", 20); got != 2 {
		t.Errorf("one silent gateway beside one alike: others %v, want 2", got)
	}
	// n2's view: n1 is the other, n2 itself not counted.
	two(30, 10)
	if got := BuildTable(w.snapshotOf("n2", t0), t0).Others("chat", 10); got != 4 {
		t.Errorf("n2 at 10 beside n1 at 30 and a silent n3: others %v, want 4", got)
	}
}
