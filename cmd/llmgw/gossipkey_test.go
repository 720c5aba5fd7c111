package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/freeport"
	"github.com/llmgw/llmgw/internal/testlog"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/status"
)

// testNode is one `llmgw node up` run in-process on loopback.
type testNode struct {
	dataDir string
	gossip  string
	api     string
	out     *testlog.Buffer
	done    chan error
	stop    context.CancelFunc
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// nodeArgs is `node up` for a node named name in dataDir, on free loopback
// ports, with no engines, plus extra.
func nodeArgs(t *testing.T, name, dataDir string, extra ...string) (args []string, gossip, api string) {
	gossip = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	api = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	args = append([]string{"node", "up", "--name", name, "--data-dir", dataDir, "--bind", gossip, "--api", api, "--gateway", "127.0.0.1:0",
		"--profile", "local", "--runtime", "none", "--simulate-gpus", "1xH100-80GB"}, extra...)
	return args, gossip, api
}

// startNode runs `node up` until its API answers, and stops it (SIGTERM's
// path: the context ends) when the test ends.
func startNode(t *testing.T, name, dataDir string, extra ...string) *testNode {
	t.Helper()
	args, gossip, api := nodeArgs(t, name, dataDir, extra...)
	ctx, cancel := context.WithCancel(context.Background())
	n := &testNode{dataDir: dataDir, gossip: gossip, api: "http://" + api, out: &testlog.Buffer{}, done: make(chan error, 1), stop: cancel}
	app := newApp()
	app.Writer, app.ErrWriter = n.out, n.out
	go func() { n.done <- app.Run(ctx, append([]string{"llmgw"}, args...)) }()
	t.Cleanup(func() { n.shutdown(t) })
	cl := &http.Client{Timeout: time.Second}
	testwait.Until(t, 15*time.Second, name+" answers /healthz", func() (bool, string) {
		select {
		case err := <-n.done:
			n.done <- err
			t.Fatalf("%s exited during start: %v\n%s", name, err, n.out)
		default:
		}
		resp, err := cl.Get(n.api + "/healthz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	cl.CloseIdleConnections()
	return n
}

func (n *testNode) shutdown(t *testing.T) {
	n.stop()
	select {
	case err := <-n.done:
		if err != nil {
			t.Errorf("node up returned %v", err)
		}
		n.done <- err
	case <-time.After(20 * time.Second):
		t.Fatalf("node did not stop within 20s of its context ending")
	}
}

// alive is how many members n sees alive.
func (n *testNode) alive() (int, string) {
	cl := &http.Client{Timeout: time.Second}
	defer cl.CloseIdleConnections()
	resp, err := cl.Get(n.api + "/v1/cluster")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var info status.ClusterInfo
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		return 0, err.Error()
	}
	alive := 0
	for _, m := range info.Members {
		if m.State == "alive" {
			alive++
		}
	}
	return alive, fmt.Sprintf("%d of %d members alive", alive, len(info.Members))
}

func writeKey(t *testing.T, path string, key []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// runWithin runs the CLI with a deadline, so a command that should fail
// at once but starts a node instead ends (and the test fails) rather than
// hanging.
func runWithin(t *testing.T, within time.Duration, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	app := newApp()
	out := &testlog.Buffer{}
	app.Writer, app.ErrWriter = out, out
	err := app.Run(ctx, append([]string{"llmgw"}, args...))
	return out.String(), err
}

// A node with no key and no --join starts a new cluster: it makes a key in
// its data dir, says where it is and how the other nodes get it, and uses
// the same key when it starts again. The key is the one gossip uses: a
// node given that file joins.
func TestNewClusterNodeGeneratesAGossipKeyAndKeepsIt(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "n1")
	keyFile := datadir.New(dir).GossipKeyFile()
	n1 := startNode(t, "n1", dir)
	out := n1.out.String()
	for _, want := range []string{"generated a gossip key", keyFile, "--gossip-key-file", "data dir"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log does not say %q:\n%s", want, out)
		}
	}
	fi, err := os.Stat(keyFile)
	if err != nil {
		t.Fatalf("no key in the data dir: %v", err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", keyFile, fi.Mode().Perm())
	}
	first, _ := os.ReadFile(keyFile)
	if key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(first))); err != nil || len(key) != 32 {
		t.Fatalf("%s holds %q (%v); want base64 of 32 bytes", keyFile, first, err)
	}

	// The generated key encrypts the cluster's gossip: a node given it
	// joins (one without it could not, see the gossip tests).
	n2 := startNode(t, "n2", filepath.Join(t.TempDir(), "n2"), "--gossip-key-file", keyFile, "--join", n1.gossip)
	testwait.Until(t, 15*time.Second, "n1 sees n2", func() (bool, string) {
		a, why := n1.alive()
		return a == 2, why
	})
	n2.shutdown(t)
	n1.shutdown(t)

	// Restarted (now with n2 among its remembered peers), n1 keeps its key.
	n1 = startNode(t, "n1", dir)
	again, _ := os.ReadFile(keyFile)
	if !bytes.Equal(again, first) {
		t.Fatalf("the key changed across a restart: %q, then %q", first, again)
	}
	if out := n1.out.String(); strings.Contains(out, "generated") || !strings.Contains(out, "key in the data dir") {
		t.Errorf("restart: want the data dir's key used, not a new one:\n%s", out)
	}
}

// A node that joins a cluster with no key is refused, exit status 1, with
// one line that names the flag and where the key goes; it writes nothing.
// Remembered peers count as joining: a key of its own would split a
// restarted node from its cluster.
func TestJoiningWithoutAGossipKeyFailsWithTheHint(t *testing.T) {
	t.Run("join", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "data")
		args, _, _ := nodeArgs(t, "n2", dir, "--join", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
		_, err := runWithin(t, 10*time.Second, args...)
		checkNoKeyRefusal(t, err, dir, "--join")
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("a refused start wrote %d files in the data dir", len(ents))
		}
	})
	t.Run("remembered peers", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "data")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := datadir.New(dir).WriteIdentity(datadir.Identity{Name: "n2", Epoch: 1, Peers: []string{"127.0.0.1:7946"}}); err != nil {
			t.Fatal(err)
		}
		args, _, _ := nodeArgs(t, "n2", dir)
		_, err := runWithin(t, 10*time.Second, args...)
		checkNoKeyRefusal(t, err, dir, "remembers peers 127.0.0.1:7946")
		if _, err := os.Stat(datadir.New(dir).GossipKeyFile()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a restarted member generated a key of its own (%v)", err)
		}
	})
}

