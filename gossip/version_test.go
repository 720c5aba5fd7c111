package gossip

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/internal/testwait"
)

// The gate: a toy rule with two versions behind the cluster version, on
// real in-process clusters. memberlist runs on real time (membership is
// polled with deadlines); T and D elapse on a fake clock the nodes share,
// and each step judges the rule at a known instant (evaluateVersion, what
// the version loop runs) so that "not yet" is an observation, not a race.
// TestVersionLoopRaisesOnTheClusterClock shows the loop itself does it.

var (
	oldBuild = protocol.Range{Min: 1, Max: 1} // an agent from before cluster versions
	newBuild = protocol.Range{Min: 1, Max: 2} // this release
)

const (
	settleT = DefaultVersionSettle
	deadD   = DefaultVersionDeadAfter
)

// toyRule is a rule that a version bump changed: every node of a cluster
// must pick the same one, or they compute different things.
func toyRule(v int) string {
	if v >= protocol.V2 {
		return "round half to even"
	}
	return "round half up"
}

// rises records the versions a node reported rising to (OnActiveVersion).
type rises struct {
	mu sync.Mutex
	vs []int
}

func (r *rises) add(v int) { r.mu.Lock(); r.vs = append(r.vs, v); r.mu.Unlock() }
func (r *rises) get() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.vs...)
}

func startVersioned(t *testing.T, name string, port int, clk *clock.Fake, r protocol.Range, mutate func(*Config)) *testNode {
	t.Helper()
	return startNode(t, name, port, "", func(c *Config) {
		c.Clock, c.Protocol, c.VersionSettle, c.VersionDeadAfter = clk, r, settleT, deadD
		if mutate != nil {
			mutate(c)
		}
	})
}

// judge runs the rule on every node now and checks that all run version
// want, and so the same toy rule.
func judge(t *testing.T, when string, want int, nodes ...*testNode) {
	t.Helper()
	for _, n := range nodes {
		n.evaluateVersion()
	}
	for _, n := range nodes {
		if got := n.ActiveVersion(); got != want || toyRule(got) != toyRule(want) {
			t.Fatalf("%s: %s runs version %d (%s), want %d (%s)", when, n.cfg.Name, got, toyRule(got), want, toyRule(want))
		}
	}
}

// waitProtocol waits until n sees member name in state s announcing r.
func waitProtocol(t *testing.T, n *testNode, name string, s MemberState, r protocol.Range) Member {
	t.Helper()
	var found Member
	testwait.Until(t, 10*time.Second, fmt.Sprintf("%s sees %s %s with protocol %v", n.cfg.Name, name, s, r), func() (bool, string) {
		for _, m := range n.Members() {
			if m.Name == name {
				found = m
				return m.State == s && m.Protocol == r, fmt.Sprintf("%s %v", m.State, m.Protocol)
			}
		}
		return false, "not listed"
	})
	return found
}

// startMixed starts a and b of this release (mutateA configures a) and
// old of the old build, joined, with a and b seeing old's range.
func startMixed(t *testing.T, clk *clock.Fake, mutateA func(*Config)) (a, b, old *testNode) {
	t.Helper()
	a = startVersioned(t, "a", 0, clk, newBuild, mutateA)
	b = startVersioned(t, "b", 0, clk, newBuild, nil)
	old = startVersioned(t, "old", 0, clk, oldBuild, nil)
	mustJoin(t, b, a)
	mustJoin(t, old, a)
	waitMembers(t, 3, a, b, old)
	waitProtocol(t, a, "old", StateAlive, oldBuild)
	waitProtocol(t, b, "old", StateAlive, oldBuild)
	return a, b, old
}

