package process

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/runtime"
	"github.com/llmgw/llmgw/supervisor/runtime/runtimetest"

	"go.uber.org/goleak"
)

// The test binary doubles as the engine: with helperEnv set, TestMain runs
// the named behaviour instead of the tests.
const helperEnv = "LLMGW_PROCESS_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		helper(mode)
		return
	}
	// Reapers end with their engines: every test stops what it started.
	goleak.VerifyTestMain(m)
}

func helper(mode string) {
	if code, ok := strings.CutPrefix(mode, "exit:"); ok {
		n, _ := strconv.Atoi(code)
		os.Exit(n)
	}
	switch mode {
	case "sleep":
		fmt.Println("hello stdout")
		fmt.Fprintln(os.Stderr, "hello stderr")
		block()
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ready")
		block()
	case "exit7":
		os.Exit(7)
	case "tree":
		// A worker in the same process group, as vLLM forks per GPU.
		c := exec.Command(os.Args[0])
		c.Env = append(os.Environ(), helperEnv+"=sleep")
		if err := c.Start(); err != nil {
			fmt.Println("start worker:", err)
			os.Exit(1)
		}
		fmt.Printf("worker %d\n", c.Process.Pid)
		block()
	case "env":
		fmt.Printf("CUDA_VISIBLE_DEVICES=%q\n", os.Getenv("CUDA_VISIBLE_DEVICES"))
		fmt.Printf("CUDA_DEVICE_ORDER=%q\n", os.Getenv("CUDA_DEVICE_ORDER"))
		fmt.Printf("EXTRA=%q\n", os.Getenv("EXTRA"))
		fmt.Println("done")
		block()
	}
}

func helperSpec(t *testing.T, id, mode string) runtime.EngineSpec {
	t.Helper()
	return runtime.EngineSpec{
		ID: id, Node: "n1", ShardID: "demo-0", ReplicaID: "demo-0", Deployment: "demo", SpecVersion: "v1",
		Command: []string{os.Args[0]},
		Env:     []string{helperEnv + "=" + mode},
		LogPath: filepath.Join(t.TempDir(), "logs", id+".log"),
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, 15*time.Second, what, func() (bool, string) { return cond(), "" })
}

func logHas(path, s string) func() bool {
	return func() bool {
		b, _ := os.ReadFile(path)
		return strings.Contains(string(b), s)
	}
}

// gone reports whether pid no longer runs (absent or a zombie).
func gone(pid int) bool {
	st, err := readStat("/proc", pid)
	return err != nil || st.dead()
}

