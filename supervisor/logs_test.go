package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/secret"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/engine"
)

func TestTailOffset(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	var b strings.Builder
	for i := 1; i <= 50000; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	os.WriteFile(p, []byte(b.String()), 0o600)
	f, _ := os.Open(p)
	defer f.Close()
	for _, n := range []int{0, 1, 3, 50000, 60000} {
		off, cut, err := tailOffset(f, int64(b.Len()), n, maxLogBytes)
		if err != nil || cut {
			t.Fatal(cut, err)
		}
		got := strings.Split(strings.TrimSuffix(b.String()[off:], "\n"), "\n")
		want := min(n, 50000)
		if n == 0 {
			if off != int64(b.Len()) {
				t.Fatalf("tail 0: offset %d, want end", off)
			}
			continue
		}
		if len(got) != want || got[len(got)-1] != "line 50000" {
			t.Fatalf("tail %d: %d lines, last %q", n, len(got), got[len(got)-1])
		}
	}
}

// A file without enough newlines is read back at most limit bytes, and
// says so.
func TestTailOffsetStopsAtTheLimit(t *testing.T) {
	text := "first line\n" + strings.Repeat("x", 5000)
	off, cut, err := tailOffset(strings.NewReader(text), int64(len(text)), 2, 1000)
	if err != nil || !cut || off != int64(len(text)-1000) {
		t.Fatalf("tailOffset = %d, %v, %v; want %d, cut", off, cut, err, len(text)-1000)
	}
	// Within the limit the lines are found as usual.
	off, cut, err = tailOffset(strings.NewReader(text), int64(len(text)), 1, 10000)
	if err != nil || cut || off != int64(len("first line\n")) {
		t.Fatalf("tailOffset = %d, %v, %v; want the second line's start", off, cut, err)
	}
}

// logEngines holds one shard with a log file, for the logs API.
type logEngines struct {
	*engine.ClaimOnly
	path string
}

func (l *logEngines) LogPath(shard string) (string, bool) { return l.path, shard == "x-0" }

func (l *logEngines) Shards() []gossip.ShardRecord {
	return []gossip.ShardRecord{{ShardID: "x-0", ReplicaID: "x-0", Deployment: "x", Status: gossip.ShardReady}}
}

