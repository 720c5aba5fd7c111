package engine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/runtime"
)

// faultyRuntime makes a real runtime's Status or Stop fail on demand, as a
// containerd that is restarting or a process that will not die would.
type faultyRuntime struct {
	runtime.Runtime
	failStatus, failStop atomic.Bool
	stopCalls            atomic.Int32
}

func (f *faultyRuntime) Status(ctx context.Context, id string) (runtime.Engine, error) {
	if f.failStatus.Load() {
		return runtime.Engine{}, errors.New("connection refused")
	}
	return f.Runtime.Status(ctx, id)
}

func (f *faultyRuntime) Stop(ctx context.Context, id string, grace time.Duration) error {
	f.stopCalls.Add(1)
	if f.failStop.Load() {
		return errors.New("process group still alive after SIGKILL")
	}
	return f.Runtime.Stop(ctx, id, grace)
}

// shardOf returns the runner's one shard.
func shardOf(r *Runner) (gossip.ShardRecord, bool) {
	s := r.Shards()
	if len(s) != 1 {
		return gossip.ShardRecord{}, false
	}
	return s[0], true
}

// An engine that loads for longer than StableAfter and dies before it is
// ever ready is crash-looping all the same: running long is not serving.
// On the fake clock every run spans a poll at least, five times
// StableAfter, and every backoff is shorter than a poll.
func TestSlowLoaderThatDiesIsReportedFailing(t *testing.T) {
	env := newRunnerEnv(t)
	r, f := env.openFake(func(c *Config) {
		c.StableAfter = c.Poll / 5
		c.BackoffMin, c.BackoffMax = c.Poll/5, c.Poll/2
	})
	defer r.Close()
	r.Reconcile(context.Background(), []Desired{desired("slow", "--fail-health", "--crash-after", "400ms")})
	f.until("the never-ready crash loop is reported failing", func() (bool, string) {
		s, ok := shardOf(r)
		return ok && s.Failing, fmt.Sprintf("%s ready=%v failing=%v restarts=%d", s.Status, s.Ready, s.Failing, s.Restarts)
	})
}

// A shard whose every start fails stays failing: the time since it was
// first placed is not a stable run. On the fake clock each try is a poll
// after the last (the backoff is shorter).
func TestStartFailuresStayFailing(t *testing.T) {
	env := newRunnerEnv(t)
	r, f := env.openFake(func(c *Config) {
		c.StableAfter = 2 * c.Poll
		c.BackoffMin, c.BackoffMax = c.Poll/5, c.Poll*4/5
	})
	defer r.Close()
	d := desired("bad")
	d.Spec.Engine = "no-such-engine"
	r.Reconcile(context.Background(), []Desired{d})
	var failingAt int
	f.until("failing", func() (bool, string) {
		s, ok := shardOf(r)
		failingAt = s.Restarts
		return ok && s.Failing, fmt.Sprintf("%s ready=%v failing=%v restarts=%d", s.Status, s.Ready, s.Failing, s.Restarts)
	})
	// The record says why, for `llmgw shards` and `models`.
	if s, _ := shardOf(r); !strings.Contains(s.Error, "no-such-engine") {
		t.Errorf("record error = %q, want the start failure naming the engine", s.Error)
	}
	// Many StableAfter periods later (each try is a poll apart), still failing.
	f.until("10 more failed starts, failing throughout", func() (bool, string) {
		s, ok := shardOf(r)
		if ok && !s.Failing {
			t.Fatalf("failing cleared after %d failed starts: %+v", s.Restarts, s)
		}
		return ok && s.Restarts >= failingAt+10, fmt.Sprintf("%s ready=%v failing=%v restarts=%d", s.Status, s.Ready, s.Failing, s.Restarts)
	})
}