func newRuntime(t *testing.T, dir string) *Runtime {
	t.Helper()
	r, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// stopAll keeps a failing test from leaking engines.
func stopAll(t *testing.T, r *Runtime) {
	t.Cleanup(func() {
		es, _ := r.List(context.Background(), "")
		for _, e := range es {
			_ = r.Stop(context.Background(), e.ID, 0)
		}
	})
}

func TestEngineOutlivesRuntimeAndIsFoundAgain(t *testing.T) {
	dir := t.TempDir()
	r1 := newRuntime(t, dir)
	stopAll(t, r1)
	spec := helperSpec(t, "demo-0-v1", "sleep")

	ctx, cancel := context.WithCancel(context.Background())
	e, err := r1.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	// The engine is not tied to the caller's context.
	cancel()
	if e.State != runtime.StateRunning || e.PID <= 0 {
		t.Fatalf("started engine %+v", e)
	}
	if e.ContainerID != "" {
		t.Errorf("a process engine reports container %q", e.ContainerID)
	}
	if e.Labels[runtime.LabelNode] != "n1" || e.Labels[runtime.LabelShard] != "demo-0" || e.Labels[runtime.LabelSpec] != "v1" || e.Labels[runtime.LabelEngine] != "demo-0-v1" {
		t.Fatalf("labels %v", e.Labels)
	}
	// The child writes its own log.
	eventually(t, "stdout in log", logHas(spec.LogPath, "hello stdout"))
	eventually(t, "stderr in log", logHas(spec.LogPath, "hello stderr"))
	if _, err := r1.Start(context.Background(), spec); err == nil {
		t.Fatal("starting a running ID again succeeded")
	}

	// A new agent process: a new Runtime on the same directory.
	r2 := newRuntime(t, dir)
	got, err := r2.Status(context.Background(), spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != runtime.StateRunning || got.PID != e.PID || !got.StartedAt.Equal(e.StartedAt) {
		t.Fatalf("after restart %+v, want running pid %d", got, e.PID)
	}
	list, err := r2.List(context.Background(), "n1")
	if err != nil || len(list) != 1 || list[0].PID != e.PID {
		t.Fatalf("List(n1) = %+v, %v", list, err)
	}
	if other, _ := r2.List(context.Background(), "n2"); len(other) != 0 {
		t.Fatalf("List(n2) = %+v", other)
	}

	if err := r2.Stop(context.Background(), spec.ID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if !gone(e.PID) {
		t.Fatalf("pid %d still runs after Stop", e.PID)
	}
	for _, r := range []*Runtime{r1, r2} {
		if _, err := r.Status(context.Background(), spec.ID); !errors.Is(err, runtime.ErrNotFound) {
			t.Fatalf("Status after Stop = %v, want ErrNotFound", err)
		}
	}
	if err := r2.Stop(context.Background(), spec.ID, time.Second); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("second Stop = %v, want ErrNotFound", err)
	}
}

func TestStopKillsTheWholeGroup(t *testing.T) {
	r := newRuntime(t, t.TempDir())
	stopAll(t, r)
	spec := helperSpec(t, "tree-0-v1", "tree")
	e, err := r.Start(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "worker pid in log", logHas(spec.LogPath, "worker "))
	b, _ := os.ReadFile(spec.LogPath)
	_, after, _ := strings.Cut(string(b), "worker ")
	worker, err := strconv.Atoi(strings.Fields(after)[0])
	if err != nil {
		t.Fatal(err)
	}
	if gone(worker) {
		t.Fatal("worker not running before Stop")
	}
	if err := r.Stop(context.Background(), spec.ID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if !gone(e.PID) || !gone(worker) {
		t.Fatalf("after Stop: engine gone %v, worker gone %v", gone(e.PID), gone(worker))
	}
}

// TestStopEscalatesToSIGKILL: an engine that ignores SIGTERM is killed once
// the grace period is over.
func TestStopEscalatesToSIGKILL(t *testing.T) {
	r := newRuntime(t, t.TempDir())
	stopAll(t, r)
	spec := helperSpec(t, "stubborn-0-v1", "ignore-term")
	e, err := r.Start(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "helper ignoring SIGTERM", logHas(spec.LogPath, "ready"))
	grace := 300 * time.Millisecond
	t0 := time.Now()
	if err := r.Stop(context.Background(), spec.ID, grace); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(t0); el < grace {
		t.Fatalf("Stop returned after %s, before the grace period", el)
	}
	if !gone(e.PID) {
		t.Fatal("engine survived Stop")
	}
}

// The injected clock stamps the start and times Stop's waits: a grace
// period of an hour on a fake clock ends when the clock is moved, not
// after an hour.
func TestStopWaitsOnTheInjectedClock(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := clock.NewFake(at)
	r, err := New(t.TempDir(), WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	stopAll(t, r)
	spec := helperSpec(t, "stubborn-0-v1", "ignore-term")
	e, err := r.Start(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	// Should the test fail halfway, stopAll's Stop would wait on a clock
	// no one moves: the group goes first.
	t.Cleanup(func() { _ = syscall.Kill(-e.PID, syscall.SIGKILL) })
	if !e.StartedAt.Equal(at) {
		t.Errorf("started at %v, want the injected clock's %v", e.StartedAt, at)
	}
	eventually(t, "helper ignoring SIGTERM", logHas(spec.LogPath, "ready"))
	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop(context.Background(), spec.ID, time.Hour) }()
	// The grace period's timer and the poll's ticker wait on the clock.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clk.BlockUntilContext(ctx, 2); err != nil {
		t.Fatalf("Stop's waits are not on the injected clock: %v", err)
	}
	if gone(e.PID) {
		t.Fatal("killed before the grace period was over")
	}
	clk.Advance(time.Hour)
	// SIGKILL now; each poll for the group to be gone is a tick.
	testwait.Until(t, 10*time.Second, "Stop returns once the engine is killed", func() (bool, string) {
		select {
		case err := <-stopped:
			if err != nil {
				t.Fatal(err)
			}
			return true, ""
		default:
			clk.Advance(r.poll)
			return false, "still stopping"
		}
	})
	if !gone(e.PID) {
		t.Fatal("engine survived Stop")
	}
}

func TestExitCodeIsKeptAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	r1 := newRuntime(t, dir)
	stopAll(t, r1)
	spec := helperSpec(t, "crash-0-v1", "exit7")
	if _, err := r1.Start(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	var e runtime.Engine
	eventually(t, "exit", func() bool {
		e, _ = r1.Status(context.Background(), spec.ID)
		return e.State == runtime.StateExited
	})
	if e.ExitCode != 7 || e.PID != 0 || e.ExitedAt.IsZero() {
		t.Fatalf("exited engine %+v, want code 7", e)
	}
	// The reaper persisted the code for a later agent.
	eventually(t, "persisted exit", func() bool {
		rec, err := r1.readRecord(spec.ID)
		return err == nil && rec.Exited
	})
	r2 := newRuntime(t, dir)
	e2, err := r2.Status(context.Background(), spec.ID)
	if err != nil || e2.State != runtime.StateExited || e2.ExitCode != 7 {
		t.Fatalf("after restart %+v, %v", e2, err)
	}
	// An exited engine is replaced by Start.
	spec.Env = []string{helperEnv + "=sleep"}
	e3, err := r2.Start(context.Background(), spec)
	if err != nil || e3.State != runtime.StateRunning {
		t.Fatalf("restart in place: %+v, %v", e3, err)
	}
	if err := r2.Stop(context.Background(), spec.ID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestPIDReuseGuard: a record whose pid now belongs to another process (the
// start time differs) reports the engine exited, and Stop leaves the
// stranger alone.
func TestPIDReuseGuard(t *testing.T) {
	dir := t.TempDir()
	r := newRuntime(t, dir)
	stranger := exec.Command(os.Args[0])
	stranger.Env = append(os.Environ(), helperEnv+"=sleep")
	stranger.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stranger.Process.Kill(); _ = stranger.Wait() })
	st, err := readStat("/proc", stranger.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	rec := record{
		ID: "old-0-v1", PID: stranger.Process.Pid, PGID: stranger.Process.Pid,
		StartTicks: st.startTime - 1, BootID: r.boot,
		Labels: map[string]string{runtime.LabelNode: "n1"}, StartedAt: time.Unix(1, 0),
	}
	if err := r.writeRecord(rec); err != nil {
		t.Fatal(err)
	}
	e, err := r.Status(context.Background(), rec.ID)
	if err != nil || e.State != runtime.StateExited || e.ExitCode != -1 || e.PID != 0 {
		t.Fatalf("recycled pid: %+v, %v; want exited with code -1", e, err)
	}
	if err := r.Stop(context.Background(), rec.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	if gone(stranger.Process.Pid) {
		t.Fatal("Stop killed a process that only shares the pid")
	}
	if _, err := r.Status(context.Background(), rec.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("record not removed: %v", err)
	}

	// A record from another boot is dead whatever the pid.
	rec.StartTicks, rec.BootID, rec.ID = st.startTime, "another-boot", "boot-0-v1"
	if err := r.writeRecord(rec); err != nil {
		t.Fatal(err)
	}
	if e, _ := r.Status(context.Background(), rec.ID); e.State != runtime.StateExited {
		t.Fatalf("record of another boot: %+v", e)
	}
	// The same record on this boot is the stranger itself.
	rec.BootID, rec.ID = r.boot, "same-0-v1"
	if err := r.writeRecord(rec); err != nil {
		t.Fatal(err)
	}
	if e, _ := r.Status(context.Background(), rec.ID); e.State != runtime.StateRunning || e.PID != stranger.Process.Pid {
		t.Fatalf("matching record: %+v", e)
	}
}

func TestGPUEnvironment(t *testing.T) {
	r, err := New(t.TempDir(), WithBaseEnv([]string{"PATH=/usr/bin:/bin", "EXTRA=base"}))
	if err != nil {
		t.Fatal(err)
	}
	stopAll(t, r)
	spec := helperSpec(t, "gpu-0-v1", "env")
	spec.GPUIndices = []int{0, 2}
	spec.Env = append(spec.Env, "EXTRA=spec")
	if _, err := r.Start(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	eventually(t, "env printed", logHas(spec.LogPath, "done"))
	b, _ := os.ReadFile(spec.LogPath)
	for _, want := range []string{`CUDA_VISIBLE_DEVICES="0,2"`, `CUDA_DEVICE_ORDER="PCI_BUS_ID"`, `EXTRA="spec"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("log lacks %s:\n%s", want, b)
		}
	}
}

func TestDefaultEnvDropsAgentSecrets(t *testing.T) {
	got := defaultEnv([]string{"PATH=/bin", "LLMGW_TOKEN=secret", "NOTIFY_SOCKET=/run/x", "HF_TOKEN=keep"})
	if strings.Join(got, " ") != "PATH=/bin HF_TOKEN=keep" {
		t.Fatalf("defaultEnv = %v", got)
	}
}

func TestStartRejectsBadSpecs(t *testing.T) {
	r := newRuntime(t, t.TempDir())
	good := helperSpec(t, "ok-0-v1", "sleep")
	for name, mutate := range map[string]func(*runtime.EngineSpec){
		"id with slash":   func(s *runtime.EngineSpec) { s.ID = "a/b" },
		"id with dots":    func(s *runtime.EngineSpec) { s.ID = "a..b" },
		"empty command":   func(s *runtime.EngineSpec) { s.Command = nil },
		"relative log":    func(s *runtime.EngineSpec) { s.LogPath = "x.log" },
		"missing program": func(s *runtime.EngineSpec) { s.Command = []string{"/nonexistent/engine"} },
	} {
		s := good
		mutate(&s)
		if _, err := r.Start(context.Background(), s); err == nil {
			t.Errorf("%s: Start succeeded", name)
		}
	}
	if _, err := r.Status(context.Background(), "../x"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Status(../x) = %v", err)
	}
}

func TestParseStat(t *testing.T) {
	// A command name with spaces and parentheses.
	line := "1234 (a) b (c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n"
	st, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if st.state != 'S' || st.pgrp != 1234 || st.startTime != 987654 {
		t.Fatalf("parsed %+v", st)
	}
	if _, err := parseStat([]byte("1 (x) S 1")); err == nil {
		t.Fatal("short stat parsed")
	}
}

// block parks the helper forever. A bare select{} would not do: with no
// other goroutine the Go runtime calls it a deadlock and exits.
func block() {
	for {
		time.Sleep(time.Hour)
	}
}

func TestConformance(t *testing.T) {
	dir := t.TempDir()
	runtimetest.Run(t, runtimetest.Harness{
		New: func(t *testing.T) runtime.Runtime {
			r := newRuntime(t, dir)
			stopAll(t, r)
			return r
		},
		Spec: func(t *testing.T, id string, exitCode int) runtime.EngineSpec {
			mode := "sleep"
			if exitCode >= 0 {
				mode = "exit:" + strconv.Itoa(exitCode)
			}
			return helperSpec(t, id, mode)
		},
	})
}

// A record that cannot be read is moved aside and its engine ID is free
// again (it used to fail every Start and Stop of that ID for good); temp
// files of interrupted record writes are cleared when a runtime opens the
// directory.
func TestCorruptRecordDoesNotBlockItsID(t *testing.T) {
	dir := t.TempDir()
	spec := helperSpec(t, "demo-0-v1", "sleep")
	if err := os.WriteFile(filepath.Join(dir, spec.ID+".json"), []byte(`{"id": "demo-0-v1", "pid": `), 0o600); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "."+spec.ID+".json.tmp-123")
	if err := os.WriteFile(tmp, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := newRuntime(t, dir)
	stopAll(t, r)
	if _, err := os.Stat(tmp); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("temp file of an interrupted write still there (%v)", err)
	}
	if _, err := r.Status(context.Background(), spec.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Status of a corrupt record = %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(filepath.Join(dir, spec.ID+".json.corrupt")); err != nil {
		t.Fatalf("corrupt record not kept aside: %v", err)
	}
	e, err := r.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("Start after a corrupt record: %v", err)
	}
	if err := r.Stop(context.Background(), spec.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	if !gone(e.PID) {
		t.Fatalf("pid %d still runs", e.PID)
	}
}

// The start line in the engine's log shows the command without the
// engine's API key, in either spelling.
func TestStartLineHidesTheAPIKey(t *testing.T) {
	r := newRuntime(t, t.TempDir())
	spec := helperSpec(t, "demo-0-v1", "sleep")
	spec.Command = append(spec.Command, "--api-key=s3cret-one", "--api-key", "s3cret-two", "--port", "1")
	if _, err := r.Start(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background(), spec.ID, time.Second) })
	eventually(t, "stdout in log", logHas(spec.LogPath, "hello stdout"))
	b, _ := os.ReadFile(spec.LogPath)
	log := string(b)
	if strings.Contains(log, "s3cret") {
		t.Fatalf("the log shows the key:\n%s", log)
	}
	if !strings.Contains(log, `"--api-key=[redacted]" "--api-key" "[redacted]" "--port" "1"`) {
		t.Fatalf("the start line does not show the redacted command:\n%s", log)
	}
}
