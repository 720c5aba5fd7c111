package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/internal/testlog"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/status"
)

// fakeSystemd stands in for systemctl: it records each call and runs what
// a restart does to the node under test (restart). Every other command
// runs for real: the binaries under test are small scripts.
type fakeSystemd struct {
	mu      sync.Mutex
	calls   []string
	restart func()
}

func (f *fakeSystemd) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	if name != "systemctl" {
		return host.ExecRunner{}.Run(ctx, name, args...)
	}
	f.mu.Lock()
	f.calls = append(f.calls, strings.Join(append([]string{name}, args...), " "))
	restart := f.restart
	f.mu.Unlock()
	if len(args) > 0 && args[0] == "restart" && restart != nil {
		restart()
	}
	return nil, nil
}

func (f *fakeSystemd) LookPath(name string) (string, error) { return "/usr/bin/" + name, nil }

func (f *fakeSystemd) ran() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// script writes a shell script of mode that prints versionLine for
// `version`, as `llmgw version` prints its build first.
func script(t *testing.T, path, versionLine string, mode os.FileMode) {
	t.Helper()
	body := "#!/bin/sh\nif [ \"$1\" = version ]; then echo '" + versionLine + "'; exit 0; fi\nexit 0\n"
	if err := os.WriteFile(path, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// upgradeSetup is a machine where llmgw was installed as a service (its
// unit names target, the installed binary, a v1 script of mode 0750) and
// whose systemctl is f.
func upgradeSetup(t *testing.T) (s serviceSetup, f *fakeSystemd, target string) {
	t.Helper()
	root := t.TempDir()
	target = filepath.Join(root, "bin", "llmgw")
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		t.Fatal(err)
	}
	script(t, target, "llmgw v1.0.0", 0o750)
	f = &fakeSystemd{}
	s = serviceSetup{unitDir: filepath.Join(root, "systemd"), envDir: filepath.Join(root, "etc-llmgw"), binary: target, run: f, poll: 5 * time.Millisecond}
	if err := os.MkdirAll(s.unitDir, 0o755); err != nil {
		t.Fatal(err)
	}
	return s, f, target
}

// installService runs node install on s with the API at api, as an
// operator would have before upgrading.
func installService(t *testing.T, s serviceSetup, f *fakeSystemd, api string) {
	t.Helper()
	if out, err := runService(t, s, "install", "--name", "n1", "--bind", "127.0.0.1:7946", "--insecure-gossip", "--api", api); err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}
	f.mu.Lock()
	f.calls = nil
	f.mu.Unlock()
}

// fakeNode is a node's API standing in for the agent: /status.json and
// /v1/shards answer what its state says. Each /status.json after a restart
// first takes the next of steps, so a test scripts what the agent shows
// poll by poll, without timing.
type fakeNode struct {
	mu     sync.Mutex
	down   bool
	st     agentState
	shards []status.ShardInfo
	steps  []func(*fakeNode)
}

func (n *fakeNode) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if r.URL.Path == "/status.json" && len(n.steps) > 0 {
		n.steps[0](n)
		n.steps = n.steps[1:]
	}
	switch {
	case n.down:
		http.Error(w, `{"error":"starting"}`, http.StatusServiceUnavailable)
	case r.URL.Path == "/status.json":
		_ = json.NewEncoder(w).Encode(n.st)
	case r.URL.Path == "/v1/shards":
		_ = json.NewEncoder(w).Encode(n.shards)
	default:
		http.NotFound(w, r)
	}
}

func shard(id, node string, lease placement.LeaseState) status.ShardInfo {
	st := gossip.ShardReady
	if lease != placement.LeaseValid {
		st = gossip.ShardStarting
	}
	return status.ShardInfo{ShardID: id, ReplicaID: id, Deployment: "chat", Node: node, Lease: lease, Status: st}
}

func hostPort(t *testing.T, url string) string {
	t.Helper()
	hp, ok := strings.CutPrefix(url, "http://")
	if !ok {
		t.Fatalf("url %q", url)
	}
	return hp
}