func TestLogsAreServedByAnyNode(t *testing.T) {
	h := newHarness(t)
	logPath := filepath.Join(t.TempDir(), "x.log")
	os.WriteFile(logPath, []byte("one\ntwo\nthree\n"), 0o600)
	cfg := h.config("a")
	cfg.Runner = &logEngines{ClaimOnly: engine.NewClaimOnly(clock.Real()), path: logPath}
	h.cfgs["a"] = cfg
	a := h.start("a")
	b := h.start("b", h.gossipAddr("a"))
	testwait.Until(t, 10*time.Second, "b sees a's shard", func() (bool, string) {
		node, _ := holderOf(b.cluster.Members(), b.Name(), "x-0")
		return node == "a", node
	})
	get := func(n *Node, q string) (int, string) {
		return getLogs(t, n, "/v1/shards/x-0/logs"+q, testToken)
	}
	if code, body := get(b, "?tail=2"); code != 200 || body != "two\nthree\n" {
		t.Fatalf("via b: %d %q", code, body)
	}
	if code, body := get(a, "?tail=1"); code != 200 || body != "three\n" {
		t.Fatalf("on a: %d %q", code, body)
	}
	if code, _ := get(b, "?tail=-3"); code != 400 {
		t.Fatalf("bad tail: %d", code)
	}
	if code, body := get(a, "?follow=yes"); code != 400 || !strings.Contains(body, "follow") {
		t.Fatalf("bad follow: %d %q", code, body)
	}
	if code, _ := getLogs(t, b, "/v1/shards/nope-0/logs", testToken); code != 404 {
		t.Fatalf("unknown shard: %d", code)
	}
	// Follow streams what is appended later.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", api(b, "/v1/shards/x-0/logs?tail=0&follow=1"), nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	fresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer fresp.Body.Close()
	f, _ := os.OpenFile(logPath, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("four\n")
	f.Close()
	buf := make([]byte, 5)
	if _, err := io.ReadFull(fresp.Body, buf); err != nil || string(buf) != "four\n" {
		t.Fatalf("follow: %q %v", buf, err)
	}
}

// getLogs GETs a logs path from n with token (none when empty).
func getLogs(t *testing.T, n *Node, path, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", api(n, path), nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// logPair starts a, which runs shard x-0 with a log, and b, which knows
// it: b proxies x-0's log requests to a.
func logPair(t *testing.T) (a, b *Node) {
	h := newHarness(t)
	logPath := filepath.Join(t.TempDir(), "x.log")
	if err := os.WriteFile(logPath, []byte("one\ntwo\nthree\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := h.config("a")
	cfg.Runner = &logEngines{ClaimOnly: engine.NewClaimOnly(clock.Real()), path: logPath}
	h.cfgs["a"] = cfg
	a = h.start("a")
	b = h.start("b", h.gossipAddr("a"))
	testwait.Until(t, 10*time.Second, "b sees a's shard", func() (bool, string) {
		node, _ := holderOf(b.cluster.Members(), b.Name(), "x-0")
		return node == "a", node
	})
	return a, b
}

// Engine logs can hold prompts: reading them needs the cluster token, on
// the node that runs the shard and through any other. The node that
// proxies has checked the token and signs the hop; the token itself never
// leaves it, and a hop that is not signed with the cluster's token, or
// is stale, is refused. Before, anyone who could reach a node could read
// every engine log.
func TestLogsNeedTheToken(t *testing.T) {
	a, b := logPair(t)
	for _, n := range []*Node{a, b} {
		if code, body := getLogs(t, n, "/v1/shards/x-0/logs", ""); code != http.StatusUnauthorized || !strings.Contains(body, "cluster token") {
			t.Errorf("%s without the token: %d %q, want 401 naming the token", n.Name(), code, body)
		}
		if code, _ := getLogs(t, n, "/v1/shards/x-0/logs", "wrong-token-xxxxxxxxxxxx"); code != http.StatusForbidden {
			t.Errorf("%s with a wrong token: %d, want 403", n.Name(), code)
		}
		if code, body := getLogs(t, n, "/v1/shards/x-0/logs?tail=1", testToken); code != 200 || body != "three\n" {
			t.Errorf("%s with the token: %d %q", n.Name(), code, body)
		}
	}
	// Hops that a node with the cluster's token did not sign just now.
	sign := func(token, purpose string, at time.Time) http.Header {
		h := http.Header{}
		target := "/v1/shards/x-0/logs?tail=1"
		mac := hopMAC(secret.HopKey(token, purpose), "GET", target, "b", "127.0.0.1", nil, at.Unix())
		h.Set(forwardedHeader, "b")
		h.Set(hopCallerHeader, "127.0.0.1")
		h.Set(hopHeader, fmt.Sprintf("%d.%x", at.Unix(), mac))
		return h
	}
	for name, tc := range map[string]struct {
		h    http.Header
		want string
	}{
		"another token":   {sign("another-token-0123456789", "logs", time.Now()), "wrong signature"},
		"another purpose": {sign(testToken, "mcp", time.Now()), "wrong signature"},
		"a changed caller": {func() http.Header {
			h := sign(testToken, "logs", time.Now())
			h.Set(hopCallerHeader, "10.0.0.9")
			return h
		}(), "wrong signature"},
		"stale":              {sign(testToken, "logs", time.Now().Add(-2*hopWindow)), "clocks"},
		"no signature":       {http.Header{hopHeader: {"garbage"}, forwardedHeader: {"b"}}, "no valid"},
		"the right one, now": {sign(testToken, "logs", time.Now()), ""},
	} {
		req, _ := http.NewRequest("GET", api(a, "/v1/shards/x-0/logs?tail=1"), nil)
		req.Header = tc.h
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if tc.want == "" {
			if resp.StatusCode != 200 || string(body) != "three\n" {
				t.Errorf("%s: %d %q, want the log", name, resp.StatusCode, body)
			}
			continue
		}
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s: %d %q, want 403 saying %q", name, resp.StatusCode, body, tc.want)
		}
	}
}

// follow opens a follow=1 stream of x-0's log on n from the local address
// from, and returns its status; the stream stays open until ctx ends.
func follow(t *testing.T, ctx context.Context, n *Node, from, token string) int {
	t.Helper()
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	client := &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}}
	req, _ := http.NewRequestWithContext(ctx, "GET", api(n, "/v1/shards/x-0/logs?tail=0&follow=1"), nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
	} else {
		t.Cleanup(func() { resp.Body.Close() })
	}
	return resp.StatusCode
}

// Follow slots are counted per caller: callers without the token take
// none (they are refused), and one caller, directly or through another
// node, cannot hold more than its share, so others still get one. Before,
// 64 unauthenticated followers took every slot and operators got 429.
func TestLogFollowSlotsArePerCaller(t *testing.T) {
	a, b := logPair(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range maxFollowers {
		if code := follow(t, ctx, a, "127.0.0.1", ""); code != http.StatusUnauthorized {
			t.Fatalf("unauthenticated follower %d: HTTP %d, want 401", i, code)
		}
	}
	if code := follow(t, ctx, a, "127.0.0.1", testToken); code != http.StatusOK {
		t.Fatalf("an operator after %d unauthenticated followers: HTTP %d, want 200", maxFollowers, code)
	}
	// One caller's share, half of it through b: the hop carries who the
	// caller is.
	for i := 1; i < maxFollowersPerCaller; i++ {
		via := a
		if i%2 == 0 {
			via = b
		}
		if code := follow(t, ctx, via, "127.0.0.1", testToken); code != http.StatusOK {
			t.Fatalf("follower %d of one caller via %s: HTTP %d, want 200", i+1, via.Name(), code)
		}
	}
	for _, via := range []*Node{a, b} {
		if code := follow(t, ctx, via, "127.0.0.1", testToken); code != http.StatusTooManyRequests {
			t.Errorf("one caller's follower %d via %s: HTTP %d, want 429", maxFollowersPerCaller+1, via.Name(), code)
		}
	}
	if code := follow(t, ctx, a, "127.0.0.2", testToken); code != http.StatusOK {
		t.Errorf("another caller, once the first holds its share: HTTP %d, want 200", code)
	}
}

func TestFollowSlots(t *testing.T) {
	var s followSlots
	var releases []func()
	for i := range maxFollowers {
		release, err := s.take(fmt.Sprintf("10.0.0.%d", i%(maxFollowers/maxFollowersPerCaller)))
		if err != nil {
			t.Fatalf("slot %d: %v", i, err)
		}
		releases = append(releases, release)
	}
	if _, err := s.take("10.0.0.200"); err == nil || !strings.Contains(err.Error(), "64 log streams already follow") {
		t.Fatalf("past the node's limit: %v", err)
	}
	releases[0]() // 10.0.0.0 gives one back
	if _, err := s.take("10.0.0.1"); err == nil || !strings.Contains(err.Error(), "from 10.0.0.1") {
		t.Fatalf("past a caller's limit: %v", err)
	}
	if release, err := s.take("10.0.0.0"); err != nil {
		t.Fatalf("a caller below its limit: %v", err)
	} else {
		release()
	}
	for _, r := range releases[1:] {
		r()
	}
	if s.total != 0 || len(s.byCaller) != 0 {
		t.Fatalf("after every release: %d open, %v", s.total, s.byCaller)
	}
}

// A call another node forwards for MCP is let in by its signature, made
// over its body with a key derived from the token: a changed body, a key
// from another token, or no signature at all are refused before MCP sees
// anything.
func TestMCPHopIsCheckedWithItsBody(t *testing.T) {
	h := newHarness(t)
	n := h.start("a")
	var got []byte
	guarded := n.RequireTokenOrHop(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusOK)
	}))
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call"}`)
	send := func(sign func(*http.Request), sent []byte) int {
		req := httptest.NewRequest("POST", "/mcp", bytes.NewReader(sent))
		sign(req)
		rec := httptest.NewRecorder()
		guarded.ServeHTTP(rec, req)
		return rec.Code
	}
	signed := func(r *http.Request) { n.SignHop(r, "mcp", body) }
	if code := send(signed, body); code != http.StatusOK || !bytes.Equal(got, body) {
		t.Fatalf("a signed hop: HTTP %d, body handed on %q; want 200 and %q", code, got, body)
	}
	if code := send(signed, []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)); code != http.StatusForbidden {
		t.Errorf("a signed hop with another body: HTTP %d, want 403", code)
	}
	other := func(r *http.Request) {
		unix := time.Now().Unix()
		mac := hopMAC(secret.HopKey("another-cluster-token-0123456789", "mcp"), r.Method, r.URL.RequestURI(), "b", "mcp", body, unix)
		r.Header.Set(forwardedHeader, "b")
		r.Header.Set(hopCallerHeader, "mcp")
		r.Header.Set(hopHeader, fmt.Sprintf("%d.%x", unix, mac))
	}
	if code := send(other, body); code != http.StatusForbidden {
		t.Errorf("a hop signed under another token: HTTP %d, want 403", code)
	}
	logsKey := func(r *http.Request) { n.hops.sign(r, "logs", "mcp", body) }
	if code := send(logsKey, body); code != http.StatusForbidden {
		t.Errorf("a hop signed for logs, not MCP: HTTP %d, want 403", code)
	}
	if code := send(func(*http.Request) {}, body); code != http.StatusUnauthorized {
		t.Errorf("neither token nor signature: HTTP %d, want 401", code)
	}
}
