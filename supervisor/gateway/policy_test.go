package gateway

import (
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
	r := newReplica()
	fresh := 3 * time.Second
	// Two requests before any scrape: without a scrape, the gossiped 5
	// wins over 2 in flight (they may be among the 5).
	a, b := r.begin(), r.begin()
	if got, _ := r.load(t0, fresh, 5); got != 5 {
		t.Fatalf("no scrape, gossip 5, 2 in flight: load %v, want 5", got)
	}
	if got, _ := r.load(t0, fresh, 1); got != 2 {
		t.Fatalf("no scrape, gossip 1, 2 in flight: load %v, want 2", got)
	}
	// A scrape starts; one request arrives while it runs; it reads 7
	// (the engine counts a and b among them).
	e, due := r.scrapeDue(t0, time.Second)
	if !due {
		t.Fatal("first scrape not due")
	}
	c := r.begin()
	r.scrapeDone(e, 7, t0, true)
	if got, _ := r.load(t0, fresh, 0); got != 8 {
		t.Fatalf("scraped 7, one request since: load %v, want 8", got)
	}
	// a and b end: the scrape had them, nothing changes until the next.
	r.end(a)
	r.end(b)
	if got, _ := r.load(t0, fresh, 0); got != 8 {
		t.Fatalf("after older requests ended: load %v, want 8", got)
	}
	d := r.begin()
	if got, _ := r.load(t0, fresh, 0); got != 9 {
		t.Fatalf("two since the scrape: load %v, want 9", got)
	}
	r.end(c)
	if got, _ := r.load(t0, fresh, 0); got != 8 {
		t.Fatalf("one since the scrape ended: load %v, want 8", got)
	}
	// No second scrape within the interval; the next one resets the
	// correction.
	if _, due := r.scrapeDue(t0.Add(500*time.Millisecond), time.Second); due {
		t.Fatal("a scrape within the interval")
	}
	e, _ = r.scrapeDue(t0.Add(time.Second), time.Second)
	r.scrapeDone(e, 1, t0.Add(time.Second), true)
	if got, _ := r.load(t0.Add(time.Second), fresh, 0); got != 1 {
		t.Fatalf("fresh scrape 1, nothing since: load %v, want 1", got)
	}
	r.end(d)
	// A stale scrape falls back to gossip.
	if got, _ := r.load(t0.Add(time.Minute), fresh, 4); got != 4 {
		t.Fatalf("stale scrape: load %v, want the gossiped 4", got)
	}
	if r.inFlight() != 0 {
		t.Fatalf("in flight %d", r.inFlight())
	}
}

func TestEjection(t *testing.T) {
	r := newReplica()
	for i := range 2 {
		if r.connectFailed(t0, 3, time.Second) {
			t.Fatalf("ejected after %d failures", i+1)
		}
	}
	r.answered()
	r.connectFailed(t0, 3, time.Second)
	r.connectFailed(t0, 3, time.Second)
	if !r.connectFailed(t0, 3, time.Second) || !r.ejected(t0) {
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
	if got := p.Choose(&Request{Gateways: 1}, cands).Index; got != 0 {
		t.Fatalf("one gateway: chose %d, want 0 (load 3 against 4)", got)
	}
	if got := p.Choose(&Request{Gateways: 3}, cands).Index; got != 1 {
		t.Fatalf("three gateways: chose %d, want 1 (3 + 2x2 = 7 against 4)", got)
	}
}