// The whole upgrade: the new binary is checked, copied beside the
// installed one with its mode and renamed over it (the old file, which
// the running agent executes, stays intact under its inode), the service
// restarted, and the command returns only once the node answers as the
// new build, has settled and its shards are ready, saying each step.
func TestNodeUpgradeReplacesRestartsAndWaits(t *testing.T) {
	s, f, target := upgradeSetup(t)
	node := &fakeNode{st: agentState{Name: "n1", Version: "v1.0.0", StartedAt: time.Now().Add(-time.Hour), Settled: true},
		shards: []status.ShardInfo{shard("chat-0", "n1", placement.LeaseValid), shard("chat-1", "n2", placement.LeaseValid)}}
	ts := httptest.NewServer(node)
	t.Cleanup(ts.Close)
	// The API address comes from node.env, as install wrote it.
	installService(t, s, f, hostPort(t, ts.URL))
	f.restart = func() {
		node.mu.Lock()
		defer node.mu.Unlock()
		started := time.Now()
		node.down = true
		node.steps = []func(*fakeNode){
			func(n *fakeNode) {}, // still down
			func(n *fakeNode) {
				n.down, n.st = false, agentState{Name: "n1", Version: "v2.0.0", StartedAt: started}
				n.shards = []status.ShardInfo{shard("chat-0", "n1", status.LeaseNone), shard("chat-1", "n2", placement.LeaseValid)}
			},
			func(n *fakeNode) { n.st.Settled = true },
			func(n *fakeNode) {}, // settled, chat-0 not ready yet
			func(n *fakeNode) { n.shards[0] = shard("chat-0", "n1", placement.LeaseValid) },
		}
	}

	// The running agent's file: open, as the kernel holds it for the
	// process it executes.
	old, err := os.Open(target)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	oldContent, _ := io.ReadAll(old)
	oldInfo, _ := old.Stat()

	bin := filepath.Join(t.TempDir(), "llmgw-new")
	script(t, bin, "llmgw v2.0.0 (protocols 1-2)", 0o755)
	out, err := runService(t, s, "upgrade", "--binary", bin, "--timeout", "1m")
	if err != nil {
		t.Fatalf("upgrade: %v\n%s", err, out)
	}
	if got := f.ran(); !slices.Equal(got, []string{"systemctl restart llmgw"}) {
		t.Errorf("ran %q, want one restart", got)
	}
	newContent, _ := os.ReadFile(bin)
	if got, _ := os.ReadFile(target); string(got) != string(newContent) {
		t.Errorf("%s holds %q, want the new binary", target, got)
	}
	st, err := os.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o750 {
		t.Errorf("installed mode %v, want the old binary's 0750", st.Mode().Perm())
	}
	if os.SameFile(st, oldInfo) {
		t.Error("the installed binary was written in place, not replaced by rename")
	}
	if _, err := old.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if still, _ := io.ReadAll(old); string(still) != string(oldContent) {
		t.Errorf("the running agent's file changed to %q", still)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(target), ".*")); len(left) != 0 {
		t.Errorf("temp files left: %v", left)
	}
	// Each step said once, in order, the last one the verdict.
	for _, want := range []string{
		"n1 runs llmgw v1.0.0; installing llmgw v2.0.0 at " + target,
		"restarting llmgw",
		"waiting for n1's agent to answer at " + ts.URL,
		"n1 is back on llmgw v2.0.0, not settled yet",
		"n1 is back on llmgw v2.0.0 and settled; 0 of 1 shards ready (chat-0: starting, lease none)",
		"n1 is back on llmgw v2.0.0, settled, and its shard is ready",
	} {
		i := strings.Index(out, want)
		if i < 0 || strings.Count(out, want) != 1 {
			t.Errorf("output has %q %d times, want once:\n%s", want, strings.Count(out, want), out)
			continue
		}
		out = out[i+len(want):]
	}
	if strings.TrimSpace(out) != "" {
		t.Errorf("after the verdict: %q", out)
	}
}

