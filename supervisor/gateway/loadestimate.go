package gateway

import (
	"sync"
	"time"
)

// loadEstimate is the gateway's estimate of one engine's running plus
// waiting requests: its last scrape of the engine's /metrics, corrected by
// this gateway's own requests since, with the gossiped reading as the
// fallback. It also holds this gateway's requests in flight to the engine,
// which the correction is made of. The zero value is an engine never
// scraped, with nothing in flight.
type loadEstimate struct {
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
}

// ticket is one request to the replica, from begin to end or finish.
type ticket struct {
	epoch uint64
	at    time.Time
}

// maxScrapeInterval is the longest the gateway goes between scrapes of an
// engine it sends to, however long its requests last.
const maxScrapeInterval = time.Second

// interval is how often the engine is scraped while it is sent to: a
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
func (l *loadEstimate) interval(floor time.Duration) time.Duration {
	return min(max(l.meanDur/10, floor), max(floor, maxScrapeInterval))
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

// begin counts a request to the engine, sent at now; end or finish
// uncounts it.
func (l *loadEstimate) begin(now time.Time) ticket {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started == nil {
		l.started = map[uint64]int{}
	}
	l.started[l.epoch]++
	l.inflight++
	return ticket{epoch: l.epoch, at: now}
}

// end uncounts a request the engine did not serve (it refused it, or the
// connection failed).
func (l *loadEstimate) end(t ticket) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.endLocked(t.epoch)
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
func (l *loadEstimate) finish(t ticket, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.haveValue && t.epoch < l.valueEpoch && now.After(l.scrapedAt) {
		l.gone++
	}
	if d := now.Sub(t.at); d > 0 {
		if l.meanDur == 0 {
			l.meanDur = d
		} else {
			l.meanDur += (d - l.meanDur) / 8
		}
	}
	l.endLocked(t.epoch)
}

func (l *loadEstimate) endLocked(epoch uint64) {
	l.inflight--
	if n, ok := l.started[epoch]; ok {
		if n <= 1 {
			delete(l.started, epoch)
		} else {
			l.started[epoch] = n - 1
		}
	}
}

// inFlight is this gateway's requests in flight to the engine.
func (l *loadEstimate) inFlight() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inflight
}

// estimate is the engine's running plus waiting requests. A fresh
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
func (l *loadEstimate) estimate(now time.Time, floor time.Duration, gossiped float64) (load, own float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.haveValue && now.Sub(l.scrapedAt) <= fresh(floor) {
		since := 0
		for e, n := range l.started {
			if e >= l.valueEpoch {
				since += n
			}
		}
		return max(0, l.scraped-float64(l.gone)) + float64(since), float64(since)
	}
	if in := float64(l.inflight); in > gossiped {
		return in, in
	}
	return gossiped, 0
}

// scrapeDue reports whether a scrape should start now and, if so, marks it
// started: at most one at a time, and at most one per interval (floor
// being the shortest).
func (l *loadEstimate) scrapeDue(now time.Time, floor time.Duration) (epoch uint64, due bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.scraping || (!l.lastScrape.IsZero() && now.Sub(l.lastScrape) < l.interval(floor)) {
		return 0, false
	}
	l.scraping, l.lastScrape = true, now
	l.epoch++
	return l.epoch, true
}

// scrapeDone records a scrape begun in epoch; ok false keeps the previous
// value, which ages out of use by itself.
func (l *loadEstimate) scrapeDone(epoch uint64, value float64, at time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.scraping = false
	if !ok {
		return
	}
	// Requests begun while the scrape was in flight (epoch) reached the
	// engine before its read as often as not; they are taken as counted
	// by it, and the requests since are those begun after the read (a new
	// epoch). Taken as not counted, a request that was would be counted
	// twice for as long as it runs, and a replica at its bound (queue.go)
	// would keep a slot idle that long; taken as counted, one that was
	// not is missed until it ends or the next read, and the engine queues
	// it: the cheaper error.
	l.epoch++
	l.scraped, l.scrapedAt, l.valueEpoch, l.haveValue, l.gone = value, at, l.epoch, true, 0
	for e := range l.started {
		if e < l.epoch {
			delete(l.started, e)
		}
	}
}
