package gossip

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/testlog"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
)

type testNode struct {
	*Cluster
	port int
	dir  string
	log  *testlog.Buffer
}

func gpus(n int, name string) []placement.GPU {
	out := make([]placement.GPU, n)
	for i := range out {
		// Hashed UUIDs compress like real ones (barely).
		sum := sha256.Sum256([]byte(fmt.Sprintf("%s-%d", name, i)))
		out[i] = placement.GPU{Index: i, UUID: fmt.Sprintf("GPU-%x", sum[:16]), Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 80 << 30}
	}
	return out
}

// startNode starts a node on loopback. port 0 picks a free port; the test
// reuses the chosen one to restart a node at the same address.
func startNode(t testing.TB, name string, port int, dir string, mutate func(*Config)) *testNode {
	t.Helper()
	prof, _ := ProfileByName("local")
	lb := &testlog.Buffer{}
	cfg := Config{
		Name: name, BindAddr: "127.0.0.1", BindPort: port, Profile: prof,
		Logger: slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Label:  "test",
	}
	if dir != "" {
		// No dir, no file: joined to "" the name would be a file in the
		// package directory that every test shares.
		cfg.DeploymentsFile = filepath.Join(dir, deploymentsFile)
	}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := New(cfg, NodeRecord{Version: Version{Epoch: time.Now().UnixNano()}, GPUs: gpus(2, name), API: "127.0.0.1:1"})
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	tn := &testNode{Cluster: c, port: int(c.ml.LocalNode().Port), dir: dir, log: lb}
	t.Cleanup(func() { _ = c.Shutdown() })
	return tn
}

// deploymentsFile is what the data dir calls the file (supervisor/datadir).
const deploymentsFile = "deployments.json"

func memberState(c *Cluster, name string) MemberState {
	for _, m := range c.Members() {
		if m.Name == name {
			return m.State
		}
	}
	return ""
}