// A binary that is missing, not executable, failing, or not llmgw is
// refused with exit status 2 naming --binary, and nothing changes: the
// installed file is the same file with the same content, nothing was
// restarted and no copy was left.
func TestNodeUpgradeRefusesABinaryThatDoesNotRun(t *testing.T) {
	s, f, target := upgradeSetup(t)
	installService(t, s, f, "127.0.0.1:1")
	dir := t.TempDir()
	notExec := filepath.Join(dir, "not-exec")
	script(t, notExec, "llmgw v2.0.0", 0o644)
	failing := filepath.Join(dir, "failing")
	if err := os.WriteFile(failing, []byte("#!/bin/sh\necho 'cannot execute binary file: Exec format error' >&2\nexit 126\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other")
	script(t, other, "hello from another program", 0o755)
	before, _ := os.Stat(target)
	for _, c := range []struct{ bin, says string }{
		{filepath.Join(dir, "missing"), "no such file"},
		{dir, "not a regular file"},
		{notExec, "not executable"},
		{failing, "Exec format error"},
		{other, "not an llmgw build"},
	} {
		out, err := runService(t, s, "upgrade", "--binary", c.bin)
		if exitStatus(err) != 2 || !strings.Contains(errText(err), "--binary "+c.bin) || !strings.Contains(errText(err), c.says) ||
			!strings.Contains(errText(err), "Nothing was changed") {
			t.Errorf("--binary %s: exit %d, %v; want 2, naming it and saying %q and that nothing changed\n%s", filepath.Base(c.bin), exitStatus(err), err, c.says, out)
		}
	}
	after, _ := os.Stat(target)
	if !os.SameFile(before, after) || after.ModTime() != before.ModTime() {
		t.Error("the installed binary was touched")
	}
	if got := f.ran(); len(got) != 0 {
		t.Errorf("ran %q", got)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(target), ".*")); len(left) != 0 {
		t.Errorf("temp files left: %v", left)
	}
}

// The installed binary is being executed: writing it in place fails
// (ETXTBSY, the reason for the rename), while the upgrade replaces it and
// the running process goes on from its old, now unlinked, file.
func TestNodeUpgradeReplacesARunningBinary(t *testing.T) {
	sleepBin, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	s, f, target := upgradeSetup(t)
	b, err := os.ReadFile(sleepBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target+".tmp", b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(target+".tmp", target); err != nil {
		t.Fatal(err)
	}
	running := exec.Command(target, "60")
	if err := running.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = running.Process.Kill(); _ = running.Wait() })
	testwait.Until(t, 5*time.Second, "the old binary runs", func() (bool, string) {
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", running.Process.Pid))
		return exe == target, fmt.Sprint(exe, err)
	})
	// The negative control: the file cannot be written in place.
	if err := os.WriteFile(target, []byte("x"), 0o755); !errors.Is(err, syscall.ETXTBSY) {
		t.Fatalf("writing a running binary in place: %v, want ETXTBSY", err)
	}

	// The node is back at once: this test is about the file.
	ts := httptest.NewServer(&fakeNode{st: agentState{Name: "n1", Version: "v2.0.0", StartedAt: time.Now().Add(time.Hour), Settled: true}})
	t.Cleanup(ts.Close)
	installService(t, s, f, hostPort(t, ts.URL))
	bin := filepath.Join(t.TempDir(), "llmgw-new")
	script(t, bin, "llmgw v2.0.0", 0o755)
	if out, err := runService(t, s, "upgrade", "--binary", bin); err != nil {
		t.Fatalf("upgrade: %v\n%s", err, out)
	}
	if got, _ := os.ReadFile(target); !strings.Contains(string(got), "v2.0.0") {
		t.Errorf("installed %q", got)
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", running.Process.Pid))
	if err != nil || exe != target+" (deleted)" {
		t.Errorf("the running process executes %q (%v), want its old file, unlinked", exe, err)
	}
}

