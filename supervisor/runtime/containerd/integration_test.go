package containerd

// Tests against a real containerd. They skip, saying why, when no daemon
// answers on $LLMGW_TEST_CONTAINERD_SOCKET (default /run/containerd/
// containerd.sock); `eval "$(.ci/containerd.sh start)"` provides one. They
// need root, as containerd does.
//
// The image is built here, without docker: a static build of the fake
// engine in a one-layer docker archive (see ctrtest). cmd/llmgw is used when
// it builds without cgo and has `engine fake`; otherwise testdata/fakeimg,
// which takes the same arguments. $LLMGW_TEST_FAKE_PKG forces a package.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/profile"
	"github.com/llmgw/llmgw/supervisor/runtime"
	"github.com/llmgw/llmgw/supervisor/runtime/containerd/ctrtest"
	"github.com/llmgw/llmgw/supervisor/runtime/runtimetest"

	"go.uber.org/goleak"
)

const (
	testNamespace = "llmgw-test"
	testImageRef  = "llmgw/fake:test"
	testImageName = "docker.io/llmgw/fake:test"
)

func testSocket() string {
	if s := os.Getenv("LLMGW_TEST_CONTAINERD_SOCKET"); s != "" {
		return s
	}
	return DefaultSocket
}

// daemonRuntime connects to the test daemon or skips.
func daemonRuntime(tb testing.TB) *Runtime {
	tb.Helper()
	sock := testSocket()
	r, err := New(WithSocket(sock), WithNamespace(testNamespace), WithShmSize(64<<20))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := r.Ping(ctx); err != nil {
		tb.Skipf("no containerd answers at %s (set LLMGW_TEST_CONTAINERD_SOCKET, or run `eval \"$(.ci/containerd.sh start)\"` as root): %v", sock, err)
	}
	return r
}

// fakeImageDir holds the image build of this test process; TestMain
// removes it.
func fakeImageDir() string {
	return filepath.Join(os.TempDir(), "llmgw-fakeimg-"+strconv.Itoa(os.Getpid()))
}

func TestMain(m *testing.M) {
	// The containerd client's connections close with the runtime.
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		_ = os.RemoveAll(fakeImageDir())
		os.Exit(code)
	}))
}

// The image tar is built once per test binary; building it is the slow part.
var fakeImageTar = sync.OnceValues(func() (string, error) {
	dir := fakeImageDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "llmgw")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := buildFakeEngine(ctx, root, bin); err != nil {
		return "", err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	tarPath := filepath.Join(dir, "fake.tar")
	var buf bytes.Buffer
	if err := ctrtest.WriteDockerArchive(&buf, ctrtest.Image{
		RepoTag:    testImageRef,
		Entrypoint: []string{"/llmgw"},
		Files:      []ctrtest.File{{Path: "/llmgw", Mode: 0o755, Data: data}},
	}); err != nil {
		return "", err
	}
	return tarPath, os.WriteFile(tarPath, buf.Bytes(), 0o644)
})

func buildFakeEngine(ctx context.Context, root, bin string) error {
	if pkg := os.Getenv("LLMGW_TEST_FAKE_PKG"); pkg != "" {
		return ctrtest.BuildStatic(ctx, root, pkg, bin)
	}
	if err := ctrtest.BuildStatic(ctx, root, "./cmd/llmgw", bin); err == nil {
		out, _ := exec.CommandContext(ctx, bin, "engine", "fake", "--help").CombinedOutput()
		if strings.Contains(string(out), "crash-after") && strings.Contains(string(out), "host") {
			fmt.Fprintln(os.Stderr, "fake engine image: cmd/llmgw")
			return nil
		}
	}
	fmt.Fprintln(os.Stderr, "fake engine image: testdata/fakeimg (cmd/llmgw has no `engine fake` with --host or does not build without cgo)")
	return ctrtest.BuildStatic(ctx, root, "./supervisor/runtime/containerd/testdata/fakeimg", bin)
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the test's directory")
		}
		dir = parent
	}
}

