package engine

import (
	"fmt"
	"time"

	"github.com/llmgw/llmgw/supervisor/profile"
)

// Busy is not dead. A real engine's health check is slow when the engine
// is busy: vLLM's /health runs on the asyncio loop that streams every
// answer (30-40 s under heavy load, vllm PR #38157), SGLang's default
// /health runs a generation. One slow probe therefore says nothing, and
// taking a busy engine out of routing sends its traffic to the others,
// which then slow down too: a cascade at the moment of highest demand.
//
// The rule, judged by liveness below from what one poll saw:
//
//	routable ⇔ the process runs, and NOT (Failures probes in a row failed
//	           or timed out AND the token counters did not move during the
//	           last ProgressWindow)
//
// An idle engine shows no progress, so for it the failures alone decide.
// An engine that is not routable and shows no progress for HungRestart,
// after having been ready, is hung: the runner restarts it (a crash).

// liveness is what one engine's watcher remembers between polls to judge
// the rule. Only the watch goroutine touches it.
type liveness struct {
	// failures counts probes in a row that failed or timed out.
	failures int
	// lastFailure says how the last probe failed, for the log and the note.
	lastFailure string
	// counters is the last token count read from /metrics (prompt plus
	// generation tokens), and haveCounters whether there is one.
	counters     float64
	haveCounters bool
	// progressAt is when the counters were last seen to move.
	progressAt time.Time
	// routable is the last verdict, once the engine has been ready.
	routable bool
	// unroutableSince is when the engine last left routing (zero while
	// routable).
	unroutableSince time.Time
}

// verdict is liveness's judgement after one poll.
type verdict struct {
	routable bool
	// changed: routable differs from the previous poll's verdict.
	changed bool
	// hung: not routable and no progress for HungRestart: restart it.
	hung bool
	// why says, when not routable, the reason in words.
	why string
}

// observe folds one poll into l: whether the probes passed (failure says
// how they failed otherwise) and, when /metrics could be read, the token
// counters. It returns the verdict for an engine that has been ready
// before; before its first readiness an engine is judged by its probes
// alone (see check).
func (l *liveness) observe(rule profile.Readiness, now time.Time, probeOK bool, failure string, counters float64, haveCounters bool) verdict {
	if haveCounters {
		if l.haveCounters && counters != l.counters {
			l.progressAt = now
		}
		l.counters, l.haveCounters = counters, true
	}
	if probeOK {
		l.failures, l.lastFailure = 0, ""
	} else {
		l.failures++
		l.lastFailure = failure
	}
	progressing := !l.progressAt.IsZero() && now.Sub(l.progressAt) < rule.ProgressWindow
	routable := l.failures < max(rule.Failures, 1) || progressing
	v := verdict{routable: routable, changed: routable != l.routable}
	l.routable = routable
	switch {
	case routable:
		l.unroutableSince = time.Time{}
	case v.changed || l.unroutableSince.IsZero():
		l.unroutableSince = now
	}
	if !routable {
		v.why = fmt.Sprintf("%d probes in a row failed (last: %s) and no progress in its counters for %s", l.failures, l.lastFailure, l.sinceProgress(now, rule))
		// Progress makes it routable again, so unroutable for
		// HungRestart means no progress for at least as long.
		v.hung = rule.HungRestart > 0 && now.Sub(l.unroutableSince) >= rule.HungRestart
	}
	return v
}

// sinceProgress says how long the counters have been still, as far as
// this watcher knows.
func (l *liveness) sinceProgress(now time.Time, rule profile.Readiness) string {
	if l.progressAt.IsZero() {
		return fmt.Sprintf("at least %s", rule.ProgressWindow)
	}
	return now.Sub(l.progressAt).Round(time.Second).String()
}

// becameReady resets l for an engine that just passed its first probes:
// it is routable, and every later failure is judged by the rule. Becoming
// ready counts as progress, so the window starts there: without two
// counter readings yet, an engine just ready would otherwise count as
// still for the whole window at its first slow probe.
func (l *liveness) becameReady(now time.Time) {
	*l = liveness{routable: true, counters: l.counters, haveCounters: l.haveCounters, progressAt: now}
}

// startClock is how long a starting engine may take: StartTimeout counted
// from the end of its image pull, extended by every sign of progress (its
// log or the weights cache growing), so a 140 GB download that keeps
// writing is never killed, while a silent engine is.
type startClock struct {
	// activityAt is the last sign of progress, or when the current
	// attempt's engine started (after its pull); logSize and weightsSize
	// the sizes it was judged from (-1: not read yet).
	activityAt  time.Time
	logSize     int64
	weightsSize int64
	// weightsAt is when the model's weights were last measured (walked,
	// so at most every weightsEvery).
	weightsAt time.Time
}

// weightsEvery bounds how often a starting engine's model directory in the
// weights dir is walked.
const weightsEvery = 15 * time.Second

// begin starts the clock for an attempt whose engine started at now.
func (c *startClock) begin(now time.Time) {
	*c = startClock{activityAt: now, logSize: -1, weightsSize: -1}
}

// sawLog notes the engine log's size; growth is progress.
func (c *startClock) sawLog(now time.Time, size int64) {
	if c.logSize >= 0 && size > c.logSize {
		c.activityAt = now
	}
	c.logSize = size
}

// sawWeights notes the weights dir's size; growth is progress.
func (c *startClock) sawWeights(now time.Time, size int64) {
	if c.weightsSize >= 0 && size > c.weightsSize {
		c.activityAt = now
	}
	c.weightsSize, c.weightsAt = size, now
}

// expired reports whether the engine has been silent for longer than
// timeout since its last sign of progress (or since it started).
func (c *startClock) expired(now time.Time, timeout time.Duration) bool {
	return !c.activityAt.IsZero() && now.Sub(c.activityAt) > timeout
}