// A mixed cluster runs the old rule; the new one becomes active T after the
// last old node came back upgraded, and every node agrees.
func TestMixedClusterRunsTheOldRuleUntilTheLastOldNodeUpgrades(t *testing.T) {
	clk := clock.NewFake(time.Now())
	var aRises rises
	a, b, old := startMixed(t, clk, func(c *Config) { c.OnActiveVersion = aRises.add })
	waitProtocol(t, old, "a", StateAlive, newBuild)

	clk.Advance(10 * settleT)
	judge(t, "mixed, long after T", protocol.V1, a, b, old)
	if since := a.VersionsMixedSince(); since.IsZero() {
		t.Error("a does not say versions are mixed")
	}
	if st := a.Stats(); st.ActiveVersion != 1 || st.Protocol != newBuild || st.VersionsMixedSince.IsZero() {
		t.Errorf("a's stats: active %d, protocol %v, mixed since %v", st.ActiveVersion, st.Protocol, st.VersionsMixedSince)
	}

	// The old node is replaced by this release, at the same address.
	port := old.port
	if err := old.Shutdown(); err != nil {
		t.Fatal(err)
	}
	upgraded := startVersioned(t, "old", port, clk, newBuild, nil)
	mustJoin(t, upgraded, a)
	waitProtocol(t, a, "old", StateAlive, newBuild)
	waitProtocol(t, b, "old", StateAlive, newBuild)
	waitMembers(t, 3, upgraded)
	judge(t, "just upgraded", protocol.V1, a, b, upgraded)
	clk.Advance(settleT - time.Second)
	judge(t, "upgraded, a second short of T", protocol.V1, a, b, upgraded)
	clk.Advance(time.Second)
	judge(t, "upgraded T ago", protocol.V2, a, b, upgraded)
	if since := a.VersionsMixedSince(); !since.IsZero() {
		t.Errorf("a says versions are mixed since %v, but every member speaks 2", since)
	}
	if got := aRises.get(); len(got) != 1 || got[0] != 2 {
		t.Errorf("a reported rises %v, want [2] once", got)
	}
	if n := strings.Count(a.log.String(), "cluster protocol version raised"); n != 1 {
		t.Errorf("a logged the rise %d times, want once", n)
	}
}

// A dead old node still counts for D (it is most likely coming back with
// the binary it had); then, T later, the new rule is active. It never goes
// back down: the old node returning is refused.
func TestDeadOldNodeCountsForDThenTheVersionRisesAndNeverFalls(t *testing.T) {
	clk := clock.NewFake(time.Now())
	a, b, old := startMixed(t, clk, nil)
	port := old.port

	if err := old.Shutdown(); err != nil { // a crash: no leave
		t.Fatal(err)
	}
	for _, n := range []*testNode{a, b} {
		testwait.Until(t, a.cfg.Profile.DetectionBound(3), n.cfg.Name+" sees old dead", func() (bool, string) {
			s := memberState(n.Cluster, "old")
			return s == StateDead, string(s)
		})
	}
	clk.Advance(deadD - time.Second)
	judge(t, "old dead for a second less than D", protocol.V1, a, b)
	clk.Advance(settleT)
	judge(t, "old dead for D, and a second less than T after", protocol.V1, a, b)
	clk.Advance(time.Second)
	judge(t, "old dead for D+T", protocol.V2, a, b)

	// The old build comes back: it cannot speak 2, so it is refused, and
	// the version stays.
	back := startVersioned(t, "old", port, clk, oldBuild, nil)
	mustJoin(t, back, a)
	m := waitProtocol(t, a, "old", StateRefused, oldBuild)
	if m.Address == "" {
		t.Error("the refused node is listed without its address")
	}
	testwait.Until(t, 10*time.Second, "memberlist ignores old's alive messages more than once", func() (bool, string) {
		n := strings.Count(a.log.String(), "ignoring alive message for 'old'")
		return n >= 2, fmt.Sprint(n)
	})
	judge(t, "old back with its old build", protocol.V2, a, b)
	if n := strings.Count(a.log.String(), "refused a peer that cannot speak"); n != 1 {
		t.Errorf("a logged the refusal %d times, want once per boot of the peer", n)
	}
	if reason, err := a.checkPeerProtocol("old"); reason != DropProtocolRefused || !errors.Is(err, ErrInvalidRecord) {
		t.Errorf("old's records: reason %q, err %v; want them refused as %s", reason, err, DropProtocolRefused)
	}
	if reason, err := a.checkPeerProtocol("b"); err != nil {
		t.Errorf("b's records refused (%s): %v", reason, err)
	}
	for _, mm := range a.ml.Members() {
		if mm.Name == "old" {
			t.Errorf("memberlist holds the refused node as %v", mm.State)
		}
	}
}