func checkNoKeyRefusal(t *testing.T, err error, dir, why string) {
	t.Helper()
	var ce codedError
	if !errors.As(err, &ce) || ce.code != 1 {
		t.Fatalf("got %v; want a failure with exit status 1", err)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") {
		t.Errorf("the error spans several lines: %q", msg)
	}
	for _, want := range []string{"no gossip key", why, "--gossip-key-file", datadir.New(dir).GossipKeyFile(), "--insecure-gossip"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
}

// --insecure-gossip (or LLMGW_INSECURE_GOSSIP) starts a node without a key,
// even one that joins, and says loudly that gossip is open; it writes no
// key.
func TestInsecureGossipStartsAndWarns(t *testing.T) {
	for _, how := range []string{"flag", "env"} {
		t.Run(how, func(t *testing.T) {
			var extra []string
			if how == "flag" {
				extra = []string{"--insecure-gossip"}
			} else {
				t.Setenv("LLMGW_INSECURE_GOSSIP", "true")
			}
			dir := filepath.Join(t.TempDir(), "data")
			n := startNode(t, "n1", dir, append(extra, "--join", fmt.Sprintf("127.0.0.1:%d", freePort(t)))...)
			if out := n.out.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "GOSSIP IS NOT ENCRYPTED (--insecure-gossip)") {
				t.Errorf("no loud warning:\n%s", out)
			}
			if _, err := os.Stat(datadir.New(dir).GossipKeyFile()); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("--insecure-gossip wrote a key (%v)", err)
			}
		})
	}
	// A data dir with a key belongs to an encrypted cluster: going
	// unencrypted would split the node off, so it is refused.
	dir := filepath.Join(t.TempDir(), "data")
	writeKey(t, datadir.New(dir).GossipKeyFile(), bytes.Repeat([]byte{7}, 32))
	args, _, _ := nodeArgs(t, "n1", dir, "--insecure-gossip")
	_, err := runWithin(t, 10*time.Second, args...)
	var ce codedError
	if !errors.As(err, &ce) || ce.code != 1 || !strings.Contains(err.Error(), datadir.New(dir).GossipKeyFile()) {
		t.Fatalf("--insecure-gossip beside a key in the data dir: %v; want exit status 1 naming the key file", err)
	}
}

// A key put in a joining node's data dir is the one it uses: it joins a
// cluster encrypted with that key.
func TestGossipKeyInTheDataDirIsPickedUp(t *testing.T) {
	key := bytes.Repeat([]byte{42}, 32)
	keyFile := filepath.Join(t.TempDir(), "cluster.key")
	writeKey(t, keyFile, key)
	n1 := startNode(t, "n1", filepath.Join(t.TempDir(), "n1"), "--gossip-key-file", keyFile)
	dir := filepath.Join(t.TempDir(), "n2")
	writeKey(t, datadir.New(dir).GossipKeyFile(), key)
	n2 := startNode(t, "n2", dir, "--join", n1.gossip)
	testwait.Until(t, 15*time.Second, "n1 and n2 see each other", func() (bool, string) {
		a1, why1 := n1.alive()
		a2, why2 := n2.alive()
		return a1 == 2 && a2 == 2, "n1: " + why1 + "; n2: " + why2
	})
	if out := n2.out.String(); !strings.Contains(out, "key in the data dir") {
		t.Errorf("n2's log does not say it uses the data dir's key:\n%s", out)
	}
}
