// Package autoscale decides how many replicas an autoscaled deployment
// should run, from the load its engines report. It is pure: time comes in
// with each reading, and nothing here reads a clock, the network or a
// file.
//
// One node decides for each deployment at a time (supervisor's decider,
// chosen by rendezvous among alive nodes) and publishes the target; every
// node's placement reads that one number. A Decider holds what the rule
// needs to remember, the recommendations of the last scale-down delay;
// a node that becomes the decider starts with none, and so scales down
// only after a whole delay of its own readings (the safe direction).
//
// The rule, per reading:
//
//	demand    running + waiting requests over the replicas with a reading,
//	          plus the requests the gateways queue for it (their replicas
//	          are at their bound, so no engine shows those yet)
//	raw       ceil(demand / target_inflight), or the current target when
//	          demand is within 10 % of what it can hold (no move on noise);
//	          at least 1 with any demand; within [min, max]
//	up        raw above the target: the target becomes raw at once,
//	          capped at what fits (replicas placement could place)
//	down      only once a whole scale-down delay of readings is held and
//	          no replica is starting (a cold start's empty engine is not a
//	          lull); the target becomes the largest raw of the delay
//	          (Kubernetes' stabilisation window), so one quiet reading
//	          never removes a replica
//	no input  no replica had a reading: the target stays
//	zero      with min 0 the load takes the count down to one, never to
//	          zero: that step is the idle window's. Once a whole window of
//	          this decider's readings saw no request at any gateway and
//	          none in any engine, and no replica is starting, the target
//	          is 0; at 0, any request (a gateway's published rate, which
//	          counts the requests it holds) wakes it to 1 at once.
package autoscale

import (
	"fmt"
	"math"
	"time"
)

// DefaultTargetInflight is the running plus waiting requests per replica
// aimed at when a deployment names neither target_inflight nor
// max_num_seqs.
const DefaultTargetInflight = 8

// DefaultScaleDownDelay is how long demand must stay low before a replica
// is removed.
const DefaultScaleDownDelay = 5 * time.Minute

// Tolerance is the share by which demand may differ from what the
// current replicas hold before the target moves.
const Tolerance = 0.1

// DefaultIdleWindow is how long a deployment that may scale to zero must
// see no request before its last replica goes.
const DefaultIdleWindow = 10 * time.Minute

// Settings are a deployment's scaling fields, defaults filled in.
type Settings struct {
	Min, Max       int
	TargetInflight float64
	ScaleDownDelay time.Duration
	// IdleWindow governs the step to zero (Min 0 only).
	IdleWindow time.Duration
}

// Reading is one look at a deployment from the decider's read model.
type Reading struct {
	Now time.Time
	// Current is the target in force (the deployment's replicas before
	// any target was published).
	Current int
	// Ready and Starting count its replicas by their engines' state.
	Ready, Starting int
	// Demand is the running plus waiting requests summed over the
	// replicas with a reading, plus the requests the gateways queue for
	// the deployment; Readings is how many replicas had a reading.
	Demand   float64
	Readings int
	// Requests is the requests/s the gateways published for the
	// deployment, requests they hold for it (at zero) included.
	Requests float64
	// Fits is how many replicas placement could place right now: the
	// placed ones when some are unplaced for lack of room, else -1
	// (unknown: no replica is waiting for room).
	Fits int
}

// Decision is a target and why.
type Decision struct {
	Target int
	Reason string
	// Idle: this decider's own readings saw no request at any gateway and
	// none in any engine for the yield window (YieldAfter). The
	// deployment's replicas above its min may then give their GPUs to a
	// deployment with demand (placement's GPU sharing); a decider that
	// just took over says so only after a window of its own.
	Idle bool
	// LastBusy is this decider's last reading with a request (zero: none
	// yet).
	LastBusy time.Time
}

// MaxYieldAfter bounds YieldAfter: past a minute without a request a
// model's GPUs are better spent on a model somebody asks for.
const MaxYieldAfter = time.Minute

// YieldAfter is how long a deployment must see no request before it
// counts as idle for GPU sharing: the shortest of a minute, its
// scale-down delay and (with min 0) its idle window, so that a
// deployment that would scale down or to zero sooner yields as soon.
func YieldAfter(s Settings) time.Duration {
	w := MaxYieldAfter
	if s.ScaleDownDelay > 0 {
		w = min(w, s.ScaleDownDelay)
	}
	if s.Min == 0 && s.IdleWindow > 0 {
		w = min(w, s.IdleWindow)
	}
	return w
}

type recommendation struct {
	at  time.Time
	raw int
}

// Decider keeps one deployment's recommendations over its scale-down
// delay. The zero value is a decider that has seen nothing.
type Decider struct {
	recs []recommendation
	// first is this decider's first reading, lastBusy its last one with
	// a request anywhere: the step to zero needs a whole idle window of
	// its own readings.
	first, lastBusy time.Time
}

