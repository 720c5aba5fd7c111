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
//	demand    running + waiting requests over the replicas with a reading
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

// Settings are a deployment's scaling fields, defaults filled in.
type Settings struct {
	Min, Max       int
	TargetInflight float64
	ScaleDownDelay time.Duration
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
	// replicas with a reading, and Readings how many had one.
	Demand   float64
	Readings int
	// Fits is how many replicas placement could place right now: the
	// placed ones when some are unplaced for lack of room, else -1
	// (unknown: no replica is waiting for room).
	Fits int
}

// Decision is a target and why.
type Decision struct {
	Target int
	Reason string
}

type recommendation struct {
	at  time.Time
	raw int
}

// Decider keeps one deployment's recommendations over its scale-down
// delay. The zero value is a decider that has seen nothing.
type Decider struct {
	recs []recommendation
}

// Decide returns the target for r under s, and remembers r's
// recommendation.
func (d *Decider) Decide(s Settings, r Reading) Decision {
	if s.TargetInflight <= 0 {
		s.TargetInflight = DefaultTargetInflight
	}
	cur := min(max(r.Current, s.Min), s.Max)
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
	if r.Demand > 0 {
		raw = max(raw, 1)
	}
	raw = min(max(raw, s.Min), s.Max)
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
