package gateway

import (
	"context"
	"sync"
	"time"
)

// replica is what the gateway learns about one upstream engine while
// routing to it: its scraped load, this gateway's requests in flight to it,
// and its recent connection failures. It outlives table rebuilds (the
// gateway carries it over by route key), so a view change neither forgets
// an ejection nor loses the in-flight count.
type replica struct {
	mu sync.Mutex

	// epoch advances when a scrape starts. A request remembers the epoch it
	// started in; the scrape begun in epoch e counts (roughly) every
	// request started before it, so the correction to a scraped value is
	// the requests in flight that started in its epoch or later.
	epoch      uint64
	started    map[uint64]int // requests in flight, by the epoch they started in
	inflight   int
	scraped    float64
	scrapedAt  time.Time
	valueEpoch uint64
	// gone is how many requests the value counted have ended since it was
	// read: this gateway's own, the only ones it knows of.
	gone       int
	haveValue  bool
	scraping   bool
	lastScrape time.Time // when the last scrape started

	// meanDur is a moving mean of how long the engine took over the
	// requests it served to the end; zero before the first.
	meanDur time.Duration

	// failures counts, in a row, what a broken engine shows the gateway:
	// connection failures, 500/502/504 answers and first-byte timeouts.
	failures     int
	ejectedUntil time.Time

	// calls cancels the attempts in flight to the engine, by id, so that
	// an engine that leaves routing unready can be let go of (cut).
	calls    map[uint64]context.CancelCauseFunc
	lastCall uint64
	// cut is, once the engine left routing unready, why: an attempt that
	// begins after it chose the engine from the table just replaced, and
	// is cancelled at once.
	cut error
}

// ticket is one request to the replica, from begin to end or finish.
type ticket struct {
	epoch uint64
	at    time.Time
}

// maxScrapeInterval is the longest the gateway goes between scrapes of an
// engine it sends to, however long its requests last.
const maxScrapeInterval = time.Second

// interval is how often the replica is scraped while it is sent to: a
// tenth of its requests' mean duration, no more often than floor and no
// less often than maxScrapeInterval (or floor, if that is longer).
//
// A reading goes stale as the requests it counted end and others begin, so
// how often to read depends on how long requests last: with two-second
// answers a reading a second old still holds most of what it counted; with
// the 0.2 s answers of a benchmark it holds almost nothing. Reading a
// tenth of a request's life apart keeps the estimate within about a tenth
// of the load, and spares engines that serve long answers (vLLM renders
// /metrics in its API server's own process) from being read twenty times a
// second by every gateway. The caller holds mu.
func (r *replica) interval(floor time.Duration) time.Duration {
	return min(max(r.meanDur/10, floor), max(floor, maxScrapeInterval))
}

// staleAfter is the least age past which a reading is not chosen by.
const staleAfter = 3 * time.Second

// fresh is how long a reading is chosen by: three of the longest
// intervals, or staleAfter if that is longer (with a floor under a second,
// staleAfter). A reading older than that means the scrapes fail, and the
// gossiped load is the better guess. (A younger one may merely be as old
// as this gateway's last request to the engine; corrected by the requests
// since, it is still better than the gossiped one.)
func fresh(floor time.Duration) time.Duration {
	return max(3*max(floor, maxScrapeInterval), staleAfter)
}

func newReplica() *replica { return &replica{started: map[uint64]int{}} }

// begin counts a request to the replica, sent at now; end or finish
// uncounts it.
func (r *replica) begin(now time.Time) ticket {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.started[r.epoch]++
	r.inflight++
	return ticket{epoch: r.epoch, at: now}
}

// end uncounts a request the engine did not serve (it refused it, or the
// connection failed).
func (r *replica) end(t ticket) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endLocked(t.epoch)
}

// finish is end for a request the engine served to the end. If the last
// scrape counted it (it started before the scrape began and ends after the
// reading), the engine no longer holds it, and load leaves it out until
// the next scrape: otherwise a reading would go on counting this gateway's
// finished requests as long as it is chosen by, and the bound would spill
// a prefix off a replica that is emptying. Other gateways' finished
// requests stay counted; this one cannot know of them, and counting them
// gone without knowing could break the bound. The request's duration
// feeds the mean that sets the scrape interval.
func (r *replica) finish(t ticket, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.haveValue && t.epoch < r.valueEpoch && now.After(r.scrapedAt) {
		r.gone++
	}
	if d := now.Sub(t.at); d > 0 {
		if r.meanDur == 0 {
			r.meanDur = d
		} else {
			r.meanDur += (d - r.meanDur) / 8
		}
	}
	r.endLocked(t.epoch)
}

