package engine

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/llmgw/llmgw/supervisor/profile"
)

// The readiness rule's truth table, on simulated time: a ready engine
// stops being routable only when K probes in a row failed AND its counters
// did not move during the last W; it is restarted once it stayed so for R.
func TestLivenessRule(t *testing.T) {
	rule := profile.Readiness{ProbeTimeout: 10 * time.Second, Failures: 3, ProgressWindow: 30 * time.Second, HungRestart: 2 * time.Minute}
	const poll = 500 * time.Millisecond
	t0 := time.Unix(1_700_000_000, 0)
	type step struct {
		ok       bool
		tokens   float64 // <0: /metrics could not be read
		routable bool
		hung     bool
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"slow but progressing: probes time out, tokens keep coming", []step{
			{false, 100, true, false}, {false, 200, true, false}, {false, 300, true, false}, {false, 400, true, false},
			{false, 500, true, false}, {false, 600, true, false},
		}},
		{"failing and frozen: out after K failures once the window passed", []step{
			{true, 100, true, false}, {true, 200, true, false}, {true, 300, true, false}, // progress at step 2
			{false, 300, true, false}, {false, -1, true, false}, // failing, and progress within W
			{false, -1, false, false}, // K failures, and W passed since the last progress (steps are 10.5 s apart)
			{false, -1, false, false},
		}},
		{"idle and failing: no progress ever, K failures alone decide", []step{
			{true, 7, true, false}, {false, 7, true, false}, {false, 7, true, false}, {false, 7, false, false},
		}},
		{"one slow probe is nothing", []step{
			{true, 7, true, false}, {false, 7, true, false}, {true, 7, true, false}, {false, 7, true, false}, {false, 7, true, false}, {true, 7, true, false},
		}},
		{"a failing engine comes back", []step{
			{false, 7, true, false}, {false, 7, true, false}, {false, 7, false, false}, {true, 7, true, false},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var l liveness
			now := t0
			l.becameReady(now)
			for i, s := range c.steps {
				now = now.Add(rule.ProbeTimeout + poll)
				v := l.observe(rule, now, s.ok, "/health timed out after 10s", s.tokens, s.tokens >= 0)
				if v.routable != s.routable || v.hung != s.hung {
					t.Fatalf("step %d (ok=%v tokens=%g): routable=%v hung=%v, want routable=%v hung=%v (%s)", i, s.ok, s.tokens, v.routable, v.hung, s.routable, s.hung, v.why)
				}
				if !v.routable && !strings.Contains(v.why, "no progress") {
					t.Fatalf("step %d: reason %q does not say why", i, v.why)
				}
			}
		})
	}
}

// A hung engine (no answer, counters frozen) leaves routing within the
// stated bound and is restarted HungRestart after it left.
func TestHungEngineBounds(t *testing.T) {
	rule := profile.Readiness{ProbeTimeout: 10 * time.Second, Failures: 3, ProgressWindow: 30 * time.Second, HungRestart: 2 * time.Minute}
	const poll = 500 * time.Millisecond
	t0 := time.Unix(1_700_000_000, 0)
	var l liveness
	l.becameReady(t0)
	l.observe(rule, t0, true, "", 100, true)
	l.observe(rule, t0.Add(poll), true, "", 200, true) // the last progress
	hangAt := t0.Add(poll)
	now := hangAt
	var leftAt, hungAt time.Time
	for now.Sub(hangAt) < 10*time.Minute && hungAt.IsZero() {
		now = now.Add(poll + rule.ProbeTimeout) // every probe times out
		v := l.observe(rule, now, false, "timed out", 0, false)
		if !v.routable && leftAt.IsZero() {
			leftAt = now
		}
		if v.hung {
			hungAt = now
		}
	}
	bound := rule.HangBound(poll)
	if leftAt.IsZero() || leftAt.Sub(hangAt) > bound+rule.ProbeTimeout+poll {
		t.Fatalf("left routing %s after the hang, bound %s", leftAt.Sub(hangAt), bound)
	}
	if hungAt.Sub(leftAt) < rule.HungRestart || hungAt.Sub(leftAt) > rule.HungRestart+rule.ProbeTimeout+poll {
		t.Fatalf("judged hung %s after leaving routing, want %s", hungAt.Sub(leftAt), rule.HungRestart)
	}
}

// The start clock counts from the engine's start (after its pull), is
// pushed back by every sign of progress, and runs out on silence.
func TestStartClock(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var c startClock
	c.begin(t0)
	c.sawLog(t0, 100)
	c.sawWeights(t0, 1<<30)
	timeout := 30 * time.Minute
	now := t0
	for i := range 12 { // two hours of a download that keeps writing its log
		now = now.Add(10 * time.Minute)
		c.sawLog(now, int64(200+i))
		if c.expired(now, timeout) {
			t.Fatalf("expired after %s although the log grew every 10 minutes", now.Sub(t0))
		}
	}
	for i := range 6 { // weights growing, log silent
		now = now.Add(10 * time.Minute)
		c.sawWeights(now, int64(2+i)<<30)
		if c.expired(now, timeout) {
			t.Fatalf("expired although the weights dir grew")
		}
	}
	now = now.Add(timeout)
	if c.expired(now, timeout) {
		t.Fatal("expired at exactly the timeout")
	}
	now = now.Add(time.Second)
	if !c.expired(now, timeout) {
		t.Fatal("silent for longer than the timeout and not expired")
	}
}

// A reason cut to fit a record is cut at a character's start: half a
// UTF-8 sequence would make the note unprintable, and peers refuse a
// record with one.
func TestClipKeepsUTF8Whole(t *testing.T) {
	long := strings.Repeat("é", 200) // 400 bytes, two each
	for _, n := range []int{299, 300, 301} {
		got := Clip(long, n)
		if !utf8.ValidString(got) || len(got) > n+len("…") {
			t.Fatalf("clip to %d: %d bytes, valid UTF-8 %v", n, len(got), utf8.ValidString(got))
		}
	}
}