// A node that left is not counted: its leaving ends its say at once.
func TestLeftOldNodeIsNotCounted(t *testing.T) {
	clk := clock.NewFake(time.Now())
	a := startVersioned(t, "a", 0, clk, newBuild, nil)
	old := startVersioned(t, "old", 0, clk, oldBuild, nil)
	mustJoin(t, old, a)
	waitMembers(t, 2, a, old)
	waitProtocol(t, a, "old", StateAlive, oldBuild)
	clk.Advance(settleT)
	judge(t, "with old", protocol.V1, a)
	if err := old.Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 5*time.Second, "a sees old left", func() (bool, string) {
		s := memberState(a.Cluster, "old")
		return s == StateLeft, string(s)
	})
	clk.Advance(settleT - time.Second)
	judge(t, "old left a second less than T ago", protocol.V1, a)
	clk.Advance(time.Second)
	judge(t, "old left T ago (well within D)", protocol.V2, a)
}

// A node restarted with version 2 persisted starts at 2, and an old build
// joining it is refused: kept out of membership, shown with its range.
func TestPersistedVersionStartsActiveAndRefusesAnOldJoiner(t *testing.T) {
	clk := clock.NewFake(time.Now())
	a := startVersioned(t, "a", 0, clk, newBuild, func(c *Config) { c.ActiveVersion = 2 })
	if got := a.ActiveVersion(); got != 2 {
		t.Fatalf("a starts at version %d, want the persisted 2", got)
	}
	old := startVersioned(t, "old", 0, clk, oldBuild, nil)
	mustJoin(t, old, a)
	waitProtocol(t, a, "old", StateRefused, oldBuild)
	judge(t, "old refused", protocol.V2, a)
	if a.NumMembers() != 1 {
		t.Errorf("a counts %d members, want only itself", a.NumMembers())
	}
	// The same node upgraded in place is admitted.
	port := old.port
	_ = old.Shutdown()
	up := startVersioned(t, "old", port, clk, newBuild, nil)
	mustJoin(t, up, a)
	waitProtocol(t, a, "old", StateAlive, newBuild)
	if reason, err := a.checkPeerProtocol("old"); err != nil {
		t.Errorf("the upgraded node's records are refused (%s): %v", reason, err)
	}
}

// The version loop judges the rule on the cluster's clock: moving a fake
// clock past T raises it with no other call.
func TestVersionLoopRaisesOnTheClusterClock(t *testing.T) {
	clk := clock.NewFake(time.Now())
	var r rises
	a := startVersioned(t, "a", 0, clk, newBuild, func(c *Config) { c.OnActiveVersion = r.add })
	if got := a.ActiveVersion(); got != 1 {
		t.Fatalf("a starts at %d, want 1: it has not seen the cluster for T yet", got)
	}
	testwait.Until(t, 10*time.Second, "a rises to 2 once T passed on its clock", func() (bool, string) {
		clk.Advance(time.Second)
		return a.ActiveVersion() == 2, fmt.Sprint(a.ActiveVersion())
	})
	testwait.Until(t, 5*time.Second, "the rise reported", func() (bool, string) {
		got := r.get()
		return len(got) == 1 && got[0] == 2, fmt.Sprint(got)
	})
}

// A node told of peers does not raise its version before it has heard one:
// restarted into a partition, it knows nothing of what they speak.
func TestNodeThatExpectsPeersWaitsToHearOne(t *testing.T) {
	clk := clock.NewFake(time.Now())
	a := startVersioned(t, "a", 0, clk, newBuild, nil)
	a.ExpectPeers()
	clk.Advance(10 * settleT)
	judge(t, "nobody heard", protocol.V1, a)
	b := startVersioned(t, "b", 0, clk, newBuild, nil)
	mustJoin(t, a, b)
	testwait.Until(t, 5*time.Second, "a hears b", func() (bool, string) { return !a.LastHeard().IsZero(), "" })
	judge(t, "just heard b", protocol.V1, a)
	clk.Advance(settleT)
	judge(t, "heard b T ago", protocol.V2, a, b)
}

