package gossip

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
)

// rogue is a raw memberlist peer that speaks llmgw's wire format (this
// package's codec) but sends only what no correct node sends.
type rogue struct {
	ml    *memberlist.Memberlist
	state []byte // what it offers in push/pull
	meta  []byte
}

func (r *rogue) NodeMeta(int) []byte                        { return r.meta }
func (r *rogue) NotifyMsg([]byte)                           {}
func (r *rogue) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (r *rogue) LocalState(bool) []byte                     { return r.state }
func (r *rogue) MergeRemoteState([]byte, bool)              {}

func startRogue(t *testing.T, key []byte, state message, meta nodeMeta) *rogue {
	t.Helper()
	r := &rogue{}
	var err error
	if r.state, err = encode(state); err != nil {
		t.Fatal(err)
	}
	r.meta, _ = json.Marshal(meta)
	mc := localConfig()
	mc.Name, mc.BindAddr, mc.BindPort, mc.Label = fmt.Sprintf("rogue-%d", len(key)), "127.0.0.1", 0, "test"
	mc.SecretKey = key
	mc.Delegate = r
	mc.Logger = log.New(io.Discard, "", 0)
	if r.ml, err = memberlist.Create(mc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.ml.Shutdown() })
	return r
}

// replicated is a node's replicated state, as JSON to compare.
func replicated(n *testNode) string {
	var recs []NodeRecord
	for _, ns := range n.store.Nodes() {
		recs = append(recs, ns.Record)
	}
	b, _ := json.Marshal(struct {
		Nodes []NodeRecord
		Deps  []DeploymentRecord
	}{recs, n.store.Deployments()})
	return string(b)
}

// A peer without the gossip key cannot join. One with the key but bad
// content (a spec under another name, a stamp far ahead, a huge epoch, an
// invalid spec, an engine URL elsewhere) changes nothing on any node, by
// push/pull, by reliable send or by packet, and every refusal is counted.
func TestRoguePeerChangesNothing(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	withKey := func(c *Config) { c.Key = key }
	a := startNode(t, "a", 0, t.TempDir(), withKey)
	b := startNode(t, "b", 0, t.TempDir(), withKey)
	mustJoin(t, b, a)
	waitMembers(t, 2, a, b)
	if _, err := a.PutDeployment(placement.Deployment{Name: "chat", Model: "good/model", Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 5*time.Second, "b learns chat", func() (bool, string) {
		_, ok := b.Deployment("chat")
		return ok, ""
	})
	before := map[*testNode]string{a: replicated(a), b: replicated(b)}

	// Without the key: no join, and nobody new.
	outsider := startRogue(t, nil, message{}, nodeMeta{V: 1})
	if _, err := outsider.ml.Join([]string{a.Address()}); err == nil {
		t.Fatal("a peer without the gossip key joined")
	}
	if a.NumMembers() != 2 {
		t.Fatalf("a has %d members after the keyless join, want 2", a.NumMembers())
	}

	now := time.Now()
	spec := func(name, model, engine string) *placement.Deployment {
		return &placement.Deployment{Name: name, Model: model, Engine: engine, Replicas: 1}
	}
	soon := Stamp{Wall: now.Add(time.Second).UnixMilli(), Origin: "rogue"}
	far := Stamp{Wall: now.Add(365 * 24 * time.Hour).UnixMilli(), Origin: "rogue"}
	huge := Version{Epoch: 1 << 62, Seq: 1}
	bad := []struct {
		reason DropReason
		m      message
	}{
		{DropInvalidDeployment, message{Deployments: []DeploymentRecord{{Name: "chat", Spec: spec("evil", "evil/model", ""), Stamp: soon}}}},
		{DropStampAhead, message{Deployments: []DeploymentRecord{{Name: "chat", Spec: spec("chat", "evil/model", ""), Stamp: far}}}},
		{DropStampAhead, message{Deployments: []DeploymentRecord{{Name: "chat", Deleted: true, Stamp: far}}}},
		{DropInvalidDeployment, message{Deployments: []DeploymentRecord{{Name: "chat", Spec: spec("chat", "evil/model", "evil-engine"), Stamp: soon}}}},
		{DropEpochAhead, message{Nodes: []NodeRecord{{Name: "ghost", Version: huge, API: "127.0.0.1:9"}}}},
		{DropEpochAhead, message{Beats: []Beat{{Name: "ghost", Version: huge, Content: huge}}}},
		{DropInvalidNode, message{Nodes: []NodeRecord{{Name: "ghost", Version: Version{Epoch: now.UnixNano(), Seq: 1}, API: "127.0.0.1:9",
			Shards: []ShardRecord{{ShardID: "chat-0", ReplicaID: "chat-0", Deployment: "chat", Status: ShardReady, Ready: true, URL: "http://203.0.113.9:8000"}}}}}},
	}
	want := map[DropReason]uint64{}
	var all message
	for _, x := range bad {
		want[x.reason]++
		all.Nodes = append(all.Nodes, x.m.Nodes...)
		all.Deployments = append(all.Deployments, x.m.Deployments...)
		all.Beats = append(all.Beats, x.m.Beats...)
	}
	// Each node refuses the huge epoch of the rogue's own meta, and of
	// another node's record (the victim ignores its own record anyway).
	want[DropEpochAhead]++
	all.Nodes = append(all.Nodes, NodeRecord{Name: "b", Version: huge, API: "127.0.0.1:9"})

	base := map[*testNode]map[DropReason]uint64{a: a.Stats().Drops, b: b.Stats().Drops}
	insider := startRogue(t, key, all, nodeMeta{V: 1, Epoch: 1 << 62})
	if _, err := insider.ml.Join([]string{a.Address()}); err != nil {
		t.Fatalf("a peer with the key could not join (the test would show nothing): %v", err)
	}
	// Then each bad record on its own, reliably and by packet.
	for _, n := range insider.ml.Members() {
		if n.Name == insider.ml.LocalNode().Name {
			continue
		}
		for _, x := range bad {
			msg, err := encode(x.m)
			if err != nil {
				t.Fatal(err)
			}
			if err := insider.ml.SendReliable(n, msg); err != nil {
				t.Fatal(err)
			}
			_ = insider.ml.SendBestEffort(n, msg)
		}
	}
	for _, n := range []*testNode{a, b} {
		testwait.Until(t, 10*time.Second, n.cfg.Name+" counts every refusal", func() (bool, string) {
			// The reliable sends and the meta alone bring each refusal
			// once; the push/pull and the packets may add to it.
			got := n.Stats().Drops
			ok := true
			for r, w := range want {
				ok = ok && got[r]-base[n][r] >= w
			}
			return ok, fmt.Sprintf("%v (before %v)", got, base[n])
		})
		if got := replicated(n); got != before[n] {
			t.Errorf("%s's state changed:\nbefore %s\nafter  %s", n.cfg.Name, before[n], got)
		}
		if s := n.hlc.Now(); s.Wall >= now.Add(time.Hour).UnixMilli() {
			t.Errorf("%s's clock followed the rogue's stamp: %v", n.cfg.Name, s)
		}
		for _, m := range n.Members() {
			if m.Epoch > now.Add(time.Hour).UnixNano() {
				t.Errorf("%s took the rogue's meta epoch for %s", n.cfg.Name, m.Name)
			}
		}
		if d, _ := n.Deployment("chat"); d.Spec == nil || d.Spec.Model != "good/model" {
			t.Errorf("%s's chat is now %+v", n.cfg.Name, d)
		}
	}
}
