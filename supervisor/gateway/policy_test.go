package gateway

import (
	"context"
	"testing"
	"time"
)

func TestLeastLoadChoosesLowestAndRotatesTies(t *testing.T) {
	p := &LeastLoad{}
	cands := []Candidate{{Load: 4}, {Load: 1}, {Load: 2}}
	for range 5 {
		if i := p.Choose(nil, cands).Index; i != 1 {
			t.Fatalf("chose %d, want 1 (load 1)", i)
		}
	}
	ties := []Candidate{{Load: 0}, {Load: 0}, {Load: 0}}
	seen := map[int]int{}
	for range 30 {
		seen[p.Choose(nil, ties).Index]++
	}
	if len(seen) != 3 || seen[0] != 10 || seen[1] != 10 || seen[2] != 10 {
		t.Fatalf("ties chosen %v, want an even share", seen)
	}
}

// The load of a replica is its last scrape plus this gateway's requests
// started since that scrape began: requests the scrape already counted are
// not counted again, and those it could not have seen are.
func TestLoadCorrectsScrapeByInflightSinceIt(t *testing.T) {
	r := &loadEstimate{}
	floor := time.Second // no requests finished yet: scraped every second
	// Two requests before any scrape: without a scrape, the gossiped 5
	// wins over 2 in flight (they may be among the 5).
	a, b := r.begin(t0), r.begin(t0)
	if got, _ := r.estimate(t0, floor, 5); got != 5 {
		t.Fatalf("no scrape, gossip 5, 2 in flight: load %v, want 5", got)
	}
	if got, _ := r.estimate(t0, floor, 1); got != 2 {
		t.Fatalf("no scrape, gossip 1, 2 in flight: load %v, want 2", got)
	}
	// A scrape starts; one request, c, arrives while it runs; it reads 7
	// (the engine counts a and b among them, and c, which reached it
	// before the read: a request begun during a scrape is taken as
	// counted, see scrapeDone).
	e, due := r.scrapeDue(t0, floor)
	if !due {
		t.Fatal("first scrape not due")
	}
	c := r.begin(t0)
	at := t0.Add(10 * time.Millisecond)
	if _, due := r.scrapeDue(at, floor); due {
		t.Fatal("a second scrape due while the first is in flight")
	}
	r.scrapeDone(e, 7, at, true)
	if got, own := r.estimate(at, floor, 0); got != 7 || own != 0 {
		t.Fatalf("scraped 7, the request begun during the scrape in it: load %v own %v, want 7 and 0 (not 8: counted twice, it would hold a slot idle)", got, own)
	}
	// a is refused after the reading: the engine never held it, so the
	// reading stands. b is served to its end after the reading: the
	// engine held it and no longer does.
	r.end(a)
	if got, _ := r.estimate(at, floor, 0); got != 7 {
		t.Fatalf("after a request the engine refused: load %v, want 7", got)
	}
	r.finish(b, at.Add(time.Millisecond))
	if got, own := r.estimate(at, floor, 0); got != 6 || own != 0 {
		t.Fatalf("after a request the scrape counted finished: load %v own %v, want 6 and 0", got, own)
	}
	d := r.begin(at)
	if got, own := r.estimate(at, floor, 0); got != 7 || own != 1 {
		t.Fatalf("one begun after the read: load %v own %v, want 7 and 1", got, own)
	}
	// c, taken as counted by the reading, finishes: the engine no longer
	// holds it.
	r.finish(c, at.Add(time.Millisecond))
	if got, own := r.estimate(at, floor, 0); got != 6 || own != 1 {
		t.Fatalf("the request begun during the scrape finished: load %v own %v, want 6 and 1", got, own)
	}
	// No second scrape within the interval; the next one resets both
	// corrections.
	if _, due := r.scrapeDue(t0.Add(500*time.Millisecond), floor); due {
		t.Fatal("a scrape within the interval")
	}
	e, _ = r.scrapeDue(t0.Add(time.Second), floor)
	r.scrapeDone(e, 1, t0.Add(time.Second), true)
	if got, own := r.estimate(t0.Add(time.Second), floor, 0); got != 1 || own != 0 {
		t.Fatalf("fresh scrape 1, nothing since: load %v own %v, want 1 and 0", got, own)
	}
	r.finish(d, t0.Add(time.Second+time.Millisecond))
	if got, _ := r.estimate(t0.Add(time.Second), floor, 0); got != 0 {
		t.Fatalf("the one request the fresh scrape counted finished: load %v, want 0", got)
	}
	// A reading is chosen by for 3 s (three intervals when longer) even
	// when scrapes are 50 ms apart: at a request a second, each finds the
	// reading its predecessor started. Past that, scrapes fail, and the
	// gossiped load is the better guess.
	if got, _ := r.estimate(t0.Add(3900*time.Millisecond), 50*time.Millisecond, 4); got != 0 {
		t.Fatalf("a reading 2.9 s old: load %v, want the reading's 0 over the gossiped 4", got)
	}
	if got, _ := r.estimate(t0.Add(4100*time.Millisecond), 50*time.Millisecond, 4); got != 4 {
		t.Fatalf("a reading 3.1 s old: load %v, want the gossiped 4", got)
	}
	if r.inFlight() != 0 {
		t.Fatalf("in flight %d", r.inFlight())
	}
}