// When the runtime cannot answer, a dead engine must still stop being
// ready: its lease must lapse and nothing may route to it.
func TestDeadEngineIsNotReadyWhileRuntimeStatusFails(t *testing.T) {
	env := newRunnerEnv(t)
	var f *faultyRuntime
	r := env.openWith(func(c *Config) {
		f = &faultyRuntime{Runtime: c.Runtime}
		c.Runtime = f
	})
	defer func() {
		f.failStatus.Store(false)
		r.Reconcile(context.Background(), nil)
		waitShard(t, r, "stopped", func(s []string) bool { return len(s) == 0 })
		r.Close()
	}()
	r.Reconcile(context.Background(), []Desired{desired("chat")})
	waitShard(t, r, "ready", func([]string) bool { return readyPID(r, "chat-0") > 0 })
	pid := readyPID(r, "chat-0")
	f.failStatus.Store(true)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 10*time.Second, "the dead engine is no longer ready", func() (bool, string) {
		s, ok := shardOf(r)
		return ok && !s.Ready, fmt.Sprintf("%s ready=%v failing=%v restarts=%d", s.Status, s.Ready, s.Failing, s.Restarts)
	})
	// Once the runtime answers again, the crash is seen and the engine
	// comes back.
	f.failStatus.Store(false)
	waitShard(t, r, "restarted", func([]string) bool { p := readyPID(r, "chat-0"); return p > 0 && p != pid })
}

// A stop that fails is tried again; the engine is not forgotten (its GPUs
// would be busy under no one's claim) until it is really gone. On the fake
// clock the drain delay and every retry's backoff are shorter than a poll.
func TestFailedStopIsRetried(t *testing.T) {
	env := newRunnerEnv(t)
	var f *faultyRuntime
	r, ft := env.openFake(func(c *Config) {
		f = &faultyRuntime{Runtime: c.Runtime}
		c.Runtime = f
		c.BackoffMin, c.BackoffMax = c.Poll*2/5, c.Poll
	})
	defer r.Close()
	ft.runReady(r, desired("chat"))
	pid := readyPID(r, "chat-0")
	f.failStop.Store(true)
	before := f.stopCalls.Load()
	r.Reconcile(context.Background(), nil)
	ft.until("three failed stops, the engine still tracked and its state file kept", func() (bool, string) {
		files, _ := filepath.Glob(filepath.Join(env.dir.ShardsDir(), "shard-*.json"))
		s, ok := shardOf(r)
		if !ok || len(files) != 1 {
			t.Fatalf("a failed stop forgot the engine: tracked=%v %+v, state files %d", ok, s, len(files))
		}
		return f.stopCalls.Load()-before >= 3, fmt.Sprintf("%d stop calls, %+v", f.stopCalls.Load()-before, s)
	})
	f.failStop.Store(false)
	ft.waitShard(r, "stopped once the runtime can", func(s []string) bool { return len(s) == 0 })
	// Gone, and reaped: the runtime's waiter collects the exit a moment
	// after Stop returns.
	testwait.Until(t, 5*time.Second, "the engine process is gone", func() (bool, string) {
		err := syscall.Kill(pid, 0)
		return errors.Is(err, syscall.ESRCH), fmt.Sprintf("kill(%d, 0): %v", pid, err)
	})
}

