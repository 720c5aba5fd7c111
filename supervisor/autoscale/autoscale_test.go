package autoscale

import (
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 4, 2, 0, 0, 0, time.UTC)

func settings() Settings {
	return Settings{Min: 1, Max: 4, TargetInflight: 8, ScaleDownDelay: 5 * time.Minute}
}

// reading is the deployment at t0+at, current replicas all ready, each
// with a reading.
func reading(at time.Duration, current int, demand float64) Reading {
	return Reading{Now: t0.Add(at), Current: current, Ready: current, Demand: demand, Readings: current, Fits: -1}
}

// Up at once, to what the demand needs, never above max.
func TestScalesUpAtOnceWithinMax(t *testing.T) {
	var d Decider
	if got := d.Decide(settings(), reading(0, 1, 20)); got.Target != 3 || !strings.HasPrefix(got.Reason, "scaling up") {
		t.Errorf("20 in flight, 8 per replica: %+v, want 3", got)
	}
	if got := d.Decide(settings(), reading(10*time.Second, 3, 100)); got.Target != 4 {
		t.Errorf("100 in flight: %+v, want the max, 4", got)
	}
}

// Within the tolerance the target does not move: 8.5 in flight over one
// replica of 8 is noise, 9 is not.
func TestNoMoveWithinTolerance(t *testing.T) {
	var d Decider
	if got := d.Decide(settings(), reading(0, 1, 8.5)); got.Target != 1 {
		t.Errorf("8.5 on 1×8: %+v, want 1", got)
	}
	if got := d.Decide(settings(), reading(time.Second, 1, 9)); got.Target != 2 {
		t.Errorf("9 on 1×8: %+v, want 2", got)
	}
}

// Down only after a whole delay of low readings, to the largest wanted
// over it: one quiet reading removes nothing, and a burst within the
// delay keeps its replicas.
func TestScalesDownSlowlyToThePeakOfTheDelay(t *testing.T) {
	var d Decider
	s := settings()
	d.Decide(s, reading(0, 4, 30)) // 4 wanted
	for at := 10 * time.Second; at < 5*time.Minute; at += 10 * time.Second {
		if got := d.Decide(s, reading(at, 4, 0)); got.Target != 4 {
			t.Fatalf("at %s, within the delay of the last busy reading: %+v, want 4", at, got)
		}
	}
	// 5 min after the busy reading, it is still the window's oldest.
	if got := d.Decide(s, reading(5*time.Minute, 4, 0)); got.Target != 4 {
		t.Errorf("at the delay: %+v, want 4 (the busy reading is the window's edge)", got)
	}
	got := d.Decide(s, reading(5*time.Minute+10*time.Second, 4, 0))
	if got.Target != 1 || !strings.HasPrefix(got.Reason, "scaling down") {
		t.Errorf("a whole delay quiet: %+v, want the min, 1", got)
	}
	// A burst to 2 wanted, then quiet: 2 is kept for a delay.
	d.Decide(s, reading(6*time.Minute, 1, 12))
	if got := d.Decide(s, reading(6*time.Minute+10*time.Second, 2, 0)); got.Target != 2 {
		t.Errorf("right after the burst: %+v, want 2", got)
	}
}

// A replica starting has no load yet: the target does not fall while one
// starts, whatever the readings say.
func TestNoScaleDownWhileAReplicaStarts(t *testing.T) {
	var d Decider
	s := settings()
	s.ScaleDownDelay = 0
	r := reading(0, 3, 4) // 1 wanted
	r.Ready, r.Starting = 2, 1
	if got := d.Decide(s, r); got.Target != 3 || !strings.Contains(got.Reason, "not while 1 replicas start") {
		t.Errorf("one starting: %+v, want 3 kept", got)
	}
	r.Ready, r.Starting = 3, 0
	if got := d.Decide(s, r); got.Target != 1 {
		t.Errorf("none starting, no delay: %+v, want 1", got)
	}
}