func TestVersionConfigIsChecked(t *testing.T) {
	prof, _ := ProfileByName("local")
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Protocol: protocol.Range{Min: 2, Max: 1}}, "Config.Protocol 2-1"},
		{Config{ActiveVersion: protocol.Max + 1}, fmt.Sprintf("Config.ActiveVersion %d is beyond", protocol.Max+1)},
	} {
		tc.cfg.Name, tc.cfg.BindAddr, tc.cfg.Profile = "a", "127.0.0.1", prof
		c, err := New(tc.cfg, NodeRecord{})
		if err == nil {
			_ = c.Shutdown()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v): %v, want an error containing %q", tc.cfg.Protocol, err, tc.want)
		}
	}
}

// The range rides in node meta, also when the rest must be cut; an agent
// from before cluster versions announces none and reads as [1, 1].
func TestNodeMetaAnnouncesTheRange(t *testing.T) {
	a := startVersioned(t, "a", 0, clock.NewFake(time.Now()), protocol.Range{Min: 1, Max: 7}, nil)
	d := &delegate{c: a.Cluster}
	for _, limit := range []int{memberlist.MetaMaxSize, 40} {
		var m nodeMeta
		b := d.NodeMeta(limit)
		if err := json.Unmarshal(b, &m); err != nil || len(b) > limit {
			t.Fatalf("meta at limit %d: %d bytes %s (%v)", limit, len(b), b, err)
		}
		if m.V != 1 || metaRange(m) != (protocol.Range{Min: 1, Max: 7}) {
			t.Errorf("meta at limit %d: v %d, range %v", limit, m.V, metaRange(m))
		}
	}
	var older nodeMeta
	_ = json.Unmarshal([]byte(`{"v":1,"api":"10.0.0.1:7070","epoch":1}`), &older)
	if r := metaRange(older); r != oldBuild {
		t.Errorf("an older agent's meta reads as %v, want [1,1]", r)
	}
}

// A node that joins a cluster already running a version it speaks adopts
// it at once, from the meta of a member (no T to wait), and a version that
// rose after start is announced in the meta the next joiner reads. A node
// that cannot speak it adopts nothing and is refused.
func TestAJoinerAdoptsTheClusterVersionAtOnce(t *testing.T) {
	clk := clock.NewFake(time.Now())
	a := startVersioned(t, "a", 0, clk, newBuild, nil)
	testwait.Until(t, 10*time.Second, "a, alone, rises to 2 on its clock", func() (bool, string) {
		clk.Advance(time.Second)
		return a.ActiveVersion() == protocol.V2, fmt.Sprint(a.ActiveVersion())
	})
	b := startVersioned(t, "b", 0, clk, newBuild, nil)
	if got := b.ActiveVersion(); got != protocol.V1 {
		t.Fatalf("b starts at %d, want 1", got)
	}
	mustJoin(t, b, a)
	waitProtocol(t, b, "a", StateAlive, newBuild)
	// No clock moves from here on: only a's announcement can raise b.
	testwait.Until(t, 10*time.Second, "b adopts a's version", func() (bool, string) {
		b.evaluateVersion()
		return b.ActiveVersion() == protocol.V2, fmt.Sprint(b.ActiveVersion())
	})
	judge(t, "b joined", protocol.V2, a, b)

	old := startVersioned(t, "old", 0, clk, oldBuild, nil)
	mustJoin(t, old, a)
	waitProtocol(t, a, "old", StateRefused, oldBuild)
	old.evaluateVersion()
	if got := old.ActiveVersion(); got != protocol.V1 {
		t.Errorf("a [1,1] node adopted version %d", got)
	}
}

// BenchmarkEvaluateVersion500 measures the once-a-second pass of the rule
// (versionEvery) on a node of 500 live members that all speak its range.
func BenchmarkEvaluateVersion500(b *testing.B) {
	clk := clock.NewFake(time.Now())
	c := &Cluster{cfg: Config{Name: "self", Clock: clk, Protocol: protocol.Build(), VersionSettle: settleT, VersionDeadAfter: deadD},
		members: map[string]*memberInfo{}}
	c.ver.init(c.cfg, clk.Now())
	for i := range 500 {
		c.members[fmt.Sprintf("n%03d", i)] = &memberInfo{state: StateAlive, proto: protocol.Build(), active: protocol.V1}
	}
	b.ReportAllocs()
	for b.Loop() {
		c.evaluateVersion()
	}
	if got := c.ActiveVersion(); got != protocol.V1 {
		b.Fatalf("the pass raised the version to %d with no time gone by", got)
	}
}