// An adopted engine that crashes before the restarted agent has heard the
// cluster waits for the plan: its state file does not hold the whole spec,
// and restarting from it would drop the deployment's args for good.
func TestAdoptedEngineCrashWaitsForThePlan(t *testing.T) {
	env := newRunnerEnv(t)
	d := desired("chat", "--exit-code", "7")
	r := env.open()
	r.Reconcile(context.Background(), []Desired{d})
	waitShard(t, r, "ready", func([]string) bool { return readyPID(r, "chat-0") > 0 })
	pid := readyPID(r, "chat-0")
	states, _ := env.dir.ReadShardStates()
	want := states[0].Spec.Command
	r.Close()

	r2 := env.openUnsettled(func(c *Config) { c.BackoffMin = 20 * time.Millisecond })
	defer func() {
		r2.Reconcile(context.Background(), nil)
		waitShard(t, r2, "stopped", func(s []string) bool { return len(s) == 0 })
		r2.Close()
	}()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 10*time.Second, "the crash is seen", func() (bool, string) {
		s, ok := shardOf(r2)
		return ok && s.Restarts == 1 && s.Status == gossip.ShardBackoff, fmt.Sprintf("%s ready=%v failing=%v restarts=%d", s.Status, s.Ready, s.Failing, s.Restarts)
	})
	// Fifty backoffs' worth of polls: no restart without a plan.
	inBackoff := func() (bool, string) {
		s, _ := shardOf(r2)
		return s.Status == gossip.ShardBackoff && s.Restarts == 1, fmt.Sprintf("%s restarts=%d", s.Status, s.Restarts)
	}
	testwait.StaysTrue(t, time.Second, "no restart of an adopted engine before the plan gives its spec", inBackoff)
	r2.Settle()
	r2.Reconcile(context.Background(), []Desired{d})
	// The negative control: with the plan, the same window sees the restart.
	testwait.BreaksWithin(t, time.Second, "the adopted engine restarted once the plan gives its spec", inBackoff)
	waitShard(t, r2, "restarted from the plan", func([]string) bool { return readyPID(r2, "chat-0") > 0 })
	states, _ = env.dir.ReadShardStates()
	// The port may move at a restart (it is checked free each time, and
	// another process may have taken it meanwhile): the rest is the plan's.
	if len(states) != 1 || !slices.Equal(withoutPort(states[0].Spec.Command), withoutPort(want)) ||
		!slices.Contains(states[0].Spec.Command, strconv.Itoa(states[0].Spec.HTTPPort)) {
		t.Fatalf("restarted with %v, want the planned command %v (on the port its state file names)", states[0].Spec.Command, want)
	}
}

// withoutPort is argv with the value of --port blanked.
func withoutPort(argv []string) []string {
	out := slices.Clone(argv)
	for i := range out {
		if out[i] == "--port" && i+1 < len(out) {
			out[i+1] = "PORT"
		}
	}
	return out
}

// An engine whose port is answered by some other process is not ready:
// the lease, and every route, would point at the wrong server.
func TestForeignListenerIsNotReady(t *testing.T) {
	env := newRunnerEnv(t)
	var foreign atomic.Bool
	foreign.Store(true)
	r := env.openWith(func(c *Config) {
		real := c.ListenerOwner
		c.ListenerOwner = func(port, pid int) (int, bool, error) {
			if foreign.Load() {
				return 0, false, nil // someone outside the engine's tree
			}
			if real != nil {
				return real(port, pid)
			}
			return pid, true, nil
		}
	})
	defer r.Close()
	r.Reconcile(context.Background(), []Desired{desired("chat")})
	// The engine answers /health and /v1/models, and still is not ready.
	testwait.Until(t, 10*time.Second, "the engine answers on its port", func() (bool, string) {
		s, ok := shardOf(r)
		if !ok || s.URL == "" {
			return false, "no URL yet"
		}
		resp, err := http.Get(s.URL + "/v1/models")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	notReady := func() (bool, string) {
		s, _ := shardOf(r)
		return !s.Ready, string(s.Status)
	}
	testwait.StaysTrue(t, 500*time.Millisecond, "not ready while another process owns the port", notReady)
	foreign.Store(false)
	// The negative control: once the engine owns its port, the same window
	// sees it ready.
	testwait.BreaksWithin(t, 500*time.Millisecond, "ready once the engine owns its port", notReady)
	waitShard(t, r, "ready once the engine owns its port", func([]string) bool { return readyPID(r, "chat-0") > 0 })
}

// An adopted engine reports the memory per GPU it was placed with: with 0
// ("whole GPUs") placement would count the rest of its GPUs as taken.
func TestAdoptedEngineKeepsItsMemoryPerGPU(t *testing.T) {
	env := newRunnerEnv(t)
	d := desired("chat")
	d.MemoryPerGPU = 20 << 30
	r := env.open()
	r.Reconcile(context.Background(), []Desired{d})
	waitShard(t, r, "ready", func([]string) bool { return readyPID(r, "chat-0") > 0 })
	r.Close()
	r2 := env.openUnsettled(func(*Config) {})
	defer func() {
		r2.Settle()
		r2.Reconcile(context.Background(), nil)
		waitShard(t, r2, "stopped", func(s []string) bool { return len(s) == 0 })
		r2.Close()
	}()
	s, ok := shardOf(r2)
	if !ok || s.MemoryPerGPU != 20<<30 {
		t.Fatalf("adopted shard reports %d bytes per GPU, want %d", s.MemoryPerGPU, 20<<30)
	}
}

// An engine's log is capped while it runs (one generation kept) and
// removed with the engine: logs are named per spec version, so kept ones
// would pile up with every rolling update.
func TestEngineLogIsCappedAndRemovedWithTheEngine(t *testing.T) {
	env := newRunnerEnv(t)
	r := env.openWith(func(c *Config) { c.MaxLogBytes, c.LogCheck = 1, 20*time.Millisecond })
	defer r.Close()
	r.Reconcile(context.Background(), []Desired{desired("chat")})
	waitShard(t, r, "ready", func([]string) bool { return readyPID(r, "chat-0") > 0 })
	path, ok := r.LogPath("chat-0")
	if !ok {
		t.Fatal("no log path for a running engine")
	}
	testwait.Until(t, 10*time.Second, "the log is capped into "+path+".1", func() (bool, string) {
		st, err := os.Stat(path + ".1")
		return err == nil && st.Size() > 0, fmt.Sprint(err)
	})
	r.Reconcile(context.Background(), nil)
	waitShard(t, r, "stopped", func(s []string) bool { return len(s) == 0 })
	for _, p := range []string{path, path + ".1"} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still there after its engine stopped (%v)", p, err)
		}
	}
}

