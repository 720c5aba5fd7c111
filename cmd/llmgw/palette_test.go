package main

import (
	"bytes"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/lipgloss"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/overview"
	"github.com/llmgw/llmgw/supervisor/page"
	"github.com/llmgw/llmgw/supervisor/status"
)

// toneOf is the tone every view must give each state word: the one
// palette (status.StateTone), pinned.
var toneOf = map[string]string{
	"alive": "ok", "suspect": "warn", "unknown": "warn", "dead": "bad", "left": "idle", "refused": "bad", // members
	"ready": "ok", "starting": "warn", "pending": "warn", "stopping": "warn", "crashed": "bad", "backoff": "bad", "unplaced": "bad", // shards
	"valid": "ok", "lapsed": "bad", "none": "idle", // leases ("starting" as above)
}

// pageClass is the cluster page's CSS class of each tone.
var pageClass = map[string]string{"ok": "ok", "warn": "warn", "bad": "bad", "idle": "dim"}

// A state has one tone on the cluster page, in llmgw top and in the
// node's overview: each view draws the same words, and every word comes
// out in the same tone in all three.
func TestOneStatePalette(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	members := []gossip.MemberState{gossip.StateAlive, gossip.StateSuspect, gossip.StateUnknown, gossip.StateDead, gossip.StateLeft, gossip.StateRefused}
	// Each shard of "chat" on node n-alive, with its status and lease;
	// one more planned but not held (pending, lease none) and one that
	// found no room (unplaced).
	held := []struct {
		status gossip.ShardStatus
		lease  placement.LeaseState
	}{
		{gossip.ShardReady, placement.LeaseValid}, {gossip.ShardStarting, placement.LeaseStarting},
		{gossip.ShardCrashed, placement.LeaseLapsed}, {gossip.ShardBackoff, placement.LeaseLapsed}, {gossip.ShardStopping, placement.LeaseStarting},
	}

	// The read model, as a node builds it: what the page and, through the
	// API, llmgw top draw.
	spec := placement.Deployment{Name: "chat", Model: "m", Engine: "fake", Replicas: 1}.WithDefaults()
	sv := spec.SpecVersion()
	in := status.Input{Self: "n-alive", Now: now, TTL: time.Minute, Deployments: []gossip.DeploymentRecord{{Name: "chat", Spec: &spec}}}
	in.View.Deployments = []placement.Deployment{spec}
	self := placement.Node{Name: "n-alive", Alive: true}
	rec := &gossip.NodeRecord{Name: "n-alive"}
	for i, h := range held {
		id := fmt.Sprintf("chat-%d", i)
		rec.Shards = append(rec.Shards, gossip.ShardRecord{ShardID: id, ReplicaID: id, Deployment: "chat", SpecVersion: sv, Status: h.status})
		self.Shards = append(self.Shards, placement.HeldShard{ShardID: id, SpecVersion: sv, Lease: h.lease})
		in.Plan.Assignments = append(in.Plan.Assignments, placement.Assignment{ShardID: id, ReplicaID: id, Deployment: "chat", SpecVersion: sv, Node: "n-alive", GPUs: []int{i}})
	}
	in.Plan.Assignments = append(in.Plan.Assignments, placement.Assignment{ShardID: "chat-8", ReplicaID: "chat-8", Deployment: "chat", SpecVersion: sv, Node: "n-alive", GPUs: []int{8}})
	in.Plan.Unplaced = []placement.Unplaced{{ShardID: "chat-9", ReplicaID: "chat-9", Deployment: "chat", Reason: "no room"}}
	in.View.Nodes = []placement.Node{self}
	for _, s := range members {
		m := gossip.Member{Name: "n-" + string(s), State: s, SeenAt: now}
		if s == gossip.StateAlive {
			m.Record = rec
		}
		in.Members = append(in.Members, m)
	}
	snap := status.Build(in)

	// Every word that should be drawn, with the tone it must have.
	var words []string
	for _, s := range members {
		words = append(words, string(s))
	}
	for _, sh := range snap.Shards(now) {
		words = append(words, string(sh.Status), string(sh.Lease))
	}
	slices.Sort(words)
	words = slices.Compact(words)
	if len(words) != len(toneOf) {
		t.Fatalf("the snapshot draws %v, want every word of %v", words, toneOf)
	}

	// The page: a CSS class per tone.
	rr := httptest.NewRecorder()
	page.Handler(pageSource{snap, now}, page.Options{}).ServeHTTP(rr, httptest.NewRequest("GET", "/", nil))
	html := rr.Body.String()

	// The terminal views: a style per tone, each marking what it draws.
	mark := func(tone string) lipgloss.Style {
		return lipgloss.NewStyle().Transform(func(s string) string { return "<" + tone + ">" + s + "</" + tone + ">" })
	}
	st := overview.Plain()
	st.OK, st.Warn, st.Bad, st.Dim = mark("ok"), mark("warn"), mark("bad"), mark("idle")
	var top bytes.Buffer
	renderTop(&top, "http://n-alive:7070", topSnapshot{cluster: status.ClusterInfo{Self: "n-alive", Members: snap.Members()},
		models: snap.Deployments(now), shards: snap.Shards(now), gatewayErr: fmt.Errorf("no gateway")}, now, 0, st)

	// The overview: the peers as the agent reports them, and this node's
	// engines with the leases the agent reports.
	var f overview.Frame
	f.At = now
	f.Peers.FromAgent = true
	for _, m := range members {
		f.Peers.Peers = append(f.Peers.Peers, overview.Peer{Name: "n-" + string(m), Addr: "10.0.0.1:7946", State: string(m)})
	}
	for i, l := range []placement.LeaseState{placement.LeaseValid, placement.LeaseStarting, placement.LeaseLapsed, status.LeaseNone} {
		f.Engines.Engines = append(f.Engines.Engines, overview.Engine{Shard: fmt.Sprintf("chat-%d", i), Model: "m", Engine: "fake",
			PID: 100 + i, PIDAlive: true, StartedAt: now, Lease: string(l), Status: "ready"})
	}
	ov := overview.Render(f, 0, st)

	checked := map[string]int{}
	for _, w := range words {
		tone, ok := toneOf[w]
		if !ok {
			t.Fatalf("%q: no tone pinned for it", w)
		}
		if got := status.StateTone(w).String(); got != tone {
			t.Errorf("status.StateTone(%q) = %s, want %s", w, got, tone)
		}
		if want := fmt.Sprintf(`class="%s">%s</td>`, pageClass[tone], w); !strings.Contains(html, want) {
			t.Errorf("the page does not draw %q as %s: no %s", w, tone, want)
		} else {
			checked[w]++
		}
		if want := "<" + tone + ">" + w + "</" + tone + ">"; !strings.Contains(top.String(), want) {
			t.Errorf("llmgw top does not draw %q as %s:\n%s", w, tone, top.String())
		} else {
			checked[w]++
		}
	}
	for _, w := range append([]string{"alive", "suspect", "unknown", "dead", "left"}, "valid", "starting", "lapsed", "none") {
		tone := toneOf[w]
		if want := "<" + tone + ">" + w + "</" + tone + ">"; !strings.Contains(ov, want) {
			t.Errorf("the overview does not draw %q as %s:\n%s", w, tone, ov)
		}
	}
	// Every member state and lease is drawn by all three views, every shard
	// status by the two that show shards.
	for w, n := range checked {
		if n != 2 {
			t.Errorf("%q checked in %d views, want the page and top", w, n)
		}
	}
}

// pageSource is a node's read model for the page.
type pageSource struct {
	snap *status.Snapshot
	now  time.Time
}

func (p pageSource) Status() *status.Snapshot { return p.snap }
func (p pageSource) Now() time.Time           { return p.now }
