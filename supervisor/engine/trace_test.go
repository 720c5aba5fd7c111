package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
)

// recorder is a tracer provider that keeps every span it ends.
func recorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, sr
}

// ended waits until sr holds an ended span of every name in names and
// returns the last of each.
func ended(t *testing.T, sr *tracetest.SpanRecorder, names ...string) map[string]sdktrace.ReadOnlySpan {
	t.Helper()
	var got map[string]sdktrace.ReadOnlySpan
	testwait.Until(t, 15*time.Second, fmt.Sprintf("spans %q ended", names), func() (bool, string) {
		got = map[string]sdktrace.ReadOnlySpan{}
		var all []string
		for _, s := range sr.Ended() {
			got[s.Name()] = s
			all = append(all, s.Name())
		}
		for _, n := range names {
			if got[n] == nil {
				return false, fmt.Sprint("ended: ", all)
			}
		}
		return true, ""
	})
	return got
}

func attrOf(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// An engine start on a runner with a tracer is a span "engine start"
// naming the engine, with a child per phase (pull, start, ready) in that
// order, stamped by the runner's clock: here a fake one, whose pull takes
// three minutes.
func TestEngineStartIsTracedWithItsPhases(t *testing.T) {
	env := newRunnerEnv(t)
	tp, sr := recorder(t)
	var f *fakeTime
	r, f := env.openFake(func(c *Config) {
		c.Runtime = &imageRuntime{Runtime: c.Runtime, pulled: func() { f.clk.Advance(3 * time.Minute) }}
		c.Tracer = tp.Tracer("test")
	})
	defer func() {
		f.stopAll(r)
		r.Close()
	}()
	began := f.clk.Now()
	d := desired("chat")
	d.Spec.Image = "example.invalid/fake:1"
	f.runReady(r, d)
	s := ended(t, sr, "engine start", "pull", "start", "ready")
	es := s["engine start"]
	for k, want := range map[string]string{attrNode: "n1", attrDeployment: "chat", attrShard: "chat-0", attrEngineKind: "fake",
		attrSpecVersion: d.SpecVersion, attrEngineID: placement.EngineID(d.ShardID, d.SpecVersion), attrImage: d.Spec.Image, attrOutcome: outcomeReady} {
		if got := attrOf(es, k); got != want {
			t.Errorf("engine start %s = %q, want %q", k, got, want)
		}
	}
	if es.Status().Code == codes.Error {
		t.Errorf("a start that became ready has an error status: %v", es.Status())
	}
	if es.Parent().IsValid() {
		t.Errorf("a start that is no failover has a parent span %v", es.Parent().SpanID())
	}
	prev := es.StartTime()
	for _, name := range []string{"pull", "start", "ready"} {
		p := s[name]
		if p.Parent().SpanID() != es.SpanContext().SpanID() {
			t.Errorf("%s's parent %v, want the engine start span %v", name, p.Parent().SpanID(), es.SpanContext().SpanID())
		}
		if !p.StartTime().Equal(prev) {
			t.Errorf("%s starts at %v, want %v (where the phase before it ended)", name, p.StartTime(), prev)
		}
		prev = p.EndTime()
	}
	// The fake clock starts years from the wall clock: a span stamped by
	// the wall clock would start far before it.
	if es.StartTime().Before(began) || es.StartTime().After(began.Add(time.Minute)) || !prev.Equal(es.EndTime()) {
		t.Errorf("engine start %v to %v, ready ends %v; want from the fake clock's %v (a few polls on) to the end of ready", es.StartTime(), es.EndTime(), prev, began)
	}
	if got := s["pull"].EndTime().Sub(s["pull"].StartTime()); got != 3*time.Minute {
		t.Errorf("pull took %v on the runner's clock, want the 3m the pull moved it", got)
	}
}

// A start that fails ends its span, and the phase it failed in, with an
// error status saying why; so does one stopped before it was ready.
func TestFailedOrStoppedStartIsTracedAsAnError(t *testing.T) {
	t.Run("pull fails", func(t *testing.T) {
		env := newRunnerEnv(t)
		tp, sr := recorder(t)
		r := env.openWith(func(c *Config) {
			c.Runtime = &imageRuntime{Runtime: c.Runtime, pullErr: errors.New("manifest unknown")}
			c.BackoffMin, c.BackoffMax = time.Hour, time.Hour // one attempt
			c.Tracer = tp.Tracer("test")
		})
		defer r.Close()
		d := desired("chat")
		d.Spec.Image = "example.invalid/missing:1"
		r.Reconcile(context.Background(), []Desired{d})
		s := ended(t, sr, "engine start", "pull")
		for _, name := range []string{"engine start", "pull"} {
			if st := s[name].Status(); st.Code != codes.Error || st.Description != "manifest unknown" {
				t.Errorf("%s status %v, want an error saying manifest unknown", name, st)
			}
		}
		if got := attrOf(s["engine start"], attrOutcome); got != outcomeFailed {
			t.Errorf("outcome %q, want %q", got, outcomeFailed)
		}
		if _, started := s["start"]; started {
			t.Error("a start phase after a failed pull")
		}
	})
	t.Run("stopped while loading", func(t *testing.T) {
		env := newRunnerEnv(t)
		tp, sr := recorder(t)
		r := env.openWith(func(c *Config) { c.Tracer = tp.Tracer("test") })
		defer r.Close()
		d := desired("chat", "--fail-health") // never ready
		r.Reconcile(context.Background(), []Desired{d})
		waitShard(t, r, "started", func([]string) bool { s, ok := shardOf(r); return ok && s.PID > 0 })
		r.Reconcile(context.Background(), nil)
		s := ended(t, sr, "engine start", "ready")
		for _, name := range []string{"engine start", "ready"} {
			if st := s[name].Status(); st.Code != codes.Error {
				t.Errorf("%s status %v, want an error", name, st)
			}
		}
		if got := attrOf(s["engine start"], attrOutcome); got != outcomeStopped {
			t.Errorf("outcome %q, want %q", got, outcomeStopped)
		}
		waitShard(t, r, "stopped", func(s []string) bool { return len(s) == 0 })
	})
}

// A shard this node takes over after another node's lease lapsed is a
// span "failover" from the lapse this node saw until the engine is ready,
// naming the previous holder and the new one, with the start under it.
func TestFailoverIsTracedFromTheLapseToReady(t *testing.T) {
	env := newRunnerEnv(t)
	tp, sr := recorder(t)
	r, f := env.openFake(func(c *Config) { c.Tracer = tp.Tracer("test") })
	defer func() {
		f.stopAll(r)
		r.Close()
	}()
	lapsed := f.clk.Now().Add(-7 * time.Second)
	d := desired("chat")
	d.Failover = &Failover{From: "n0", At: lapsed, Why: "silent"}
	f.runReady(r, d)
	s := ended(t, sr, "failover", "engine start")
	fo, es := s["failover"], s["engine start"]
	for k, want := range map[string]string{attrPrevious: "n0", attrNewHolder: "n1", attrShard: "chat-0", attrDeployment: "chat",
		attrSpecVersion: d.SpecVersion, attrLapse: "silent", attrOutcome: outcomeReady} {
		if got := attrOf(fo, k); got != want {
			t.Errorf("failover %s = %q, want %q", k, got, want)
		}
	}
	if !fo.StartTime().Equal(lapsed) || !fo.EndTime().Equal(es.EndTime()) {
		t.Errorf("failover %v to %v; want from the lapse %v to the engine's readiness %v", fo.StartTime(), fo.EndTime(), lapsed, es.EndTime())
	}
	if es.Parent().SpanID() != fo.SpanContext().SpanID() || es.SpanContext().TraceID() != fo.SpanContext().TraceID() {
		t.Errorf("engine start's parent %v, want the failover span %v", es.Parent().SpanID(), fo.SpanContext().SpanID())
	}
	if fo.Status().Code == codes.Error {
		t.Errorf("a failover that became ready has an error status: %v", fo.Status())
	}
}

// Without a tracer a start's hooks make no span and allocate nothing.
func TestNoTracerNoSpans(t *testing.T) {
	var tr startTrace
	e := &managed{}
	allocs := testing.AllocsPerRun(100, func() {
		tr.beginFailover("n1", e)
		tr.begin("n1", e, time.Time{})
		tr.image("img")
		tr.enter("pull", time.Time{})
		tr.fail(time.Time{}, "x")
		tr.ready(time.Time{})
		tr.stop(time.Time{})
	})
	if allocs != 0 || tr.attempt != nil || tr.phase != nil || tr.failover != nil || tr.attempts != 0 {
		t.Fatalf("without a tracer: %v allocations a start, spans %+v", allocs, tr)
	}
}

// With or without a tracer, the record says how the engine's start that
// became ready spent its time: its pull (three minutes here, on the
// runner's fake clock) and from its process's start to ready.
func TestStartPhasesInTheRecord(t *testing.T) {
	env := newRunnerEnv(t)
	var f *fakeTime
	r, f := env.openFake(func(c *Config) {
		c.Runtime = &imageRuntime{Runtime: c.Runtime, pulled: func() { f.clk.Advance(3 * time.Minute) }}
	})
	defer func() {
		f.stopAll(r)
		r.Close()
	}()
	d := desired("chat")
	d.Spec.Image = "example.invalid/fake:1"
	f.runReady(r, d)
	var rec []int64
	testwait.Until(t, 15*time.Second, "the start's phases in the record", func() (bool, string) {
		for _, s := range r.Shards() {
			if s.Ready {
				rec = []int64{s.PullMs, s.LoadMs}
				return s.PullMs > 0, fmt.Sprintf("pull %d ms, load %d ms", s.PullMs, s.LoadMs)
			}
		}
		return false, "not ready"
	})
	if rec[0] != (3*time.Minute).Milliseconds() || rec[1] < 0 || rec[1] > time.Minute.Milliseconds() {
		t.Errorf("pull %d ms, load %d ms; want the pull's 180000 and a load of a few polls", rec[0], rec[1])
	}
}
