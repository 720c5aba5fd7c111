package engine

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/load"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/fakeengine"
	"github.com/llmgw/llmgw/supervisor/profile"
	"github.com/llmgw/llmgw/supervisor/runtime/process"
)

// TestMain lets the test binary serve as the fake engine: the fake
// profile runs `<self> engine fake --model M --port P ...`, and the runner's
// tests point Self at this binary.
func TestMain(m *testing.M) {
	if code, ok := fakeengine.MainForTests(os.Args[1:]); ok {
		os.Exit(code)
	}
	// Every test stops what it started: runners and their watchers.
	goleak.VerifyTestMain(m)
}

type runnerEnv struct {
	t    *testing.T
	dir  datadir.Dir
	self string
}

func newRunnerEnv(t *testing.T) *runnerEnv {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return &runnerEnv{t: t, dir: datadir.New(t.TempDir()), self: self}
}

// open builds a runner over the process runtime in the env's data dir, as
// an agent (re)start would.
func (e *runnerEnv) open() *Runner { return e.openWith(func(*Config) {}) }

func (e *runnerEnv) openWith(mutate func(*Config)) *Runner {
	e.t.Helper()
	r := e.openUnsettled(mutate)
	r.Settle()
	return r
}

// openUnsettled is openWith for an agent that has not heard the cluster yet.
func (e *runnerEnv) openUnsettled(mutate func(*Config)) *Runner {
	e.t.Helper()
	rt, err := process.New(e.dir.RuntimeDir())
	if err != nil {
		e.t.Fatal(err)
	}
	// A failing test must not leave engines behind: stop whatever the
	// runtime still runs when the test ends.
	e.t.Cleanup(func() {
		engines, _ := rt.List(context.Background(), "")
		for _, x := range engines {
			_ = rt.Stop(context.Background(), x.ID, time.Second)
		}
	})
	cfg := Config{
		Node: "n1", Runtime: rt, DataDir: e.dir, Host: "127.0.0.1", Self: e.self, SimulatedGPUs: true,
		PortMin: 20100, PortMax: 20999, Poll: 50 * time.Millisecond, Grace: 2 * time.Second,
		BackoffMin: 200 * time.Millisecond, BackoffMax: time.Second, FailingAfter: 3, LoadInterval: 100 * time.Millisecond,
		DrainDelay: 20 * time.Millisecond,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	mutate(&cfg)
	r, err := NewRunner(context.Background(), cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(r.Close) // Close is idempotent; a test that forgets leaks no watcher
	return r
}

func desired(name string, args ...string) Desired {
	spec := placement.Deployment{Name: name, Model: "m/tiny", Engine: "fake", Replicas: 1, Args: args}.WithDefaults()
	return Desired{Assignment: placement.Assignment{ShardID: name + "-0", ReplicaID: name + "-0", Deployment: name,
		SpecVersion: spec.SpecVersion(), GPUs: []int{0}}, Spec: spec}
}

func waitShard(t *testing.T, r *Runner, what string, cond func(s []string) bool) {
	t.Helper()
	testwait.Until(t, 15*time.Second, what, func() (bool, string) {
		desc := describeShards(r)
		return cond(desc), fmt.Sprint(desc)
	})
}

// describeShards is what waitShard's conditions get: a line per shard.
func describeShards(r *Runner) []string {
	var desc []string
	for _, s := range r.Shards() {
		desc = append(desc, fmt.Sprintf("%s:%s:ready=%v:pid=%d:restarts=%d", s.ShardID, s.Status, s.Ready, s.PID, s.Restarts))
	}
	return desc
}

// runReady plans d on r and waits until its engine is ready.
func runReady(t *testing.T, r *Runner, d Desired) {
	t.Helper()
	r.Reconcile(context.Background(), []Desired{d})
	waitShard(t, r, d.ShardID+" ready", func([]string) bool { return readyPID(r, d.ShardID) > 0 })
}

func readyPID(r *Runner, shard string) int {
	for _, s := range r.Shards() {
		if s.ShardID == shard && s.Ready {
			return s.PID
		}
	}
	return 0
}

func TestAgentRestartAdoptsTheSameEngine(t *testing.T) {
	env := newRunnerEnv(t)
	r := env.open()
	d := desired("chat")
	runReady(t, r, d)
	pid := readyPID(r, "chat-0")
	url := r.Shards()[0].URL
	// The agent dies (its watchers stop, the engine does not).
	r.Close()
	r2 := env.open()
	t.Cleanup(func() {
		r2.Reconcile(context.Background(), nil)
		waitShard(t, r2, "stopped", func(s []string) bool { return len(s) == 0 })
	})
	r2.Reconcile(context.Background(), []Desired{d})
	waitShard(t, r2, "chat adopted and ready", func([]string) bool { return readyPID(r2, "chat-0") == pid })
	if s := r2.Shards()[0]; s.Restarts != 0 || s.URL != url {
		t.Fatalf("after restart: %+v; want 0 restarts at %s", s, url)
	}
	if resp, err := http.Get(url + "/health"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("engine stopped serving across the agent restart: %v", err)
	}
}

// On the fake clock: the crashed engine waits out its backoff (a minute,
// longer than any wait here on the wall clock) in backoff, and comes back
// once the clock has passed it.
func TestKilledEngineComesBackWithBackoff(t *testing.T) {
	env := newRunnerEnv(t)
	r, f := env.openFake(func(c *Config) { c.BackoffMin, c.BackoffMax = time.Minute, time.Minute })
	defer r.Close()
	f.runReady(r, desired("chat"))
	pid := readyPID(r, "chat-0")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	f.waitShard(r, "the crash seen, in backoff", func([]string) bool {
		s, ok := shardOf(r)
		return ok && s.Status == gossip.ShardBackoff && s.Restarts == 1
	})
	f.advance(oneEngineWaits, time.Minute)
	f.waitShard(r, "restarted with a new pid", func([]string) bool {
		p := readyPID(r, "chat-0")
		return p > 0 && p != pid && r.Shards()[0].Restarts == 1
	})
	s := r.Shards()[0]
	if s.LastExit == nil || *s.LastExit == 0 {
		t.Fatalf("last exit not reported: %+v", s)
	}
	last := readyPID(r, "chat-0")
	r.Reconcile(context.Background(), nil)
	f.waitShard(r, "stopped when no longer desired", func(s []string) bool { return len(s) == 0 })
	if err := syscall.Kill(last, 0); err != syscall.ESRCH {
		t.Fatalf("engine pid %d still exists after its shard was unplanned (kill 0: %v)", last, err)
	}
}

// On the fake clock: each crash waits out its backoff, doubled from the
// last (a minute, then two), before the next start.
func TestCrashLoopBacksOffAndIsReportedFailing(t *testing.T) {
	env := newRunnerEnv(t)
	r, f := env.openFake(func(c *Config) { c.BackoffMin, c.BackoffMax = time.Minute, time.Hour })
	defer func() {
		f.stopAll(r)
		r.Close()
	}()
	r.Reconcile(context.Background(), []Desired{desired("loop", "--crash-after", "300ms", "--exit-code", "3")})
	for crash := 1; crash <= 3; crash++ {
		f.waitShard(r, fmt.Sprintf("crash %d seen, in backoff", crash), func([]string) bool {
			s, ok := shardOf(r)
			return ok && s.Restarts == crash && s.Status == gossip.ShardBackoff
		})
		if crash < 3 {
			f.advance(oneEngineWaits, time.Minute<<(crash-1))
		}
	}
	waitShard(t, r, "reported failing after 3 crashes", func([]string) bool {
		s := r.Shards()
		return len(s) == 1 && s[0].Failing && s[0].Restarts >= 3 && s[0].LastExit != nil && *s[0].LastExit == 3
	})
	// Between tries the engine is removed, so it holds no GPU.
	waitShard(t, r, "in backoff with no engine running", func([]string) bool {
		s := r.Shards()
		return len(s) == 1 && s[0].Status == gossip.ShardBackoff && !s[0].Ready
	})
}

func TestTruncatedStateFileDoesNotStopTheAgent(t *testing.T) {
	env := newRunnerEnv(t)
	if err := os.MkdirAll(env.dir.ShardsDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(env.dir.ShardsDir(), "shard-chat-0.json"), []byte(`{"format_version":1,"shard_id":"ch`), 0o600); err != nil {
		t.Fatal(err)
	}
	r := env.open()
	defer r.Close()
	if len(r.Shards()) != 0 {
		t.Fatalf("a corrupt file became a shard: %+v", r.Shards())
	}
	r.Reconcile(context.Background(), []Desired{desired("chat")})
	waitShard(t, r, "a fresh engine for the shard", func([]string) bool { return readyPID(r, "chat-0") > 0 })
	r.Reconcile(context.Background(), nil)
	waitShard(t, r, "stopped", func(s []string) bool { return len(s) == 0 })
}

func TestUnsettledRunnerStartsNothing(t *testing.T) {
	env := newRunnerEnv(t)
	rt, _ := process.New(env.dir.RuntimeDir())
	r, err := NewRunner(context.Background(), Config{Node: "n1", Runtime: rt, DataDir: env.dir, Self: env.self, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Reconcile(context.Background(), []Desired{desired("chat")})
	if len(r.Shards()) != 0 {
		t.Fatal("an unsettled runner acted on a plan from a partial view")
	}
}

func TestEngineLoadReachesTheShardRecord(t *testing.T) {
	env := newRunnerEnv(t)
	r := env.open()
	defer func() {
		r.Reconcile(context.Background(), nil)
		waitShard(t, r, "stopped", func(s []string) bool { return len(s) == 0 })
		r.Close()
	}()
	r.Reconcile(context.Background(), []Desired{desired("chat")})
	waitShard(t, r, "ready", func([]string) bool { return readyPID(r, "chat-0") > 0 })
	url := r.Shards()[0].URL
	body := `{"model":"chat","messages":[{"role":"user","content":"one two three"}]}`
	testwait.Until(t, 10*time.Second, "generation rate seen", func() (bool, string) {
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err == nil {
			resp.Body.Close()
		}
		l := r.Shards()[0].Load
		return l.RatesValid && l.GenerationTPS > 0 && !l.ScrapedAt.IsZero(), fmt.Sprintf("%+v", l)
	})
}

// An engine found running without its state file claims nothing (its port,
// GPUs and claim are unknown) and is replaced by a fresh one once settled.
func TestEngineWithoutStateFileIsReplaced(t *testing.T) {
	env := newRunnerEnv(t)
	r := env.open()
	r.Reconcile(context.Background(), []Desired{desired("chat")})
	waitShard(t, r, "ready", func([]string) bool { return readyPID(r, "chat-0") > 0 })
	old := readyPID(r, "chat-0")
	r.Close()
	files, _ := filepath.Glob(filepath.Join(env.dir.ShardsDir(), "shard-*.json"))
	for _, f := range files {
		os.Remove(f)
	}
	r2 := env.open()
	defer func() {
		r2.Reconcile(context.Background(), nil)
		waitShard(t, r2, "stopped", func(s []string) bool { return len(s) == 0 })
		r2.Close()
	}()
	if s := r2.Shards(); len(s) != 0 {
		t.Fatalf("an engine without a state file is claimed: %+v", s)
	}
	waitShard(t, r2, "orphan stopped, fresh engine ready", func([]string) bool {
		// The node reconciles on a tick; so does this test.
		r2.Reconcile(context.Background(), []Desired{desired("chat")})
		p := readyPID(r2, "chat-0")
		return p > 0 && p != old && syscall.Kill(old, 0) == syscall.ESRCH
	})
}

// An engine that runs but never becomes ready is restarted after the start
// timeout instead of holding its shard forever. On the fake clock, an hour
// of start timeout and a minute of backoff pass at every look.
func TestEngineNeverReadyIsRestartedAfterTheStartTimeout(t *testing.T) {
	env := newRunnerEnv(t)
	r, f := env.openFake(func(c *Config) {
		c.StartTimeout = time.Hour
		c.BackoffMin, c.BackoffMax = time.Minute, time.Minute
	})
	defer func() {
		f.stopAll(r)
		r.Close()
	}()
	r.Reconcile(context.Background(), []Desired{desired("stuck", "--fail-health")})
	f.untilBy(time.Hour+f.poll, "restarted twice for its start timeout, never ready", func() (bool, string) {
		s, ok := shardOf(r)
		return ok && s.Restarts >= 2 && !s.Ready && strings.Contains(s.Error, "start timeout"), fmt.Sprintf("%+v", s)
	})
}

// Load is read by the engine profile's own metric names: an SGLang page
// has no vllm:* series.
func TestLoadIsReadByTheProfilesMetricNames(t *testing.T) {
	prof, err := profile.Lookup("sglang")
	if err != nil {
		t.Fatal(err)
	}
	page := "# TYPE " + prof.Metrics.Running + " gauge\n" + prof.Metrics.Running + "{model_name=\"m\"} 3\n" +
		"# TYPE " + prof.Metrics.KVCacheUsage + " gauge\n" + prof.Metrics.KVCacheUsage + "{model_name=\"m\"} 0.25\n"
	s, err := load.Parse(strings.NewReader(page), expfmt.NewFormat(expfmt.TypeTextPlain), prof.Metrics.LoadNames())
	if err != nil {
		t.Fatal(err)
	}
	if s.Running != 3 || s.KVCacheUsage != 0.25 {
		t.Fatalf("read %+v from an SGLang page; want running 3, KV cache 0.25", s)
	}
}

// A restarted agent hands over a serving engine as ready at once: its first
// record, and so its node's first plan, must not take a serving copy for
// one still loading (in a rolling update only a valid lease keeps an
// old-version copy, and its node would stop it before the new one serves).
func TestAdoptedEngineIsReadyWhenTheRunnerIsHandedOver(t *testing.T) {
	env := newRunnerEnv(t)
	r := env.open()
	d := desired("chat")
	runReady(t, r, d)
	pid := readyPID(r, "chat-0")
	r.Close()

	// Unsettled, as a restarted agent is: no watcher poll is awaited.
	r2 := env.openUnsettled(func(*Config) {})
	t.Cleanup(func() {
		r2.Settle()
		r2.Reconcile(context.Background(), nil)
		waitShard(t, r2, "stopped", func(s []string) bool { return len(s) == 0 })
	})
	s := r2.Shards()
	if len(s) != 1 || !s[0].Ready || s[0].Status != gossip.ShardReady || s[0].PID != pid {
		t.Fatalf("right after the restart the runner reports %+v; want chat-0 ready, pid %d", s, pid)
	}
}

// Reclaim stamps every claim afresh, in the records and in the state files
// the next agent adopts from.
func TestReclaimStampsClaimsAfresh(t *testing.T) {
	env := newRunnerEnv(t)
	r := env.open()
	runReady(t, r, desired("chat"))
	first := r.Shards()[0].ClaimStamp
	at := time.Unix(0, first).Add(time.Hour)
	r.Reclaim(at)
	if got := r.Shards()[0].ClaimStamp; got != at.UnixNano() {
		t.Fatalf("claim stamp after Reclaim = %d, want %d (was %d)", got, at.UnixNano(), first)
	}
	r.Close()
	r2 := env.open()
	t.Cleanup(func() {
		r2.Reconcile(context.Background(), nil)
		waitShard(t, r2, "stopped", func(s []string) bool { return len(s) == 0 })
	})
	if s := r2.Shards(); len(s) != 1 || s[0].ClaimStamp != at.UnixNano() {
		t.Fatalf("adopted after Reclaim: %+v; want the fresh claim stamp %d", s, at.UnixNano())
	}
}

// An engine that serves is not stopped the moment its node stops planning
// it: its record says "stopping" at once (no node routes to it any more),
// and it keeps answering for the drain delay, so that routers with a view a
// moment old do not find its port closed. On the fake clock the window is
// exact: the clock stands a millisecond short of the delay while the test
// looks, then passes it, and the same window sees the engine go (the
// negative control).
func TestServingEngineDrainsBeforeItStops(t *testing.T) {
	env := newRunnerEnv(t)
	r, f := env.openFake(func(c *Config) { c.DrainDelay = time.Minute })
	f.runReady(r, desired("chat"))
	url := r.Shards()[0].URL
	r.Reconcile(context.Background(), nil)
	if s := r.Shards(); len(s) != 1 || s[0].Status != gossip.ShardStopping || s[0].Ready {
		t.Fatalf("right after it was unplanned: %+v; want it reported stopping, not ready", s)
	}
	answers := func() (bool, string) {
		resp, err := http.Get(url + "/health")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	}
	f.advance(drainWaits, time.Minute-time.Millisecond)
	testwait.StaysTrue(t, 400*time.Millisecond, "the engine answers while it drains", answers)
	f.clk.Advance(time.Millisecond)
	testwait.BreaksWithin(t, 400*time.Millisecond, "the engine stops answering once the drain delay is over", answers)
	f.waitShard(r, "stopped after the drain", func(s []string) bool { return len(s) == 0 })
}

// A stopping engine keeps the requests it has in hand: after the drain
// delay its node waits until its /metrics shows nothing running or waiting
// (at most DrainMax), so a stream in flight ends whole instead of cut. On
// the fake clock the drain delay passes at once, and the runner reads the
// engine's load at every poll the test moves the clock by.
func TestStoppingEngineFinishesItsStreams(t *testing.T) {
	env := newRunnerEnv(t)
	r, f := env.openFake(func(c *Config) { c.DrainDelay, c.DrainMax = time.Minute, time.Hour })
	d := desired("chat", "--token-delay=100ms")
	f.runReady(r, d)
	s := r.Shards()[0]
	body := `{"model":"chat","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"a long answer please"}]}`
	req, _ := http.NewRequest("POST", s.URL+"/v1/chat/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: HTTP %d", resp.StatusCode)
	}
	// Stop it while the stream runs (20 tokens, 100 ms apart).
	r.Reconcile(context.Background(), nil)
	f.advance(drainWaits, time.Minute)
	type read struct {
		all []byte
		err error
	}
	done := make(chan read, 1)
	go func() {
		all, err := io.ReadAll(resp.Body)
		done <- read{all, err}
	}()
	var got read
	f.until("the stream ends", func() (bool, string) {
		select {
		case got = <-done:
			return true, ""
		default:
			return false, "still streaming"
		}
	})
	if got.err != nil || !strings.Contains(string(got.all), "data: [DONE]") {
		t.Fatalf("the stream in flight was cut by the stop (err %v): ...%s", got.err, got.all[max(0, len(got.all)-200):])
	}
	f.waitShard(r, "stopped once idle", func(s []string) bool { return len(s) == 0 })
}
