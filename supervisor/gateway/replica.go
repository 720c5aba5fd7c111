package gateway

import (
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
	haveValue  bool
	scraping   bool
	lastScrape time.Time // when the last scrape started

	failures     int // connection failures in a row
	ejectedUntil time.Time
}

func newReplica() *replica { return &replica{started: map[uint64]int{}} }

// begin counts a request to the replica; end(epoch) uncounts it.
func (r *replica) begin() (epoch uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.started[r.epoch]++
	r.inflight++
	return r.epoch
}

func (r *replica) end(epoch uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
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

// load estimates the replica's running plus waiting requests. A scrape no
// older than fresh counts with the requests this gateway sent since it
// began; without one, the gossiped reading is up to a record's publication
// interval old and may already include some of this gateway's requests,
// so the larger of the two is taken rather than their sum, which would
// count those twice.
//
// own is the part of the load that is this gateway's requests the engine
// had not counted: those since the scrape, or, without one, every request
// in flight when they are the larger term.
func (r *replica) load(now time.Time, fresh time.Duration, gossiped float64) (load, own float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.haveValue && now.Sub(r.scrapedAt) <= fresh {
		since := 0
		for e, n := range r.started {
			if e >= r.valueEpoch {
				since += n
			}
		}
		return r.scraped + float64(since), float64(since)
	}
	if in := float64(r.inflight); in > gossiped {
		return in, in
	}
	return gossiped, 0
}

// scrapeDue reports whether a scrape should start now and, if so, marks it
// started: at most one at a time, and at most one per interval.
func (r *replica) scrapeDue(now time.Time, interval time.Duration) (epoch uint64, due bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.scraping || (!r.lastScrape.IsZero() && now.Sub(r.lastScrape) < interval) {
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
	r.scraped, r.scrapedAt, r.valueEpoch, r.haveValue = value, at, epoch, true
	for e := range r.started {
		if e < epoch {
			delete(r.started, e)
		}
	}
}

// ejected reports whether passive outlier detection skips the replica now.
func (r *replica) ejected(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return now.Before(r.ejectedUntil)
}

// connectFailed counts a failure to connect; the replica is ejected for
// ejectFor once after failures in a row. It reports whether this call
// ejected it.
func (r *replica) connectFailed(now time.Time, after int, ejectFor time.Duration) bool {
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
// reachable (a request tried it in panic mode, and it answered).
func (r *replica) answered() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures, r.ejectedUntil = 0, time.Time{}
}