// Engines are read a tenth of their requests' duration apart, within the
// floor and a second: staleness is relative to how long requests last.
func TestScrapeIntervalFollowsRequestDuration(t *testing.T) {
	const floor = 50 * time.Millisecond
	serve := func(r *loadEstimate, d time.Duration, n int) {
		for range n {
			r.finish(r.begin(t0), t0.Add(d))
		}
	}
	due := func(r *loadEstimate, after time.Duration) bool {
		e, ok := r.scrapeDue(t0.Add(after), floor)
		if ok {
			r.scrapeDone(e, 0, time.Time{}, false)
		}
		return ok
	}
	for _, tc := range []struct {
		name     string
		dur      time.Duration
		interval time.Duration
	}{
		{"no requests yet", 0, floor},
		{"0.2 s answers", 200 * time.Millisecond, floor},
		{"4 s answers", 4 * time.Second, 400 * time.Millisecond},
		{"a minute's answers", time.Minute, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &loadEstimate{}
			if tc.dur > 0 {
				serve(r, tc.dur, 1)
			}
			if !due(r, 0) {
				t.Fatal("the first scrape is not due")
			}
			if due(r, tc.interval-time.Millisecond) {
				t.Fatalf("a scrape was due before %v", tc.interval)
			}
			if !due(r, tc.interval) {
				t.Fatalf("no scrape due at %v", tc.interval)
			}
		})
	}
	// The mean moves with the answers: a replica whose answers shorten is
	// read more often.
	r := &loadEstimate{}
	serve(r, 4*time.Second, 1)
	serve(r, 100*time.Millisecond, 40)
	r.mu.Lock()
	got := r.interval(floor)
	r.mu.Unlock()
	if got != floor {
		t.Fatalf("after 40 answers of 0.1 s: interval %v, want %v", got, floor)
	}
}

func TestEjection(t *testing.T) {
	r := &health{}
	for i := range 2 {
		if r.failed(t0, 3, time.Second) {
			t.Fatalf("ejected after %d failures", i+1)
		}
	}
	r.answered()
	r.failed(t0, 3, time.Second)
	r.failed(t0, 3, time.Second)
	if !r.failed(t0, 3, time.Second) || !r.ejected(t0) {
		t.Fatal("not ejected after three failures in a row")
	}
	if r.ejected(t0.Add(time.Second)) {
		t.Fatal("still ejected after the ejection time")
	}
}

// With other gateways in the view, this gateway's own requests since the
// scrape count once for each: they stand for what the others sent unseen,
// so the gateways do not all herd onto the replica the scrape showed idle.
func TestLeastLoadCountsOwnRequestsForEveryGateway(t *testing.T) {
	p := &LeastLoad{}
	cands := []Candidate{{Load: 3, Own: 2}, {Load: 4}}
	if got := p.Choose(&Request{Others: 0}, cands).Index; got != 0 {
		t.Fatalf("one gateway: chose %d, want 0 (load 3 against 4)", got)
	}
	if got := p.Choose(&Request{Others: 2}, cands).Index; got != 1 {
		t.Fatalf("three gateways: chose %d, want 1 (3 + 2x2 = 7 against 4)", got)
	}
}

// A gateway built without a policy routes by prefix, as the node's
// --gateway-policy does by default and the design says.
func TestDefaultPolicyIsPrefix(t *testing.T) {
	g := New(Config{})
	defer g.Shutdown(context.Background())
	if _, ok := g.policy.(*Prefix); !ok {
		t.Fatalf("default policy %s, want prefix", g.policy.Name())
	}
}
