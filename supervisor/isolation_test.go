package supervisor

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/testlog"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/status"
)

const (
	isolatedLine   = "this node is isolated"
	unisolatedLine = "no longer isolated"
)

func (h *harness) logged(name string, join ...string) *testlog.Buffer {
	cfg := h.config(name, join...)
	lb := &testlog.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(lb, nil))
	h.cfgs[name] = cfg
	return lb
}

func partition(t *testing.T, n *Node, drop ...string) {
	t.Helper()
	body := fmt.Sprintf(`{"drop": [%s]}`, quoteAll(drop))
	if code := call(t, "POST", api(n, "/v1/test/partition"), testToken, []byte(body), nil); code != 200 {
		t.Fatalf("partition %s: HTTP %d", n.Name(), code)
	}
}

func quoteAll(ss []string) string {
	var q []string
	for _, s := range ss {
		q = append(q, `"`+s+`"`)
	}
	return strings.Join(q, ",")
}

func selfRow(t *testing.T, n *Node) status.MemberInfo {
	var ci status.ClusterInfo
	call(t, "GET", api(n, "/v1/cluster"), "", nil, &ci)
	for _, m := range ci.Members {
		if m.Name == n.Name() {
			return m
		}
	}
	t.Fatalf("%s is not in its own /v1/cluster", n.Name())
	return status.MemberInfo{}
}

// A node cut off from every peer says so (its own row, /status.json, one
// error line) while the two that still hear each other do not, and it
// says it is back, once, at the first contact.
func TestCutOffNodeSaysItIsIsolatedAndRecovers(t *testing.T) {
	h := newHarness(t)
	logA, logC := h.logged("a"), h.logged("c", h.gossipAddr("a"))
	a := h.start("a")
	b := h.start("b", h.gossipAddr("a"))
	c := h.start("c", h.gossipAddr("a"))
	testwait.Until(t, 15*time.Second, "c sees 3 alive", func() (bool, string) {
		alive := 0
		for _, m := range c.cluster.Members() {
			if m.State == gossip.StateAlive {
				alive++
			}
		}
		return alive == 3, fmt.Sprint(alive)
	})
	partition(t, a, "c")
	partition(t, b, "c")
	partition(t, c, "a", "b")
	testwait.Until(t, 15*time.Second, "c says it is isolated", func() (bool, string) {
		row := selfRow(t, c)
		return row.Isolated && !row.IsolatedSince.IsZero(), fmt.Sprintf("%+v", row.Isolated)
	})
	var st map[string]any
	call(t, "GET", api(c, "/status.json"), "", nil, &st)
	if st["isolated"] != true || st["isolated_since"] == nil {
		t.Fatalf("/status.json of c: isolated %v since %v", st["isolated"], st["isolated_since"])
	}
	for _, n := range []*Node{a, b} {
		if row := selfRow(t, n); row.Isolated {
			t.Fatalf("%s says it is isolated while it hears a peer", n.Name())
		}
	}
	// The line says what follows: the leases lapse elsewhere.
	if l := logC.String(); strings.Count(l, isolatedLine) != 1 || !strings.Contains(l, "leases will lapse") {
		t.Fatalf("c's log has %d isolation lines, want 1 naming the leases:\n%s", strings.Count(l, isolatedLine), l)
	}

	partition(t, a)
	partition(t, b)
	partition(t, c)
	testwait.Until(t, 15*time.Second, "c hears its peers again", func() (bool, string) {
		row := selfRow(t, c)
		return !row.Isolated && strings.Contains(logC.String(), unisolatedLine), fmt.Sprint(row.Isolated)
	})
	l := logC.String()
	if strings.Count(l, isolatedLine) != 1 || strings.Count(l, unisolatedLine) != 1 {
		t.Fatalf("c logged %d isolation and %d recovery lines, want one each:\n%s", strings.Count(l, isolatedLine), strings.Count(l, unisolatedLine), l)
	}
	if strings.Contains(logA.String(), isolatedLine) {
		t.Fatalf("a, which heard b all along, logged isolation:\n%s", logA.String())
	}
}

// A node that starts a cluster alone is alone, not isolated, however long
// it hears no one; one told of peers that never answer is isolated.
func TestIsolatedOnlyWhenPeersAreExpected(t *testing.T) {
	h := newHarness(t)
	lone := h.start("lone")
	later := lone.clock.Now().Add(time.Hour)
	if since := lone.isolation.check(later, lone.cluster.LastHeard(), lone.cluster.Members()); !since.IsZero() {
		t.Fatalf("a node with no peers configured reads isolated since %v", since)
	}
	lb := h.logged("waiting", "127.0.0.1:1")
	waiting := h.start("waiting", "127.0.0.1:1")
	if since := waiting.isolation.check(waiting.clock.Now().Add(time.Hour), waiting.cluster.LastHeard(), waiting.cluster.Members()); since.IsZero() {
		t.Fatal("a node whose --join never answered is not isolated an hour on")
	}
	testwait.Until(t, 5*time.Second, "one error line", func() (bool, string) {
		return bytes.Contains([]byte(lb.String()), []byte(isolatedLine)), lb.String()
	})
}

// A join refused for its gossip key says so on the joining node, once,
// with the fix, however often the join is retried; not "no peer answered".
func TestWrongKeyJoinSaysSoOnceWithTheFix(t *testing.T) {
	h := newHarness(t)
	logA := h.logged("a")
	cfgA := h.cfgs["a"]
	cfgA.GossipKey = bytes.Repeat([]byte{1}, 32)
	h.cfgs["a"] = cfgA
	logB := h.logged("b", h.gossipAddr("a"))
	cfgB := h.cfgs["b"]
	cfgB.GossipKey = bytes.Repeat([]byte{2}, 32)
	h.cfgs["b"] = cfgB
	h.start("a")
	h.start("b")
	// a refuses every try: wait until b has tried three times.
	testwait.Until(t, 15*time.Second, "b retried its join 3 times", func() (bool, string) {
		n := strings.Count(logA.String(), "decrypt")
		return n >= 3, fmt.Sprint(n, " refusals")
	})
	l := logB.String()
	want := "peer " + h.gossipAddr("a") + " answered but gossip decryption failed: this node's gossip key differs from the cluster's; copy " + datadir.New(h.cfgs["b"].DataDir).GossipKeyFile()
	if strings.Count(l, want) != 1 || !strings.Contains(l, "--gossip-key-file") {
		t.Fatalf("b's log has %d lines %q (want 1, naming --gossip-key-file):\n%s", strings.Count(l, want), want, l)
	}
	if strings.Contains(l, "no peer answered") {
		t.Fatalf("b says no peer answered, though a did:\n%s", l)
	}
}