func importFakeImage(tb testing.TB, r *Runtime) {
	tb.Helper()
	tarPath, err := fakeImageTar()
	if err != nil {
		tb.Fatal(err)
	}
	f, err := os.Open(tarPath)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	names, err := r.ImportImage(context.Background(), f)
	if err != nil {
		tb.Fatal(err)
	}
	if !slices.Contains(names, testImageName) {
		tb.Fatalf("imported %v, want %s", names, testImageName)
	}
}

// cleanNamespace removes every container the test namespace holds, so a
// failed run leaves nothing behind for the next.
func cleanNamespace(tb testing.TB, r *Runtime) {
	tb.Cleanup(func() {
		ctx := r.nsCtx(context.Background())
		ctrs, _ := r.c.Containers(ctx)
		for _, c := range ctrs {
			if err := r.remove(ctx, c, 0); err != nil {
				tb.Logf("cleanup %s: %v", c.ID(), err)
			}
		}
	})
}

func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// ready is llmgw's readiness rule: /health answers 200 and /v1/models lists
// the served name.
func ready(hc *http.Client, port int, name string) bool {
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	resp, err := hc.Get(base + "/health")
	if err != nil {
		return false
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return false
	}
	resp, err = hc.Get(base + "/v1/models")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&list) != nil {
		return false
	}
	return slices.ContainsFunc(list.Data, func(m struct {
		ID string `json:"id"`
	}) bool {
		return m.ID == name
	})
}

func waitReady(tb testing.TB, port int, name string, poll time.Duration) {
	tb.Helper()
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for !ready(hc, port, name) {
		if time.Now().After(deadline) {
			tb.Fatalf("engine %s on port %d not ready within 30s", name, port)
		}
		time.Sleep(poll)
	}
}

func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	testwait.Until(tb, 30*time.Second, what, func() (bool, string) { return cond(), "" })
}

// fakeSpec resolves the fake profile the way the supervisor will.
func fakeSpec(tb testing.TB, name string, port int, extra ...string) runtime.EngineSpec {
	tb.Helper()
	p, err := profile.Lookup("fake")
	if err != nil {
		tb.Fatal(err)
	}
	d := placement.Deployment{Name: name, Model: "fake-model", Engine: "fake", Image: testImageRef, Args: extra}
	cmd, env, image, err := profile.Resolve(p, d, profile.Inputs{Port: port, Host: "127.0.0.1", Self: "/llmgw"})
	if err != nil {
		tb.Fatal(err)
	}
	ver := d.SpecVersion()
	return runtime.EngineSpec{
		ID: name + "-0-" + ver, Node: "n1", ShardID: name + "-0", ReplicaID: name + "-0",
		Deployment: name, SpecVersion: ver, Image: image, Command: cmd, Env: env,
		HTTPPort: port, LogPath: filepath.Join(tb.TempDir(), name+".log"),
	}
}

