package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/status"
)

// activeOf is the cluster version /v1/cluster says the node runs at.
func activeOf(t *testing.T, n *Node) int {
	t.Helper()
	resp, err := http.Get("http://" + n.APIAddr() + "/v1/cluster")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info status.ClusterInfo
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		t.Fatal(err)
	}
	return info.ActiveVersion
}

// startAtV1 starts h's node name on clk as the first node of a cluster
// that began on the previous release (protocol 1), checks that it runs
// at 1, and returns it with its config (h.start: killed when the test
// ends).
func startAtV1(t *testing.T, h *harness, name string, clk *clock.Fake) (*Node, Config) {
	t.Helper()
	cfg := h.config(name)
	cfg.Clock = clk
	cfg.NewClusterVersion = protocol.V1
	h.cfgs[name] = cfg
	n := h.start(name)
	if got := n.GossipStats().ActiveVersion; got != protocol.V1 {
		t.Fatalf("%s starts at protocol %d, want %d", name, got, protocol.V1)
	}
	return n, h.cfgs[name]
}

// A node's cluster version rises on its clock, is kept in node.json, and a
// restart starts at it; a node told of peers it has not heard keeps the
// version it has.
func TestActiveVersionIsKeptAcrossARestart(t *testing.T) {
	clk := clock.NewFake(time.Now())
	h := newHarness(t)
	a, cfg := startAtV1(t, h, "a", clk)
	// b was told of a peer that never answers: it knows nothing of what
	// the cluster speaks.
	cfgB := h.config("b", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	cfgB.Clock = clk
	b, err := Start(context.Background(), cfgB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Kill() })
	testwait.Until(t, 15*time.Second, "a, alone, rises to "+fmt.Sprint(protocol.Max), func() (bool, string) {
		clk.Advance(time.Second)
		v := activeOf(t, a)
		return v == protocol.Max, fmt.Sprint(v)
	})
	testwait.StaysTrue(t, 500*time.Millisecond, "b, which heard none of its peers, stays at 1", func() (bool, string) {
		clk.Advance(time.Second)
		v := b.GossipStats().ActiveVersion
		return v == protocol.V1, fmt.Sprint(v)
	})
	testwait.Until(t, 5*time.Second, "node.json keeps the active version", func() (bool, string) {
		id, _, err := datadir.New(cfg.DataDir).ReadIdentity()
		return err == nil && id.ActiveVersion == protocol.Max, fmt.Sprint(id.ActiveVersion, err)
	})
	a.Kill()

	a2, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a2.Kill() })
	if got := a2.GossipStats().ActiveVersion; got != protocol.Max {
		t.Fatalf("restarted, a runs at %d, want the kept %d", got, protocol.Max)
	}
	testwait.Until(t, 5*time.Second, "/v1/cluster says the kept version", func() (bool, string) {
		loopArmed(t, a2)
		return activeOf(t, a2) == protocol.Max, fmt.Sprint(activeOf(t, a2))
	})
}

// A node that starts a new cluster (no peer to join, none remembered, no
// version kept) runs at its build's newest version at once, as a new
// CockroachDB cluster does; one told of a peer does not: the cluster it
// joins may run an older release.
func TestANewClusterStartsAtTheNewestVersion(t *testing.T) {
	h := newHarness(t)
	a, err := Start(context.Background(), h.config("a"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Kill() })
	if got := a.GossipStats().ActiveVersion; got != protocol.Max {
		t.Fatalf("a new cluster's first node runs at %d, want %d", got, protocol.Max)
	}
	b, err := Start(context.Background(), h.config("b", fmt.Sprintf("127.0.0.1:%d", freePort(t))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Kill() })
	if got := b.GossipStats().ActiveVersion; got != protocol.V1 {
		t.Fatalf("a node told of a peer it has not heard runs at %d, want %d", got, protocol.V1)
	}
}