func TestThreeNodesConvergeWithGPUs(t *testing.T) {
	a := startNode(t, "a", 0, "", nil)
	b := startNode(t, "b", 0, "", nil)
	c := startNode(t, "c", 0, "", nil)
	// c joins b before b knows anyone; b joins a last: any order converges.
	if _, err := c.Join([]string{b.Address()}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Join([]string{a.Address()}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*testNode{a, b, c} {
		testwait.Until(t, 10*time.Second, n.cfg.Name+" sees everyone", func() (bool, string) {
			ms := n.Members()
			var desc []string
			ok := len(ms) == 3
			for _, m := range ms {
				desc = append(desc, fmt.Sprintf("%s=%s", m.Name, m.State))
				if m.State != StateAlive || m.Record == nil || len(m.Record.GPUs) != 2 || m.Record.GPUs[0].UUID != gpus(1, m.Name)[0].UUID {
					ok = false
				}
			}
			return ok, strings.Join(desc, " ")
		})
	}
}

func TestLeaveShowsLeftEverywhere(t *testing.T) {
	a, b, c := threeNodes(t)
	if err := c.Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*testNode{a, b} {
		testwait.Until(t, 5*time.Second, n.cfg.Name+" sees c left", func() (bool, string) {
			s := memberState(n.Cluster, "c")
			return s == StateLeft, string(s)
		})
	}
}

func TestKilledNodeShowsDeadWithinProfileBound(t *testing.T) {
	a, b, c := threeNodes(t)
	bound := a.cfg.Profile.DetectionBound(3)
	killed := time.Now()
	_ = c.Shutdown() // no leave: a crash
	for _, n := range []*testNode{a, b} {
		testwait.Until(t, bound-time.Since(killed), n.cfg.Name+" sees c dead within "+bound.String(), func() (bool, string) {
			s := memberState(n.Cluster, "c")
			return s == StateDead, string(s)
		})
	}
	t.Logf("dead everywhere after %v (bound %v)", time.Since(killed), bound)
}

func TestRestartedNodeRejoinsWithSameNameAndAddress(t *testing.T) {
	a := startNode(t, "a", 0, "", nil)
	b := startNode(t, "b", 0, "", nil)
	mustJoin(t, b, a)
	waitMembers(t, 2, a, b)
	oldEpoch := b.Local().Version.Epoch
	port := b.port
	_ = b.Shutdown()
	testwait.Until(t, a.cfg.Profile.DetectionBound(2), "a sees b dead", func() (bool, string) {
		s := memberState(a.Cluster, "b")
		return s == StateDead, string(s)
	})
	b2 := startNode(t, "b", port, "", nil)
	mustJoin(t, b2, a)
	testwait.Until(t, 10*time.Second, "a sees b alive with its new record", func() (bool, string) {
		for _, m := range a.Members() {
			if m.Name == "b" {
				ok := m.State == StateAlive && m.Record != nil && m.Record.Version.Epoch > oldEpoch
				return ok, fmt.Sprintf("%s epoch newer=%v", m.State, m.Record != nil && m.Record.Version.Epoch > oldEpoch)
			}
		}
		return false, "b missing"
	})
}

func TestWrongGossipKeyCannotJoinAndTheClusterSaysWhy(t *testing.T) {
	key := bytes.Repeat([]byte{1}, 32)
	other := bytes.Repeat([]byte{2}, 32)
	a := startNode(t, "a", 0, "", func(c *Config) { c.Key = key })
	intruder := startNode(t, "x", 0, "", func(c *Config) { c.Key = other })
	if _, err := intruder.Join([]string{a.Address()}); err == nil {
		t.Fatal("join with the wrong key succeeded")
	}
	testwait.Until(t, 5*time.Second, "a logs why", func() (bool, string) {
		l := a.log.String()
		return strings.Contains(l, "decrypt") && strings.Contains(l, "gossip-key-file"), l
	})
	if a.NumMembers() != 1 {
		t.Fatalf("a has %d members, want only itself", a.NumMembers())
	}
}

func TestBadKeyLengthIsRejected(t *testing.T) {
	prof, _ := ProfileByName("local")
	_, err := New(Config{Name: "a", BindAddr: "127.0.0.1", Profile: prof, Key: []byte("short")}, NodeRecord{})
	if err == nil || !strings.Contains(err.Error(), "16, 24 or 32") {
		t.Fatalf("got %v, want a key length error", err)
	}
}

func TestLargeRecordTravelsReliably(t *testing.T) {
	a := startNode(t, "a", 0, "", nil)
	b := startNode(t, "b", 0, "", nil)
	mustJoin(t, b, a)
	waitMembers(t, 2, a, b)
	r := a.UpdateLocal(func(r *NodeRecord) { r.GPUs = gpus(64, "a") })
	if msg, _ := encode(message{Nodes: []NodeRecord{r}}); len(msg) <= a.bigThreshold {
		t.Fatalf("test record is %d bytes, not above the %d threshold", len(msg), a.bigThreshold)
	}
	testwait.Until(t, 3*time.Second, "b has a's 64 GPUs", func() (bool, string) {
		ns, ok := b.store.Node("a")
		return ok && len(ns.Record.GPUs) == 64, fmt.Sprint(len(ns.Record.GPUs))
	})
}

func TestBeatRenewsWithoutResendingContent(t *testing.T) {
	a := startNode(t, "a", 0, "", nil)
	b := startNode(t, "b", 0, "", nil)
	mustJoin(t, b, a)
	waitMembers(t, 2, a, b)
	before, _ := b.store.Node("a")
	a.Renew()
	want := a.Local().Version
	testwait.Until(t, 3*time.Second, "b takes a's renewal", func() (bool, string) {
		ns, _ := b.store.Node("a")
		return ns.Record.Version == want && ns.SeenAt.After(before.SeenAt), fmt.Sprint(ns.Record.Version)
	})
}

func TestDeploymentsReplicateDeleteAndPersist(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	a := startNode(t, "a", 0, dirA, nil)
	b := startNode(t, "b", 0, dirB, nil)
	mustJoin(t, b, a)
	waitMembers(t, 2, a, b)
	spec := placement.Deployment{Name: "llama", Model: "m", Replicas: 2}.WithDefaults()
	if _, err := a.PutDeployment(spec); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 3*time.Second, "b learns llama", func() (bool, string) {
		d, ok := b.store.Deployment("llama")
		return ok && !d.Deleted && d.Spec.Replicas == 2, fmt.Sprint(d)
	})
	if _, ok, err := b.DeleteDeployment("llama"); !ok || err != nil {
		t.Fatalf("delete: %v %v", ok, err)
	}
	testwait.Until(t, 3*time.Second, "a learns the deletion", func() (bool, string) {
		d, _ := a.store.Deployment("llama")
		return d.Deleted, fmt.Sprint(d)
	})
	if _, ok, _ := b.DeleteDeployment("nope"); ok {
		t.Fatal("deleting an unknown deployment reported success")
	}
	// Both stop; a restarted node remembers the tombstone, so an old copy
	// of the deployment cannot bring it back.
	_ = a.Shutdown()
	_ = b.Shutdown()
	a2 := startNode(t, "a", 0, dirA, nil)
	d, ok := a2.store.Deployment("llama")
	if !ok || !d.Deleted {
		t.Fatalf("after restart a holds %+v, want the tombstone", d)
	}
	stale := DeploymentRecord{Name: "llama", Spec: &spec, Stamp: Stamp{Wall: d.Stamp.Wall - 1, Origin: "z"}}
	if a2.store.MergeDeployment(stale) {
		t.Fatal("an older copy resurrected a deleted deployment")
	}
}

// Every acknowledged place is on disk when PutDeployment returns, even
// when two are accepted at the same time (two saves racing could land the
// older snapshot last).
func TestConcurrentPlacesAreAllPersisted(t *testing.T) {
	dir := t.TempDir()
	a := startNode(t, "a", 0, dir, nil)
	for i := range 100 {
		names := []string{fmt.Sprintf("x%d", i), fmt.Sprintf("y%d", i)}
		var wg sync.WaitGroup
		for _, n := range names {
			wg.Go(func() {
				if _, err := a.PutDeployment(placement.Deployment{Name: n, Model: "m", Replicas: 1}.WithDefaults()); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		b, err := os.ReadFile(filepath.Join(dir, deploymentsFile))
		if err != nil {
			t.Fatal(err)
		}
		var d struct{ Deployments []DeploymentRecord }
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if !slices.ContainsFunc(d.Deployments, func(r DeploymentRecord) bool { return r.Name == n }) {
				t.Fatalf("round %d: %s was acknowledged but is not in %s", i, n, deploymentsFile)
			}
		}
	}
}

// A place that cannot be saved is refused and changes nothing: not this
// node's state, so it cannot spread either.
func TestUnsavedPlaceChangesNothing(t *testing.T) {
	dir := t.TempDir()
	a := startNode(t, "a", 0, dir, nil)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	_, err := a.PutDeployment(placement.Deployment{Name: "lost", Model: "m", Replicas: 1}.WithDefaults())
	if err == nil {
		t.Fatal("a place into a data dir that is gone was acknowledged")
	}
	if d, ok := a.store.Deployment("lost"); ok {
		t.Fatalf("the refused place is in the store: %+v", d)
	}
}

func mustJoin(t testing.TB, n, to *testNode) {
	t.Helper()
	if _, err := n.Join([]string{to.Address()}); err != nil {
		t.Fatal(err)
	}
}

func waitMembers(t testing.TB, want int, nodes ...*testNode) {
	t.Helper()
	for _, n := range nodes {
		testwait.Until(t, 10*time.Second, fmt.Sprintf("%s sees %d members with records", n.cfg.Name, want), func() (bool, string) {
			ms := n.Members()
			alive := 0
			for _, m := range ms {
				if m.State == StateAlive && m.Record != nil {
					alive++
				}
			}
			return alive == want, fmt.Sprint(alive)
		})
	}
}

// A node that missed a record change learns it from the next beat, by
// asking the owner, without waiting for push/pull.
func TestMissedRecordIsRepairedOnTheNextBeat(t *testing.T) {
	// No periodic push/pull: only the beat can repair the miss.
	a, b := twoWithoutPushPull(t, nil)
	// Change a's record without telling anyone: as if every packet of the
	// broadcast was lost.
	a.mu.Lock()
	a.local.Labels = map[string]string{"zone": "z9"}
	a.local.Version.Seq++
	a.content = a.local.Version
	a.local.Content = a.content
	r := a.local
	a.mu.Unlock()
	a.store.MergeNode(r)
	a.Renew()
	testwait.Until(t, 2*time.Second, "b has a's new labels well before push/pull", func() (bool, string) {
		ns, _ := b.store.Node("a")
		return ns.Record.Labels["zone"] == "z9", fmt.Sprint(ns.Record.Labels)
	})
}

// A renewal goes from its origin to every member as a packet of its own,
// and its receivers do not pass it on: gossip would deliver every beat
// RetransmitMult·⌈log10(N+1)⌉ times to every node. A beat that came as
// gossip (from an older release) is still passed on.
func TestBeatGoesToEveryMemberAndIsNotRelayed(t *testing.T) {
	a, b, c := threeNodes(t)
	before := a.traffic.outDirect.Load()
	a.Renew()
	want := a.Local().Version
	for _, n := range []*testNode{b, c} {
		testwait.Until(t, 3*time.Second, n.cfg.Name+" takes a's renewal", func() (bool, string) {
			ns, _ := n.store.Node("a")
			return ns.Record.Version == want, fmt.Sprint(ns.Record.Version)
		})
	}
	msg, err := encode(message{Beats: []Beat{{Name: "a", Version: want, Content: a.content}}, From: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if sent := a.traffic.outDirect.Load() - before; sent < uint64(2*len(msg)) {
		t.Errorf("a sent %d bytes directly for its renewal, want at least a %d-byte packet to each of 2 members", sent, len(msg))
	}

	// The receiving side, on one node: a direct beat is taken and not
	// queued for gossip; the same beat as gossip is.
	rec := NodeRecord{Name: "peer", Version: Version{Epoch: time.Now().UnixNano(), Seq: 1}, API: "127.0.0.1:2"}
	beat := func(seq uint64) Beat {
		return Beat{Name: "peer", Version: Version{Epoch: rec.Version.Epoch, Seq: seq}, Content: rec.Version}
	}
	if !c.store.MergeNode(rec) {
		t.Fatal("c did not take peer's record")
	}
	deliver := func(m message) {
		bs, err := encode(m)
		if err != nil {
			t.Fatal(err)
		}
		c.receive(bs, true)
	}
	queued := c.queue.NumQueued()
	deliver(message{Beats: []Beat{beat(2)}, From: "peer"})
	if ns, _ := c.store.Node("peer"); ns.Record.Version.Seq != 2 {
		t.Fatalf("c did not take peer's direct beat: at seq %d", ns.Record.Version.Seq)
	}
	if got := c.queue.NumQueued(); got != queued {
		t.Errorf("c queued %d broadcasts after a direct beat, want %d: it relayed it", got, queued)
	}
	deliver(message{Beats: []Beat{beat(3)}})
	if got := c.queue.NumQueued(); got != queued+1 {
		t.Errorf("c queued %d broadcasts after a gossiped beat, want %d: it did not relay it", got, queued+1)
	}
}

// A lost beat is asked for: a member whose record was last renewed more
// than BeatQuiet ago is asked for its newest beat, and its answer renews
// the record here. A
// member that stopped renewing answers with the version it had, which
// renews nothing.
func TestLostBeatIsAskedFor(t *testing.T) {
	// No push/pull: only the request can repair the loss. BeatQuiet long
	// enough that the second request (wantRetry after the first) comes
	// before the record is 2×BeatQuiet old.
	a, b := twoWithoutPushPull(t, func(c *Config) { c.BeatQuiet = 1500 * time.Millisecond })
	testwait.Until(t, 3*time.Second, "b has a's record", func() (bool, string) {
		_, ok := b.store.Node("a")
		return ok, ""
	})
	// a renews, and every packet of the renewal is lost.
	a.sendMu.Lock()
	a.mu.Lock()
	a.local.Version.Seq++
	lost := Beat{Name: "a", Version: a.local.Version, Content: a.content}
	a.mu.Unlock()
	a.store.MergeBeat(lost)
	a.sendMu.Unlock()
	testwait.Until(t, 3*time.Second, "b renews a's record by asking", func() (bool, string) {
		ns, _ := b.store.Node("a")
		return ns.Record.Version == lost.Version, fmt.Sprint(ns.Record.Version)
	})
	// a renews no more: b asks again (wantRetry after the first request),
	// and a's answer, once b has it, renewed nothing.
	// The answer is a beat byte for byte the first one, so b drops it
	// unread as a copy (dedup.go) or, past the copies it remembers, reads
	// it.
	renewed, _ := b.store.Node("a")
	got := func() uint64 { return b.traffic.beats.Load() + b.traffic.duplicates.Load() }
	before := got()
	testwait.Until(t, 6*time.Second, "b has a's answer to a second request", func() (bool, string) {
		return got() > before, fmt.Sprint(got())
	})
	if ns, _ := b.store.Node("a"); !ns.SeenAt.Equal(renewed.SeenAt) {
		t.Errorf("a's answer renewed its record at b (seen %v, was %v) though a did not renew", ns.SeenAt, renewed.SeenAt)
	}
}

// threeNodes starts a, b and c, joined through a, and waits until each
// sees the three with their records.
func threeNodes(t *testing.T) (a, b, c *testNode) {
	t.Helper()
	a = startNode(t, "a", 0, "", nil)
	b = startNode(t, "b", 0, "", nil)
	c = startNode(t, "c", 0, "", nil)
	mustJoin(t, b, a)
	mustJoin(t, c, a)
	waitMembers(t, 3, a, b, c)
	return a, b, c
}

// twoWithoutPushPull starts two joined nodes, a and b, whose memberlist
// never runs a periodic push/pull (what the test repairs must be repaired
// otherwise), with mutate applied to both configs.
func twoWithoutPushPull(t *testing.T, mutate func(*Config)) (a, b *testNode) {
	t.Helper()
	cfg := func(c *Config) {
		c.Profile = Profile{Name: "test", base: func() *memberlist.Config {
			mc := localConfig()
			mc.PushPullInterval = time.Hour
			return mc
		}}
		if mutate != nil {
			mutate(c)
		}
	}
	a = startNode(t, "a", 0, "", cfg)
	b = startNode(t, "b", 0, "", cfg)
	mustJoin(t, b, a)
	waitMembers(t, 2, a, b)
	return a, b
}

// memberlist starts listening before Create returns; a message arriving in
// that window (a peer gossiping to an agent restarted at the same address)
// must not reach a cluster whose memberlist and queue do not exist yet.
func TestMessagesBeforeReadyAreIgnored(t *testing.T) {
	c := &Cluster{} // as it is while memberlist.Create runs: nothing set
	d := &delegate{c: c}
	b, err := encode(message{Nodes: []NodeRecord{{Name: "peer", Version: Version{Epoch: 1, Seq: 2}}}})
	if err != nil {
		t.Fatal(err)
	}
	d.NotifyMsg(b)
	d.MergeRemoteState(b, true)
	if got := d.GetBroadcasts(0, 1400); got != nil {
		t.Fatalf("broadcasts before ready: %d", len(got))
	}
}

// A beat renewing a record heard lately changes no lease and wakes no
// pass (Config.BeatQuiet); one after a silence does. Before BeatQuiet,
// every accepted beat woke every node's loop: O(N) passes a second per
// node in a large cluster.
func TestBeatWakesOnlyAfterASilence(t *testing.T) {
	clk := clock.NewFake(time.Now())
	a := startNode(t, "a", 0, "", func(c *Config) { c.Clock = clk; c.BeatQuiet = 5 * time.Second })
	rec := NodeRecord{Name: "peer", Version: Version{Epoch: clk.Now().UnixNano(), Seq: 1}, API: "127.0.0.1:2"}
	send := func(m message) {
		b, err := encode(m)
		if err != nil {
			t.Fatal(err)
		}
		a.receive(b, false)
	}
	drained := func() bool {
		select {
		case <-a.Changes():
			return true
		default:
			return false
		}
	}
	send(message{Nodes: []NodeRecord{rec}})
	if !drained() {
		t.Fatal("a new record did not signal Changes")
	}
	beat := func(seq uint64) Beat {
		return Beat{Name: "peer", Version: Version{Epoch: rec.Version.Epoch, Seq: seq}, Content: rec.Version}
	}
	clk.Advance(3 * time.Second)
	send(message{Beats: []Beat{beat(2)}})
	if drained() {
		t.Error("a beat 3 s after the last renewal (quiet 5 s) signalled Changes")
	}
	if ns, _ := a.store.Node("peer"); !ns.SeenAt.Equal(clk.Now()) {
		t.Errorf("the quiet beat did not renew the record: seen at %v, now %v", ns.SeenAt, clk.Now())
	}
	clk.Advance(6 * time.Second)
	send(message{Beats: []Beat{beat(3)}})
	if !drained() {
		t.Error("a beat 6 s after the last renewal (quiet 5 s) did not signal Changes")
	}
}