// A decider that has just taken over (a node died) has no history: it
// scales down only after a delay of its own readings.
func TestANewDeciderWaitsAWholeDelay(t *testing.T) {
	var d Decider
	s := settings()
	if got := d.Decide(s, reading(time.Hour, 4, 0)); got.Target != 4 || !strings.Contains(got.Reason, "once demand stayed low for 5m0s") {
		t.Errorf("first reading of a new decider: %+v, want 4 kept", got)
	}
	if got := d.Decide(s, reading(time.Hour+5*time.Minute, 4, 0)); got.Target != 1 {
		t.Errorf("after its own delay: %+v, want 1", got)
	}
}

// Never below min, never above max, never above what fits; no reading
// keeps the target.
func TestBounds(t *testing.T) {
	s := settings()
	s.Min, s.ScaleDownDelay = 2, 0
	var d Decider
	if got := d.Decide(s, reading(0, 2, 0)); got.Target != 2 {
		t.Errorf("idle at min 2: %+v", got)
	}
	var fresh Decider
	if got := fresh.Decide(settings(), reading(0, 7, 0)); got.Target != 4 {
		t.Errorf("a current above max (the operator lowered it): %+v, want 4", got)
	}
	r := reading(0, 2, 40)
	r.Fits = 3
	if got := d.Decide(s, r); got.Target != 3 || !strings.Contains(got.Reason, "only 3 fit") {
		t.Errorf("5 wanted, 3 fit: %+v", got)
	}
	r = reading(0, 2, 40)
	r.Readings = 0
	if got := d.Decide(s, r); got.Target != 2 || !strings.HasPrefix(got.Reason, "no load reading") {
		t.Errorf("no reading: %+v", got)
	}
}

// Two deciders fed the same deployment, one a publication behind the
// other (its readings 15 s older), through a ramp up and a ramp down: the
// one behind always decides what the other decided then or now, and both
// end at the same target. This is what a decider that takes over from
// another with a view one publication old does: it moves no replica the
// other would not have moved.
func TestDecidersOnePublicationApartAgree(t *testing.T) {
	s := settings()
	s.Max = 8
	var a, b Decider
	curA, curB := 1, 1
	var demand []float64
	for i := range 40 {
		demand = append(demand, float64(min(i, 20))*3) // up to 60
	}
	for i := range 60 {
		demand = append(demand, max(60-float64(i)*2, 0))
	}
	prevA, lagged := 1, 0
	for i, dm := range demand {
		at := time.Duration(i) * 15 * time.Second
		behind := dm
		if i > 0 {
			behind = demand[i-1]
		}
		ga := a.Decide(s, reading(at, curA, dm))
		gb := b.Decide(s, reading(at, curB, behind))
		// The one behind decides what the other decided then or now:
		// never a target of its own, never further off than one
		// publication, up or down.
		if gb.Target != ga.Target && gb.Target != prevA {
			t.Errorf("reading %d (%g in flight, %g behind): %d, and %d one behind (previous %d)", i, dm, behind, ga.Target, gb.Target, prevA)
		}
		if ga.Target != gb.Target {
			lagged++
		}
		prevA = ga.Target
		curA, curB = ga.Target, gb.Target
	}
	t.Logf("the one behind lagged on %d of %d readings", lagged, len(demand))
	if curA != curB || curA != 1 {
		t.Errorf("after the ramp down: %d and %d, want both at min 1", curA, curB)
	}
}

