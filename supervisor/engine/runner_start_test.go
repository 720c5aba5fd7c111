package engine

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/placement"
)

// On the fake clock: a start that outlasts the old fixed 30 minutes while
// its log keeps growing is not killed; the timeout counts from the end of
// the image pull (here three hours long); and once the engine falls
// silent it is killed after its deployment's start_timeout.
func TestStartTimeoutWaitsForAGrowingDownload(t *testing.T) {
	env := newRunnerEnv(t)
	var f *fakeTime // the pull moves the clock openFake makes
	r, f := env.openFake(func(c *Config) {
		c.Runtime = &imageRuntime{Runtime: c.Runtime, pulled: func() { f.clk.Advance(3 * time.Hour) }}
		c.BackoffMin, c.BackoffMax = time.Hour, time.Hour // one crash is all this test looks at
	})
	defer func() {
		f.stopAll(r)
		r.Close()
	}()
	d := desired("big", "--fail-health")
	d.Spec.Image = "example.invalid/fake:1"
	d.Spec.StartTimeout = placement.Duration(30 * time.Minute)
	r.Reconcile(context.Background(), []Desired{d})
	f.waitShard(r, "loading", func([]string) bool {
		s, ok := shardOf(r)
		return ok && s.Note == "loading" && s.PID > 0
	})
	logPath := r.cfg.DataDir.EngineLogFile(placement.EngineID(d.ShardID, d.SpecVersion))
	grow := func() {
		lf, err := os.OpenFile(logPath, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = lf.WriteString("Downloading shards: 42%\n")
		_ = lf.Close()
	}
	for i := range 6 { // an hour of a download whose log grows every 10 minutes
		at := f.clk.Now().Add(10 * time.Minute)
		f.advance(oneEngineWaits, 10*time.Minute)
		// It grows until a poll sees it: one poll may have read its size
		// just before.
		f.until("the runner saw the log grow", func() (bool, string) {
			s, _ := shardOf(r)
			if s.NoteAt.Before(at) {
				grow()
				return false, s.Note + " " + s.NoteAt.String()
			}
			return true, ""
		})
		if s, _ := shardOf(r); s.Restarts != 0 {
			t.Fatalf("step %d: restarted (%s) although its log grew every 10 minutes", i, s.Error)
		}
	}
	f.advance(oneEngineWaits, 31*time.Minute) // silent for longer than start_timeout
	waitShard(t, r, "killed after start_timeout", func([]string) bool {
		s, _ := shardOf(r)
		return s.Restarts == 1 && strings.Contains(s.Error, "start timeout")
	})
}

// A ready engine that hangs (its loop frozen: no answer, counters still)
// leaves routing by the readiness rule and is restarted once it stayed so
// for HungRestart, counted as a crash with its reason.
func TestHungEngineLeavesRoutingAndIsRestarted(t *testing.T) {
	env := newRunnerEnv(t)
	r := env.openWith(func(c *Config) {
		c.Readiness.ProbeTimeout, c.Readiness.Failures = 200*time.Millisecond, 3
		c.Readiness.ProgressWindow, c.Readiness.HungRestart = 500*time.Millisecond, time.Second
		// A long backoff keeps the crash's reason on show while the test
		// looks (the next start clears it).
		c.BackoffMin, c.BackoffMax = time.Minute, time.Minute
	})
	defer func() {
		r.Reconcile(context.Background(), nil)
		waitShard(t, r, "stopped", func(s []string) bool { return len(s) == 0 })
		r.Close()
	}()
	d := desired("frozen", "--hang-after", "2s")
	runReady(t, r, d)
	waitShard(t, r, "not routable, then restarted as hung", func([]string) bool {
		s, _ := shardOf(r)
		return s.Restarts >= 1 && strings.Contains(s.Error, "hung") && !s.Ready
	})
	if r.Unroutable() < 1 || r.HungRestarts() < 1 {
		t.Fatalf("counters: unroutable %d, hung restarts %d; want both at least 1", r.Unroutable(), r.HungRestarts())
	}
	s, _ := shardOf(r)
	if !strings.Contains(s.Note, "restarted: hung") {
		t.Fatalf("note %q does not say it was restarted as hung", s.Note)
	}
}
