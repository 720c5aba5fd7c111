package supervisor

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/engine"
)

// A shard planned here that another node held, and whose lease this node
// judges lapsed, is a failover from that node, dated when the judgement
// turned by this node's clock; a kept shard, a new one, or one whose
// holder still renews (a handover) is none.
func TestFailoversNameThePreviousHolderAndTheLapse(t *testing.T) {
	const ttl = 10 * time.Second
	now := time.Unix(1_900_000_000, 0)
	holding := func(name string, state gossip.MemberState, seen, since time.Time, status gossip.ShardStatus) gossip.Member {
		return gossip.Member{Name: name, State: state, SeenAt: seen, Since: since, Record: &gossip.NodeRecord{
			Shards: []gossip.ShardRecord{{ShardID: "chat-0", SpecVersion: "v1", Status: status, Ready: status == gossip.ShardReady}}}}
	}
	mine := func(kept bool) []engine.Desired {
		return []engine.Desired{{Assignment: placement.Assignment{ShardID: "chat-0", Deployment: "chat", SpecVersion: "v1", Node: "b", Kept: kept}}}
	}
	for _, tt := range []struct {
		name    string
		kept    bool
		members []gossip.Member
		want    *engine.Failover
	}{
		{"silent holder", false, []gossip.Member{holding("a", gossip.StateAlive, now.Add(-15*time.Second), time.Time{}, gossip.ShardReady)},
			&engine.Failover{From: "a", At: now.Add(-5 * time.Second), Why: "silent"}},
		{"dead before its TTL ran out", false, []gossip.Member{holding("a", gossip.StateDead, now.Add(-4*time.Second), now.Add(-2*time.Second), gossip.ShardReady)},
			&engine.Failover{From: "a", At: now.Add(-2 * time.Second), Why: "dead"}},
		{"silent before memberlist said dead", false, []gossip.Member{holding("a", gossip.StateDead, now.Add(-30*time.Second), now.Add(-1*time.Second), gossip.ShardReady)},
			&engine.Failover{From: "a", At: now.Add(-20 * time.Second), Why: "silent"}},
		{"kept here", true, []gossip.Member{holding("a", gossip.StateAlive, now.Add(-15*time.Second), time.Time{}, gossip.ShardReady)}, nil},
		{"holder renews: a handover", false, []gossip.Member{holding("a", gossip.StateAlive, now.Add(-time.Second), time.Time{}, gossip.ShardStopping)}, nil},
		{"held by nobody", false, []gossip.Member{{Name: "a", State: gossip.StateAlive, SeenAt: now, Record: &gossip.NodeRecord{}}}, nil},
		{"held by this node", false, []gossip.Member{holding("b", gossip.StateAlive, now.Add(-15*time.Second), time.Time{}, gossip.ShardReady)}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := mine(tt.kept)
			failovers(m, tt.members, "b", now, ttl)
			got := m[0].Failover
			switch {
			case tt.want == nil && got != nil:
				t.Fatalf("failover %+v, want none", *got)
			case tt.want != nil && (got == nil || *got != *tt.want):
				t.Fatalf("failover %+v, want %+v", got, *tt.want)
			}
		})
	}
}

// Two nodes with engine runners: when the holder of a shard dies, the
// other takes the shard over, and its runner exports a span "failover"
// naming the dead holder, from no earlier than the death until the new
// engine is ready, with the engine's start under it.
func TestTakeoverAfterALapseIsTracedAsAFailover(t *testing.T) {
	h := newHarness(t)
	runners, recorders := map[string]*engine.Runner{}, map[string]*tracetest.SpanRecorder{}
	for _, name := range []string{"a", "b"} {
		sr := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		var join []string
		if name == "b" {
			join = []string{h.gossipAddr("a")}
		}
		cfg := h.config(name, join...)
		runners[name], recorders[name] = processRunnerAs(t, t.TempDir(), name, tp.Tracer("test")), sr
		cfg.Runner = runners[name]
		h.cfgs[name] = cfg
		h.start(name, join...)
	}
	call(t, "POST", api(h.nodes["a"], "/v1/deployments"), testToken, []byte(`{"name":"chat","model":"m","engine":"fake"}`), nil)
	var holder, taker string
	testwait.Until(t, 20*time.Second, "chat-0 ready on a node", func() (bool, string) {
		for name, r := range runners {
			if pid, _ := readyPID(r, "chat-0"); pid > 0 {
				holder = name
				return true, ""
			}
		}
		return false, "not ready"
	})
	taker = map[string]string{"a": "b", "b": "a"}[holder]
	var first []string
	for _, s := range recorders[holder].Ended() {
		first = append(first, s.Name())
	}
	if !slices.Contains(first, "engine start") || slices.Contains(first, "failover") {
		t.Fatalf("the first holder's spans %q, want its engine start and no failover", first)
	}
	killed := time.Now()
	if err := h.nodes[holder].Kill(); err != nil {
		t.Fatal(err)
	}
	var fo, start sdktrace.ReadOnlySpan
	testwait.Until(t, 30*time.Second, "a failover span on "+taker, func() (bool, string) {
		var names []string
		for _, s := range recorders[taker].Ended() {
			names = append(names, s.Name())
			switch s.Name() {
			case "failover":
				fo = s
			case "engine start":
				start = s
			}
		}
		return fo != nil && start != nil, fmt.Sprint(names)
	})
	got := map[attribute.Key]string{}
	for _, kv := range fo.Attributes() {
		got[kv.Key] = kv.Value.String()
	}
	for k, want := range map[attribute.Key]string{"llmgw.previous_holder": holder, "llmgw.new_holder": taker, "llmgw.shard": "chat-0",
		"llmgw.deployment": "chat", "llmgw.outcome": "ready"} {
		if got[k] != want {
			t.Errorf("failover %s = %q, want %q (all: %v)", k, got[k], want, got)
		}
	}
	if fo.StartTime().Before(killed) || fo.StartTime().After(start.StartTime()) || !fo.EndTime().Equal(start.EndTime()) {
		t.Errorf("failover %v to %v, engine start %v to %v, holder killed at %v: want the failover from the lapse (after the kill, before the start) to the engine's readiness",
			fo.StartTime(), fo.EndTime(), start.StartTime(), start.EndTime(), killed)
	}
	if start.Parent().SpanID() != fo.SpanContext().SpanID() {
		t.Errorf("the engine start's parent %v, want the failover %v", start.Parent().SpanID(), fo.SpanContext().SpanID())
	}
}