// With min 0: one quiet reading takes nothing to zero, nor does the
// scale-down delay; a whole idle window of this decider's readings with
// no request anywhere does. A request at a gateway wakes it to one at
// once; a decider that just took over waits a whole window of its own.
func TestScaleToZeroAndWake(t *testing.T) {
	s := settings()
	s.Min, s.ScaleDownDelay, s.IdleWindow = 0, 10*time.Second, time.Minute
	var d Decider
	r := reading(0, 1, 0)
	r.Requests = 0.5
	if got := d.Decide(s, r); got.Target != 1 {
		t.Fatalf("busy at one: %+v", got)
	}
	for at := 10 * time.Second; at < 60*time.Second; at += 10 * time.Second {
		if got := d.Decide(s, reading(at, 1, 0)); got.Target != 1 {
			t.Fatalf("at %s, idle for less than the window: %+v, want 1 (the scale-down delay does not take the last replica)", at, got)
		}
	}
	got := d.Decide(s, reading(60*time.Second, 1, 0))
	if got.Target != 0 || !strings.HasPrefix(got.Reason, "scaled to zero: no request for 1m0s") {
		t.Fatalf("idle for the window: %+v, want 0", got)
	}
	if got := d.Decide(s, reading(80*time.Second, 0, 0)); got.Target != 0 {
		t.Errorf("at zero, idle: %+v", got)
	}
	r = reading(90*time.Second, 0, 0)
	r.Requests = 0.1 // a request held at a gateway
	if got := d.Decide(s, r); got.Target != 1 || !strings.HasPrefix(got.Reason, "waking") {
		t.Errorf("a request at zero: %+v, want 1", got)
	}
	var fresh Decider
	if got := fresh.Decide(s, reading(time.Hour, 1, 0)); got.Target != 1 {
		t.Errorf("a new decider's first idle reading: %+v, want 1 kept", got)
	}
	if got := fresh.Decide(s, reading(time.Hour+time.Minute, 1, 0)); got.Target != 0 {
		t.Errorf("a new decider after its own idle window: %+v, want 0", got)
	}
	// A replica starting (woken, loading) is not idle for the window.
	r = reading(3*time.Hour, 1, 0)
	r.Ready, r.Starting = 0, 1
	var waking Decider
	waking.Decide(s, reading(2*time.Hour, 1, 0))
	if got := waking.Decide(s, r); got.Target != 1 {
		t.Errorf("starting, idle past the window: %+v, want 1", got)
	}
}

// Idle for GPU sharing: only after a yield window of this decider's own
// readings with no request (a decider that just took over knows nothing
// of the time before it), and no longer from the first request.
func TestIdleForSharing(t *testing.T) {
	s := Settings{Min: 0, Max: 2, TargetInflight: 8, ScaleDownDelay: 5 * time.Minute, IdleWindow: 30 * time.Second}
	if w := YieldAfter(s); w != 30*time.Second {
		t.Fatalf("yield after %s, want the idle window, 30s (shorter than a minute and the delay)", w)
	}
	var d Decider
	if got := d.Decide(s, reading(0, 1, 0)); got.Idle {
		t.Errorf("first reading: idle %+v", got)
	}
	if got := d.Decide(s, reading(29*time.Second, 1, 0)); got.Idle {
		t.Errorf("29 s of quiet readings: idle %+v", got)
	}
	if got := d.Decide(s, reading(30*time.Second, 1, 0)); !got.Idle || !got.LastBusy.IsZero() {
		t.Errorf("30 s of quiet readings: %+v, want idle, never busy", got)
	}
	r := reading(40*time.Second, 1, 0)
	r.Requests = 0.5 // a gateway's rate: a request held, say
	if got := d.Decide(s, r); got.Idle || !got.LastBusy.Equal(r.Now) {
		t.Errorf("a request: %+v, want busy at %s", got, r.Now)
	}
	if got := d.Decide(s, reading(69*time.Second, 1, 0)); got.Idle {
		t.Errorf("29 s after the request: idle %+v", got)
	}
	if got := d.Decide(s, reading(70*time.Second, 1, 0)); !got.Idle {
		t.Errorf("30 s after the request: %+v, want idle", got)
	}
	if w := YieldAfter(Settings{Min: 1, ScaleDownDelay: 5 * time.Minute, IdleWindow: 10 * time.Second}); w != time.Minute {
		t.Errorf("min 1: yield after %s, want a minute (the idle window is min 0's)", w)
	}
	if w := YieldAfter(Settings{Min: 1, ScaleDownDelay: 20 * time.Second}); w != 20*time.Second {
		t.Errorf("a 20 s delay: yield after %s, want 20s", w)
	}
}