func (r *replica) endLocked(epoch uint64) {
	r.inflight--
	if n, ok := r.started[epoch]; ok {
		if n <= 1 {
			delete(r.started, epoch)
		} else {
			r.started[epoch] = n - 1
		}
	}
}

// inFlight is this gateway's requests in flight to the replica.
func (r *replica) inFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inflight
}

// load estimates the replica's running plus waiting requests. A fresh
// scrape (see fresh; floor is the shortest interval) counts with the
// requests this gateway sent since it began, less those of its requests it
// counted that have finished since. Without one, the gossiped reading is
// up to a record's publication interval old and may already include some of this gateway's requests,
// so the larger of the two is taken rather than their sum, which would
// count those twice.
//
// own is the part of the load that is this gateway's requests the engine
// had not counted: those since the scrape, or, without one, every request
// in flight when they are the larger term.
func (r *replica) load(now time.Time, floor time.Duration, gossiped float64) (load, own float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.haveValue && now.Sub(r.scrapedAt) <= fresh(floor) {
		since := 0
		for e, n := range r.started {
			if e >= r.valueEpoch {
				since += n
			}
		}
		return max(0, r.scraped-float64(r.gone)) + float64(since), float64(since)
	}
	if in := float64(r.inflight); in > gossiped {
		return in, in
	}
	return gossiped, 0
}

// scrapeDue reports whether a scrape should start now and, if so, marks it
// started: at most one at a time, and at most one per interval (floor
// being the shortest).
func (r *replica) scrapeDue(now time.Time, floor time.Duration) (epoch uint64, due bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.scraping || (!r.lastScrape.IsZero() && now.Sub(r.lastScrape) < r.interval(floor)) {
		return 0, false
	}
	r.scraping, r.lastScrape = true, now
	r.epoch++
	return r.epoch, true
}

// scrapeDone records a scrape begun in epoch; ok false keeps the previous
// value, which ages out of use by itself.
func (r *replica) scrapeDone(epoch uint64, value float64, at time.Time, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.scraping = false
	if !ok {
		return
	}
	r.scraped, r.scrapedAt, r.valueEpoch, r.haveValue, r.gone = value, at, epoch, true, 0
	for e := range r.started {
		if e < epoch {
			delete(r.started, e)
		}
	}
}

// track registers an attempt's cancel function until untrack; an attempt
// to an engine already cut is cancelled at once.
func (r *replica) track(cancel context.CancelCauseFunc) (id uint64) {
	r.mu.Lock()
	cut := r.cut
	if cut == nil {
		if r.calls == nil {
			r.calls = map[uint64]context.CancelCauseFunc{}
		}
		r.lastCall++
		id = r.lastCall
		r.calls[id] = cancel
	}
	r.mu.Unlock()
	if cut != nil {
		cancel(cut)
	}
	return id
}

func (r *replica) untrack(id uint64) {
	if id == 0 {
		return
	}
	r.mu.Lock()
	delete(r.calls, id)
	r.mu.Unlock()
}

// cutAll cancels every attempt in flight to the engine with cause, and
// those that begin until uncut.
func (r *replica) cutAll(cause error) {
	r.mu.Lock()
	r.cut = cause
	calls := r.calls
	r.calls = nil
	r.mu.Unlock()
	for _, cancel := range calls {
		cancel(cause)
	}
}

// uncut lets attempts to the engine run again: it is routable anew.
func (r *replica) uncut() {
	r.mu.Lock()
	r.cut = nil
	r.mu.Unlock()
}

// ejected reports whether passive outlier detection skips the replica now.
func (r *replica) ejected(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return now.Before(r.ejectedUntil)
}

// failed counts a failure (see failures); the replica is ejected for
// ejectFor once after failures in a row. It reports whether this call
// ejected it.
func (r *replica) failed(now time.Time, after int, ejectFor time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures++
	if r.failures >= after {
		r.ejectedUntil = now.Add(ejectFor)
		r.failures = 0
		return true
	}
	return false
}

// eject skips the replica for d at once (an engine that refuses the
// gateway's key will refuse every request).
func (r *replica) eject(now time.Time, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ejectedUntil = now.Add(d)
	r.failures = 0
}

// answered resets the failure count and lifts an ejection: the engine is
// reachable and answers (a request tried it in panic mode, and the first
// byte of an answer came back, or a busy answer).
func (r *replica) answered() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures, r.ejectedUntil = 0, time.Time{}
}