// A node that does not come back ready within --timeout fails the upgrade
// (exit status 1) saying what it was still waiting for.
func TestNodeUpgradeTimesOut(t *testing.T) {
	s, f, _ := upgradeSetup(t)
	node := &fakeNode{st: agentState{Name: "n1", Version: "v1.0.0", Settled: true}}
	ts := httptest.NewServer(node)
	t.Cleanup(ts.Close)
	installService(t, s, f, hostPort(t, ts.URL))
	f.restart = func() {
		node.mu.Lock()
		defer node.mu.Unlock()
		node.st = agentState{Name: "n1", Version: "v2.0.0", StartedAt: time.Now()} // never settles
	}
	bin := filepath.Join(t.TempDir(), "llmgw-new")
	script(t, bin, "llmgw v2.0.0", 0o755)
	out, err := runService(t, s, "upgrade", "--binary", bin, "--timeout", "300ms")
	if exitStatus(err) != 1 || !strings.Contains(errText(err), "not back and ready within 300ms: n1 is back on llmgw v2.0.0, not settled yet") {
		t.Fatalf("err %v (exit %d); want exit 1 saying what it waited for\n%s", err, exitStatus(err), out)
	}
	if strings.Count(out, "not settled yet") != 1 {
		t.Errorf("the waiting line repeated although nothing changed:\n%s", out)
	}
}

// What the wait counts as done, one look at a time.
func TestUpgradeWaitsForTheNewAgentSettledAndReady(t *testing.T) {
	restart := time.Now()
	after := restart.Add(time.Second)
	back := agentState{Name: "n1", Version: "v2", StartedAt: after, Settled: true}
	for _, c := range []struct {
		name   string
		st     agentState
		shards []status.ShardInfo
		done   bool
		says   string
	}{
		{"the old build answers", agentState{Name: "n1", Version: "v1", StartedAt: after, Settled: true}, nil, false, "answers as llmgw v1, not yet v2"},
		{"an agent of the same build started before the restart", agentState{Name: "n1", Version: "v2", StartedAt: restart.Add(-time.Second), Settled: true}, nil, false, "before the restart"},
		{"not settled: its plan is from a partial view", agentState{Name: "n1", Version: "v2", StartedAt: after}, nil, false, "not settled yet"},
		{"settled, no shard for it", back, []status.ShardInfo{shard("chat-0", "n2", placement.LeaseValid)}, true, "the plan gives it no shard"},
		{"a shard starting", back, []status.ShardInfo{shard("chat-0", "n1", placement.LeaseValid), shard("chat-1", "n1", placement.LeaseStarting)}, false, "1 of 2 shards ready (chat-1: starting, lease starting)"},
		{"a lapsed lease", back, []status.ShardInfo{shard("chat-0", "n1", placement.LeaseLapsed)}, false, "0 of 1 shards ready"},
		{"all ready; copies on their way out wait for no one", back, []status.ShardInfo{
			shard("chat-0", "n1", placement.LeaseValid), shard("chat-1", "n1", placement.LeaseValid),
			func() status.ShardInfo {
				s := shard("chat-2", "n1", placement.LeaseLapsed)
				s.Reason = status.ReasonNotPlanned
				return s
			}(),
			func() status.ShardInfo {
				s := shard("chat-3", "n1", placement.LeaseStarting)
				s.Draining = true
				return s
			}(),
		}, true, "its 2 shards are ready"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts := httptest.NewServer(&fakeNode{st: c.st, shards: c.shards})
			defer ts.Close()
			done, line := backAndReady(context.Background(), ts.Client(), ts.URL, "n1", "v2", restart)
			if done != c.done || !strings.Contains(line, c.says) {
				t.Errorf("done %v %q; want %v saying %q", done, line, c.done, c.says)
			}
		})
	}
}

// Usage errors exit 2; a machine where llmgw is not a service exits 1,
// and neither changes anything.
func TestNodeUpgradeUsage(t *testing.T) {
	s, f, target := upgradeSetup(t)
	bin := filepath.Join(t.TempDir(), "llmgw-new")
	script(t, bin, "llmgw v2.0.0", 0o755)
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"upgrade"}, 2, `Required flag "binary" not set`},
		{[]string{"upgrade", "--binary", bin, "stray"}, 2, `unexpected argument "stray"`},
		{[]string{"upgrade", "--binary", bin, "--timeout", "0s"}, 2, "--timeout 0s: want a duration above 0"},
		{[]string{"upgrade", "--binary", bin, "--install-path", filepath.Join(filepath.Dir(target), "llmgw-typo")}, 2, "llmgw-typo: want the installed llmgw binary"},
		{[]string{"upgrade", "--binary", bin}, 1, "llmgw.service is not there: llmgw was not installed with llmgw node install; give --install-path"},
	} {
		out, err := runService(t, s, c.args...)
		if exitStatus(err) != c.code || !strings.Contains(errText(err), c.says) {
			t.Errorf("%q: exit %d, %v; want %d saying %q\n%s", c.args, exitStatus(err), err, c.code, c.says, out)
		}
	}
	if got, _ := os.ReadFile(target); !strings.Contains(string(got), "v1.0.0") || len(f.ran()) != 0 {
		t.Errorf("a refused upgrade changed %s or ran %q", target, f.ran())
	}
}

