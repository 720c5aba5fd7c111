package supervisor

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
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
	cfg.Runner = &logEngines{ClaimOnly: engine.NewClaimOnly(time.Now), path: logPath}
	h.cfgs["a"] = cfg
	a := h.start("a")
	b := h.start("b", h.gossipAddr("a"))
	testwait.Until(t, 10*time.Second, "b sees a's shard", func() (bool, string) {
		node, _ := b.holderOf("x-0")
		return node == "a", node
	})
	get := func(n *Node, q string) (int, string) {
		resp, err := http.Get(api(n, "/v1/shards/x-0/logs"+q))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
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
	resp, _ := http.Get(api(b, "/v1/shards/nope-0/logs"))
	if resp.StatusCode != 404 {
		t.Fatalf("unknown shard: %d", resp.StatusCode)
	}
	resp.Body.Close()
	// Follow streams what is appended later.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", api(b, "/v1/shards/x-0/logs?tail=0&follow=1"), nil)
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
