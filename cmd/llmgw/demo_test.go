package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/freeport"
	"github.com/llmgw/llmgw/internal/testwait"
)

// consecutivePorts finds n consecutive loopback ports free for TCP and
// UDP (the demo numbers its nodes' ports from a base).
func consecutivePorts(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		base, err := freeport.Loopback()
		if err != nil || base+n > 65535 {
			continue
		}
		ok := true
		for p := base; p < base+n && ok; p++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				ok = false
				break
			}
			u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", p))
			l.Close()
			if err != nil {
				ok = false
				break
			}
			u.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no consecutive free ports")
	return 0
}

// The demo rehearses a failure: stop-node stops one node (the cluster sees
// it go), start-node starts it again with the flags it first had (the
// cluster sees it back), and down says what it unplaces. The nodes are real
// `llmgw node up` processes (this test binary, see TestMain) with the fake
// engine.
func TestDemoStopsAndStartsANodeAndSaysWhatItUnplaces(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a two-node demo")
	}
	dir := t.TempDir()
	t.Cleanup(func() {
		// Whatever happened, leave no node or engine behind.
		if out, err := run(t, "demo", "down", "--dir", dir); err != nil {
			t.Logf("demo down: %v\n%s", err, out)
		}
	})
	api, gossip, gw := consecutivePorts(t, 2), consecutivePorts(t, 2), consecutivePorts(t, 2)
	out, err := run(t, "demo", "up", "--dir", dir, "--nodes", "2", "--gpus", "2xH100-80GB",
		"--api-port", fmt.Sprint(api), "--gossip-port", fmt.Sprint(gossip), "--gateway-port", fmt.Sprint(gw))
	if err != nil {
		t.Fatalf("demo up: %v\n%s\n%s", err, out, demoLogs(dir))
	}
	if !strings.Contains(out, "demo stop-node node-2") {
		t.Errorf("demo up does not say how to rehearse a failure:\n%s", out)
	}
	first := fmt.Sprintf("http://127.0.0.1:%d", api)
	alive := func(want int) {
		t.Helper()
		testwait.Until(t, 20*time.Second, fmt.Sprintf("%d alive", want), func() (bool, string) {
			n, detail := (&testNode{api: first}).alive()
			return n == want, detail
		})
	}

	before, err := os.ReadFile(filepath.Join(dir, "node-2.cmd.json"))
	if err != nil {
		t.Fatalf("the demo did not remember node-2's command line: %v", err)
	}
	// --gpus, the old spelling of --simulate-gpus, still reaches the nodes.
	if !strings.Contains(string(before), `"2xH100-80GB"`) {
		t.Errorf("node-2 was not started with --gpus's value: %s", before)
	}
	out, err = run(t, "demo", "stop-node", "--dir", dir, "--kill", "node-2")
	if err != nil || !strings.Contains(out, "stopped node-2 (SIGKILL: a crash") || !strings.Contains(out, "demo start-node node-2") {
		t.Fatalf("stop-node --kill: %v\n%s", err, out)
	}
	alive(1)
	if _, err := run(t, "demo", "stop-node", "--dir", dir, "node-2"); err == nil || !strings.Contains(err.Error(), "node-2 is not running") {
		t.Errorf("stopping a stopped node: %v", err)
	}
	if _, err := run(t, "demo", "start-node", "--dir", dir, "node-9"); err == nil || !strings.Contains(err.Error(), "the demo's nodes are node-1, node-2") {
		t.Errorf("an unknown node: %v", err)
	}

	out, err = run(t, "demo", "start-node", "--dir", dir, "node-2")
	if err != nil || !strings.Contains(out, "started node-2 again with the flags it first had") {
		t.Fatalf("start-node: %v\n%s\n%s", err, out, demoLogs(dir))
	}
	alive(2)
	if after, _ := os.ReadFile(filepath.Join(dir, "node-2.cmd.json")); string(after) != string(before) {
		t.Errorf("start-node changed the remembered command line:\n%s\nthen\n%s", before, after)
	}
	if _, err := run(t, "demo", "start-node", "--dir", dir, "node-2"); err == nil || !strings.Contains(err.Error(), "runs already") {
		t.Errorf("starting a running node: %v", err)
	}

	// A node left stopped is started again by down, so that it stops the
	// engines it left running.
	if out, err = run(t, "demo", "stop-node", "--dir", dir, "node-2"); err != nil || !strings.Contains(out, "stopped node-2 (SIGTERM: it left the cluster") {
		t.Fatalf("stop-node: %v\n%s", err, out)
	}
	alive(1)
	pid := (demoNode{Name: "node-1"}).pid(dir)
	out, err = run(t, "demo", "down", "--dir", dir)
	if !strings.Contains(out, "starting node-2 again so that it stops the engines it left running") {
		t.Errorf("demo down with node-2 stopped:\n%s", out)
	}
	if err != nil || !strings.Contains(out, "unplaced chat (demo/tiny-chat, fake engine, 2 replicas, ") || !strings.Contains(out, "every engine stopped") || !strings.Contains(out, "stopped 2 demo nodes") {
		t.Fatalf("demo down: %v\n%s", err, out)
	}
	if pid == 0 || processAlive(pid) {
		t.Errorf("node-1 (pid %d) still runs after demo down", pid)
	}
	if out, _ := run(t, "demo", "down", "--dir", dir); !strings.Contains(out, "no demo cluster is running") {
		t.Errorf("a second demo down: %q", out)
	}
}

func demoLogs(dir string) string {
	var b strings.Builder
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, f := range files {
		raw, _ := os.ReadFile(f)
		s := string(raw)
		if len(s) > 3000 {
			s = s[len(s)-3000:]
		}
		fmt.Fprintf(&b, "== %s\n%s\n", f, s)
	}
	return b.String()
}