// Against a real node: node up runs in-process, and the fake systemctl's
// restart stops it and starts it again on the same data dir and ports, as
// systemd would. The upgrade returns once the restarted agent has settled
// and claimed its shard again: the wait reads the real API's fields.
func TestNodeUpgradeWaitsForARealNode(t *testing.T) {
	s, f, _ := upgradeSetup(t)
	dataDir := t.TempDir()
	args, _, api := nodeArgs(t, "n1", dataDir, "--runtime", "none")
	n := startNodeWith(t, args, api)
	if out, err := run(t, "place", "chat", "--model", "m/tiny", "--engine", "fake", "--wait=20s", "--addr", n.api, "--token-file", filepath.Join(dataDir, "token")); err != nil {
		t.Fatalf("place: %v\n%s", err, out)
	}
	installService(t, s, f, api)
	var restarted *testNode
	f.restart = func() {
		n.shutdown(t)
		restarted = startNodeWith(t, args, api)
	}
	bin := filepath.Join(t.TempDir(), "llmgw-new")
	script(t, bin, "llmgw "+version, 0o755)
	out, err := runService(t, s, "upgrade", "--binary", bin, "--timeout", "30s")
	if err != nil {
		t.Fatalf("upgrade: %v\n%s", err, out)
	}
	if restarted == nil || !strings.Contains(out, "n1 is back on llmgw "+version+", settled, and its shard is ready") {
		t.Fatalf("upgrade returned without the restart seen:\n%s", out)
	}
}

// startNodeWith runs `node up` with args until its API (host:port) answers,
// and stops it when the test ends.
func startNodeWith(t *testing.T, args []string, api string) *testNode {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	n := &testNode{api: "http://" + api, out: &testlog.Buffer{}, done: make(chan error, 1), stop: cancel}
	app := newApp()
	app.Writer, app.ErrWriter = n.out, n.out
	go func() { n.done <- app.Run(ctx, append([]string{"llmgw"}, args...)) }()
	t.Cleanup(func() { n.shutdown(t) })
	testwait.Until(t, 15*time.Second, "the node answers /healthz", func() (bool, string) {
		select {
		case err := <-n.done:
			n.done <- err
			t.Fatalf("node up exited during start: %v\n%s", err, n.out)
		default:
		}
		resp, err := http.Get(n.api + "/healthz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return n
}

// node up on a data dir an llmgw of a newer protocol wrote refuses to
// start (exit status 1) naming the file, its protocol and the fix, and
// writes nothing there: no token, no gossip key, node.json as it was.
func TestNodeUpRefusesADataDirOfANewerProtocol(t *testing.T) {
	dataDir := t.TempDir()
	d := datadir.New(dataDir)
	above := protocol.Max + 1
	node := fmt.Sprintf(`{"protocol":%d,"name":"n1","epoch":5,"layout":"of the future"}`, above)
	if err := os.WriteFile(d.NodeFile(), []byte(node), 0o600); err != nil {
		t.Fatal(err)
	}
	args, _, _ := nodeArgs(t, "n1", dataDir, "--runtime", "process")
	_, err := run(t, args...)
	want := fmt.Sprintf("node.json (protocol %d); this llmgw speaks protocols %d to %d. Install an llmgw that speaks protocol %d or later", above, protocol.Min, protocol.Max, above)
	if exitStatus(err) != 1 || !strings.Contains(errText(err), want) {
		t.Fatalf("node up: exit %d, %v; want 1 saying %q", exitStatus(err), err, want)
	}
	entries, _ := os.ReadDir(dataDir)
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("the data dir holds %v, want node.json only", names)
	}
	if b, _ := os.ReadFile(d.NodeFile()); string(b) != node {
		t.Errorf("node.json changed to %s", b)
	}
}