func procStartTicks(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

func TestIntegrationConformance(t *testing.T) {
	r := daemonRuntime(t)
	cleanNamespace(t, r)
	importFakeImage(t, r)
	runtimetest.Run(t, runtimetest.Harness{
		New: func(t *testing.T) runtime.Runtime { return daemonRuntime(t) },
		Spec: func(t *testing.T, id string, exitCode int) runtime.EngineSpec {
			var extra []string
			if exitCode >= 0 {
				extra = []string{"--crash-after=1ms", "--exit-code=" + strconv.Itoa(exitCode)}
			}
			spec := fakeSpec(t, "conf", freePort(t), extra...)
			spec.ID = id
			return spec
		},
	})
}

// lockedBuffer collects log output from the pull's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestIntegrationEnsureImagePulls pulls from a registry served by the test
// (no registry is reachable from CI), slowed down so progress is logged.
func TestIntegrationEnsureImagePulls(t *testing.T) {
	daemonRuntime(t) // skips without a daemon
	logs := &lockedBuffer{}
	r, err := New(WithSocket(testSocket()), WithNamespace(testNamespace),
		WithLogger(slog.New(slog.NewTextHandler(logs, nil))), WithProgressInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Unique per run: a layer already in the content store is not fetched.
	payload := make([]byte, 3<<20)
	seed := time.Now().UnixNano()
	for i := range payload {
		payload[i] = byte(int64(i*7+i>>8) ^ seed>>(i%56))
	}
	reg, err := ctrtest.NewRegistry("llmgw/pulltest", "1", ctrtest.Image{
		Entrypoint: []string{"/bin/none"},
		Files:      []ctrtest.File{{Path: "/data/blob", Data: payload}},
	})
	if err != nil {
		t.Fatal(err)
	}
	reg.ChunkDelay = 5 * time.Millisecond
	srv := httptest.NewServer(reg)
	defer srv.Close()
	ref := reg.Ref(strings.TrimPrefix(srv.URL, "http://"))
	ctx := r.nsCtx(context.Background())
	t.Cleanup(func() { _ = r.c.ImageService().Delete(ctx, ref, images.SynchronousDelete()) })

	if err := r.EnsureImage(context.Background(), ref, nil); err != nil {
		t.Fatal(err)
	}
	img, err := r.c.GetImage(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := img.IsUnpacked(ctx, r.snapshotter); err != nil || !ok {
		t.Fatalf("pulled image not unpacked: %v %v", ok, err)
	}
	// Present now: no second pull.
	if err := r.EnsureImage(context.Background(), ref, nil); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if n := strings.Count(out, `msg="pulled image"`); n != 1 {
		t.Errorf("%d completed pulls logged, want 1:\n%s", n, out)
	}
	// The client hands the daemon 1 MiB at a time: progress must show bytes
	// of the layer in flight, not only finished blobs.
	if !strings.Contains(out, `have="1.0 MiB"`) && !strings.Contains(out, `have="2.0 MiB"`) {
		t.Errorf("no progress line with the layer in flight:\n%s", out)
	}
	t.Logf("pull log:\n%s", out)
}

// procLimit is the soft limit named in /proc/<pid>/limits.
func procLimit(pid int, name string) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok {
			f := strings.Fields(rest)
			if len(f) > 0 && f[0] == "unlimited" {
				return ^uint64(0)
			}
			if len(f) > 0 {
				n, _ := strconv.ParseUint(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

func TestIntegrationLifecycleAndReattach(t *testing.T) {
	r := daemonRuntime(t)
	cleanNamespace(t, r)
	importFakeImage(t, r)
	ctx := context.Background()
	if err := r.EnsureImage(ctx, testImageRef, nil); err != nil {
		t.Fatalf("EnsureImage of a present image: %v", err)
	}

	port := freePort(t)
	spec := fakeSpec(t, "itest", port)
	// Not there yet: Start makes it (an empty cache the engine fills).
	spec.WeightsDir = filepath.Join(t.TempDir(), "weights")
	e, err := r.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if e.State != runtime.StateRunning || e.PID <= 0 || e.ID != spec.ID {
		t.Fatalf("started %+v", e)
	}
	if cid, _ := ContainerID(spec.ID); e.ContainerID != cid {
		t.Errorf("started container %q, want %q", e.ContainerID, cid)
	}
	for k, v := range map[string]string{runtime.LabelNode: "n1", runtime.LabelShard: "itest-0", runtime.LabelSpec: spec.SpecVersion, runtime.LabelEngine: spec.ID} {
		if e.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, e.Labels[k], v)
		}
	}
	waitReady(t, port, "itest", 20*time.Millisecond)
	if _, err := r.Start(ctx, spec); err == nil {
		t.Fatal("starting a running engine again succeeded")
	}
	ticks := procStartTicks(e.PID)
	// The engine runs with llmgw's limits, not containerd's default 1024
	// open files (cut to the daemon's own where it cannot raise them).
	want := probeDaemonLimits(testSocket()).rlimits()
	if got := procLimit(e.PID, "Max open files"); got != want[1].Soft {
		t.Errorf("engine's open-file limit %d, want %d", got, want[1].Soft)
	}

	// The agent restarts: a new client finds the same task, untouched.
	r2 := daemonRuntime(t)
	got, err := r2.Status(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != runtime.StateRunning || got.PID != e.PID || !got.StartedAt.Equal(e.StartedAt) {
		t.Fatalf("after reattach %+v, want running pid %d", got, e.PID)
	}
	if now := procStartTicks(e.PID); now == "" || now != ticks {
		t.Fatalf("engine process changed across reattach: start ticks %q then %q", ticks, now)
	}
	list, err := r2.List(ctx, "n1")
	if err != nil || len(list) != 1 || list[0].ID != spec.ID || list[0].PID != e.PID {
		t.Fatalf("List(n1) = %+v, %v", list, err)
	}
	if other, err := r2.List(ctx, "n2"); err != nil || len(other) != 0 {
		t.Fatalf("List(n2) = %+v, %v", other, err)
	}
	waitReady(t, port, "itest", 20*time.Millisecond)

	// The shim wrote the engine's output.
	eventually(t, "engine output in the log file", func() bool {
		b, _ := os.ReadFile(spec.LogPath)
		return strings.Contains(string(b), `fake engine serving model "itest"`)
	})

	t0 := time.Now()
	if err := r2.Stop(ctx, spec.ID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop took %s", time.Since(t0))
	if time.Since(t0) > 5*time.Second {
		t.Errorf("Stop took %s: SIGTERM did not reach the engine", time.Since(t0))
	}
	if _, err := r2.Status(ctx, spec.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Status after Stop = %v, want ErrNotFound", err)
	}
	if _, err := r.c.SnapshotService(r.snapshotter).Stat(r.nsCtx(ctx), spec.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("snapshot left after Stop: %v", err)
	}
	if hc := (&http.Client{Timeout: time.Second}); ready(hc, port, "itest") {
		t.Fatal("engine still answers after Stop")
	}
	if err := r2.Stop(ctx, spec.ID, time.Second); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("second Stop = %v, want ErrNotFound", err)
	}
}

func TestIntegrationCrashIsReportedAndReplaced(t *testing.T) {
	r := daemonRuntime(t)
	cleanNamespace(t, r)
	importFakeImage(t, r)
	ctx := context.Background()
	spec := fakeSpec(t, "crashy", freePort(t), "--crash-after=300ms", "--exit-code=3")
	if _, err := r.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	var e runtime.Engine
	eventually(t, "the scripted crash", func() bool {
		var err error
		e, err = r.Status(ctx, spec.ID)
		return err == nil && e.State == runtime.StateExited
	})
	if e.ExitCode != 3 || e.PID != 0 || e.ExitedAt.IsZero() {
		t.Fatalf("crashed engine %+v, want exit code 3", e)
	}
	// Start replaces an exited engine of the same ID.
	e2, err := r.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if e2.State != runtime.StateRunning && e2.State != runtime.StateExited {
		t.Fatalf("restarted engine %+v", e2)
	}
	if err := r.Stop(ctx, spec.ID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestIntegrationOrphanIsListedAndStopped: a container labelled as ours that
// no state file knows (an earlier agent's) is found by List and removed by
// Stop.
func TestIntegrationOrphanIsListedAndStopped(t *testing.T) {
	r := daemonRuntime(t)
	cleanNamespace(t, r)
	importFakeImage(t, r)
	ctx := r.nsCtx(context.Background())
	img, err := r.c.GetImage(ctx, testImageName)
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	const id = "orphan-0-old"
	ctr, err := r.c.NewContainer(ctx, id,
		client.WithImage(img),
		client.WithSnapshotter(r.snapshotter),
		client.WithNewSnapshot(id, img),
		client.WithContainerLabels(map[string]string{runtime.LabelNode: "n1", runtime.LabelShard: "orphan-0"}),
		client.WithNewSpec(oci.WithImageConfig(img),
			oci.WithProcessArgs("/llmgw", "engine", "fake", "--model", "orphan", "--host", "127.0.0.1", "--port", strconv.Itoa(port)),
			oci.WithHostNamespace(specs.NetworkNamespace)),
	)
	if err != nil {
		t.Fatal(err)
	}
	task, err := ctr.NewTask(ctx, cio.LogFile(filepath.Join(t.TempDir(), "orphan.log")))
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitReady(t, port, "orphan", 20*time.Millisecond)

	list, err := r.List(context.Background(), "n1")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != id || list[0].State != runtime.StateRunning || list[0].Labels[runtime.LabelShard] != "orphan-0" {
		t.Fatalf("List = %+v, want the orphan running", list)
	}
	if err := r.Stop(context.Background(), id, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := r.c.LoadContainer(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("orphan container still exists: %v", err)
	}
}

// BenchmarkStartToReady times Start until ready through the runtime against
// the same containerd calls made directly, as `ctr run --net-host` makes
// them, with the same image, daemon and readiness poll.
func BenchmarkStartToReady(b *testing.B) {
	r := daemonRuntime(b)
	cleanNamespace(b, r)
	importFakeImage(b, r)
	ctx := context.Background()
	nctx := r.nsCtx(ctx)
	const poll = 2 * time.Millisecond
	var viaRuntime, direct time.Duration
	for i := 0; i < b.N; i++ {
		port := freePort(b)
		spec := fakeSpec(b, "bench", port)
		t0 := time.Now()
		if _, err := r.Start(ctx, spec); err != nil {
			b.Fatal(err)
		}
		waitReady(b, port, "bench", poll)
		viaRuntime += time.Since(t0)
		if err := r.Stop(ctx, spec.ID, 5*time.Second); err != nil {
			b.Fatal(err)
		}

		port = freePort(b)
		spec = fakeSpec(b, "direct", port)
		t0 = time.Now()
		img, err := r.c.GetImage(nctx, testImageName)
		if err != nil {
			b.Fatal(err)
		}
		ctr, err := r.c.NewContainer(nctx, spec.ID,
			client.WithImage(img),
			client.WithSnapshotter(r.snapshotter),
			client.WithNewSnapshot(spec.ID, img),
			client.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs(spec.Command...),
				oci.WithHostNamespace(specs.NetworkNamespace), oci.WithHostHostsFile, oci.WithHostResolvconf),
		)
		if err != nil {
			b.Fatal(err)
		}
		task, err := ctr.NewTask(nctx, cio.LogFile(spec.LogPath))
		if err != nil {
			b.Fatal(err)
		}
		if err := task.Start(nctx); err != nil {
			b.Fatal(err)
		}
		waitReady(b, port, "direct", poll)
		direct += time.Since(t0)
		exited, _ := task.Wait(nctx)
		_ = task.Kill(nctx, syscall.SIGKILL)
		<-exited
		_, _ = task.Delete(nctx)
		if err := ctr.Delete(nctx, client.WithSnapshotCleanup); err != nil {
			b.Fatal(err)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(viaRuntime.Milliseconds())/n, "runtime-ms/op")
	b.ReportMetric(float64(direct.Milliseconds())/n, "direct-ms/op")
	b.ReportMetric(float64(viaRuntime)/float64(direct), "ratio")
}

// TestIntegrationCancelledStartLeavesNoHalfEngine cancels Start at every
// point of its run: whatever the moment, Start either reports a running
// engine or fails having created nothing, and the next Start of the same
// engine succeeds (a half-made one used to fail it with "already runs").
func TestIntegrationCancelledStartLeavesNoHalfEngine(t *testing.T) {
	r := daemonRuntime(t)
	cleanNamespace(t, r)
	importFakeImage(t, r)
	spec := fakeSpec(t, "cancel", freePort(t))
	for d := time.Duration(0); d <= 150*time.Millisecond; d += 10 * time.Millisecond {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		e, err := r.Start(ctx, spec)
		cancel()
		st, serr := r.Status(context.Background(), spec.ID)
		switch {
		case err == nil && (e.State != runtime.StateRunning || serr != nil || st.State != runtime.StateRunning):
			t.Fatalf("cancel after %s: Start said %+v, Status says %+v, %v", d, e, st, serr)
		case err != nil && !errors.Is(serr, runtime.ErrNotFound):
			t.Fatalf("cancel after %s: Start failed (%v) but left %+v, %v", d, err, st, serr)
		}
		if err != nil {
			// Nothing was made, so a Start that is let finish succeeds.
			if _, err := r.Start(context.Background(), spec); err != nil {
				t.Fatalf("after a Start cancelled at %s, the next Start failed: %v", d, err)
			}
		}
		if err := r.Stop(context.Background(), spec.ID, 0); err != nil {
			t.Fatal(err)
		}
	}
}