// Reconcile itself does not signal Changes(): the node's loop reconciles
// on that signal, so a signal from every Reconcile made every idle node
// spin (half a CPU each). Only real engine events signal.
func TestReconcileDoesNotWakeItsCaller(t *testing.T) {
	env := newRunnerEnv(t)
	r := env.open()
	defer r.Close()
	select {
	case <-r.Changes(): // whatever opening signalled
	default:
	}
	for range 3 {
		r.Reconcile(context.Background(), nil)
	}
	select {
	case <-r.Changes():
		t.Fatal("an idle Reconcile signalled Changes: the node loop would reconcile again at once, forever")
	default:
	}
}

// An engine whose runtime record is lost (corrupt, moved aside) is found by
// its state file's pid and stopped before the plan starts its shard again:
// never a second engine beside an untracked first one holding its GPUs.
func TestEngineWithACorruptRuntimeRecordIsNotLeftRunning(t *testing.T) {
	env := newRunnerEnv(t)
	r := env.open()
	d := desired("chat")
	runReady(t, r, d)
	first := readyPID(r, "chat-0")
	// Should the runner lose it, the test must not: nothing else tracks it.
	t.Cleanup(func() { _ = syscall.Kill(-first, syscall.SIGKILL) })
	r.Close()
	id := placement.EngineID(d.ShardID, d.SpecVersion)
	if err := os.WriteFile(filepath.Join(env.dir.RuntimeDir(), id+".json"), []byte("{torn"), 0o600); err != nil {
		t.Fatal(err)
	}

	r2 := env.open()
	t.Cleanup(func() {
		r2.Reconcile(context.Background(), nil)
		waitShard(t, r2, "stopped", func(s []string) bool { return len(s) == 0 })
	})
	r2.Reconcile(context.Background(), []Desired{d})
	waitShard(t, r2, "chat ready again", func([]string) bool { return readyPID(r2, "chat-0") > 0 })
	if second := readyPID(r2, "chat-0"); second == first {
		t.Fatalf("the engine with the lost record (pid %d) is reported as the shard's engine", first)
	}
	testwait.Until(t, 10*time.Second, "the untracked first engine is gone", func() (bool, string) {
		err := syscall.Kill(first, 0)
		return err != nil, fmt.Sprintf("pid %d: kill -0: %v", first, err)
	})
}