// Decide returns the target for r under s, and remembers r's
// recommendation.
func (d *Decider) Decide(s Settings, r Reading) Decision {
	idle := r.Demand == 0 && r.Requests == 0
	if d.first.IsZero() || r.Now.Before(d.first) {
		d.first, d.lastBusy = r.Now, time.Time{}
	}
	if !idle {
		d.lastBusy = r.Now
	}
	got := d.decide(s, r, idle)
	got.Idle = idle && d.quietFor(r.Now, YieldAfter(s))
	got.LastBusy = d.lastBusy
	return got
}

// quietFor: this decider's readings, for w up to now, saw no request.
func (d *Decider) quietFor(now time.Time, w time.Duration) bool {
	return !now.Before(d.first.Add(w)) && (d.lastBusy.IsZero() || !now.Before(d.lastBusy.Add(w)))
}

func (d *Decider) decide(s Settings, r Reading, idle bool) Decision {
	if s.TargetInflight <= 0 {
		s.TargetInflight = DefaultTargetInflight
	}
	cur := min(max(r.Current, s.Min), s.Max)
	if s.Min == 0 {
		if got, ok := d.zero(s, r, cur, idle); ok {
			return got
		}
	}
	if r.Readings == 0 {
		if r.Ready+r.Starting > 0 || cur > 0 {
			return Decision{Target: cur, Reason: "no load reading yet: target kept"}
		}
	}
	raw := int(math.Ceil(r.Demand / s.TargetInflight))
	if cur > 0 {
		if ratio := r.Demand / (s.TargetInflight * float64(cur)); math.Abs(ratio-1) <= Tolerance {
			raw = cur
		}
	}
	// Down to one by the load; the step to zero is the idle window's.
	raw = min(max(raw, s.Min, 1), s.Max)
	d.remember(r.Now, raw, s.ScaleDownDelay)
	load := fmt.Sprintf("%.0f in flight over %d replicas with a reading, %g per replica wanted", r.Demand, r.Readings, s.TargetInflight)
	switch {
	case raw > cur:
		if r.Fits >= 0 && raw > max(r.Fits, cur) {
			return Decision{Target: max(r.Fits, cur, s.Min), Reason: fmt.Sprintf("wants %d (%s) but only %d fit", raw, load, max(r.Fits, cur))}
		}
		return Decision{Target: raw, Reason: "scaling up: " + load}
	case raw < cur:
		if r.Starting > 0 {
			return Decision{Target: cur, Reason: fmt.Sprintf("would scale down to %d, not while %d replicas start", raw, r.Starting)}
		}
		if !d.covers(r.Now, s.ScaleDownDelay) {
			return Decision{Target: cur, Reason: fmt.Sprintf("would scale down to %d once demand stayed low for %s", raw, s.ScaleDownDelay)}
		}
		if peak := d.peak(); peak < cur {
			return Decision{Target: peak, Reason: fmt.Sprintf("scaling down: at most %d wanted over the last %s (%s)", peak, s.ScaleDownDelay, load)}
		}
		return Decision{Target: cur, Reason: fmt.Sprintf("would scale down to %d once demand stayed low for %s", raw, s.ScaleDownDelay)}
	}
	return Decision{Target: cur, Reason: "steady: " + load}
}

// zero decides the steps to and from zero of a deployment with Min 0:
// woken (to one) by any request at a gateway or in an engine, taken to
// zero once a whole idle window of this decider's readings saw none and
// no replica is starting. ok is false when the ordinary rule decides.
func (d *Decider) zero(s Settings, r Reading, cur int, idle bool) (Decision, bool) {
	window := s.IdleWindow
	if window <= 0 {
		window = DefaultIdleWindow
	}
	switch {
	case cur == 0 && !idle:
		return Decision{Target: min(1, s.Max), Reason: fmt.Sprintf("waking: %.2g requests/s at the gateways", r.Requests)}, true
	case cur == 0:
		return Decision{Target: 0, Reason: fmt.Sprintf("scaled to zero: no request for %s, wakes on request", window)}, true
	case idle && r.Starting == 0 && d.quietFor(r.Now, window):
		return Decision{Target: 0, Reason: fmt.Sprintf("scaled to zero: no request for %s, wakes on request", window)}, true
	}
	return Decision{}, false
}

// remember adds a recommendation and forgets those older than the delay,
// keeping the newest one at or before the window's start: it is what
// shows the window is covered.
func (d *Decider) remember(now time.Time, raw int, delay time.Duration) {
	if n := len(d.recs); n > 0 && now.Before(d.recs[n-1].at) {
		d.recs = d.recs[:0] // the clock went back: start over
	}
	d.recs = append(d.recs, recommendation{now, raw})
	from := now.Add(-delay)
	drop := 0
	for drop+1 < len(d.recs) && !d.recs[drop+1].at.After(from) {
		drop++
	}
	d.recs = d.recs[drop:]
}

// covers reports whether the recommendations reach back a whole delay.
func (d *Decider) covers(now time.Time, delay time.Duration) bool {
	return len(d.recs) > 0 && !d.recs[0].at.After(now.Add(-delay))
}

// peak is the largest recommendation held.
func (d *Decider) peak() int {
	p := 0
	for _, r := range d.recs {
		p = max(p, r.raw)
	}
	return p
}
