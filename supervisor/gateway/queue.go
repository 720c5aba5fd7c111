package gateway

import (
	"crypto/sha256"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The gateway's queue. A deployment with an absolute bound on what one
// replica should hold (Entry.Bound: target_inflight, else max_num_seqs)
// sends a request at once while some routable replica holds fewer than
// that by this gateway's estimate (its scrape of the engine corrected by
// its own requests since: loadEstimate, the load the policy reads). When
// every one holds at least that, the request waits here instead of
// piling onto an engine, whose own queue is first come, first served and
// knows nothing of who asked. A request that ends, a new routing table
// and a scrape that reads less each let the next waiting requests through,
// as many as the replicas have room for; while requests wait, the due
// scrapes of the deployment's engines are started every ScrapeInterval, so
// that room made by other gateways' requests shows too.
//
// Who goes next. Three classes, interactive, default and batch, weighted
// 16 : 4 : 1, share what the replicas free by weighted fair queueing (a
// virtual pass per class, as in stride scheduling): of the classes with
// requests waiting, the one whose next request would finish first in
// virtual time (pass + 1/weight) goes, ties to the higher class, and its
// pass advances by 1/weight. A class that was idle starts from the pass
// of the last request let through, so it goes at once when its weight
// says so but carries no credit from its idle time. Interactive requests are therefore let
// through ahead of the others whenever they wait, and while interactive
// requests wait without end, batch still gets one request in 17 (1 in 21
// with default waiting too): a floor, never starvation. Strict priority
// would starve batch under a steady interactive flood; plain weighted
// round robin across classes would make an interactive request that
// arrives wait for the turn to come round. 16 : 4 is about an order of
// magnitude between neighbouring classes, as operators expect of
// "priority", with a floor that a batch client still sees move.
//
// Within a class, keys share by deficit round robin with a quantum of one
// request, every request costing one: each key with requests waiting lets
// one through in turn, so a key that floods the queue does not hold back
// another of its class. An open gateway is one key.
//
// Bounds: at most QueueDepth requests wait per deployment (429
// queue_full past it) and each waits at most QueueWait (429
// queue_timeout), both with Retry-After. A client that goes away leaves
// at once. A stopping gateway answers what waits 503 node_stopping with
// Retry-After. Streams wait like other requests, with nothing written:
// unlike a wake from zero (wake.go), which may take minutes and so sends
// the stream's 200 and comments first, the queue's wait is bounded at
// QueueWait (30 s by default), which clients and proxies bear, and the
// client keeps a real status for a refusal.
//
// Several gateways send to the same replicas and each sees the others'
// requests only in its scrapes, so together they may pass the bound by
// about one request per other gateway between two scrapes, as the
// policies' judgement does.
//
// Cost: a deployment without a bound never reaches this file; one with a
// bound and room takes one lock and reads its replicas' estimates.

// Priority is a request's class in the gateway's queue.
type Priority uint8

// The classes, highest first.
const (
	PriorityInteractive Priority = iota
	PriorityDefault
	PriorityBatch
	numPriorities
)

// priorityWords lists the classes' names for errors.
const priorityWords = "interactive, default or batch"

func (p Priority) String() string {
	switch p {
	case PriorityInteractive:
		return "interactive"
	case PriorityBatch:
		return "batch"
	}
	return "default"
}

// weight is the class's share of what the replicas free while every class
// has requests waiting (see above).
func (p Priority) weight() float64 {
	switch p {
	case PriorityInteractive:
		return 16
	case PriorityBatch:
		return 1
	}
	return 4
}

// ParsePriority reads a class's name (case and surrounding blanks
// ignored).
func ParsePriority(s string) (Priority, bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "interactive":
		return PriorityInteractive, true
	case "default":
		return PriorityDefault, true
	case "batch":
		return PriorityBatch, true
	}
	return PriorityDefault, false
}

// Defaults of Config.QueueDepth and QueueWait.
const (
	DefaultQueueDepth = 256
	DefaultQueueWait  = 30 * time.Second
)

// queueRetryAfter is what a client refused by the queue waits before
// retrying: the replicas were full for a while already, and a retry at
// once would only join the crowd.
const queueRetryAfter = 5 * time.Second

func errQueueFull(dep string, depth, bound int) *apiError {
	return &apiError{status: http.StatusTooManyRequests, typ: typeRate, code: "queue_full", retryAfter: queueRetryAfter,
		message: fmt.Sprintf("deployment %q: every replica holds its bound of %d requests and this gateway's queue for it is full (%d waiting, the queue depth); retry later", dep, bound, depth)}
}

func errQueueTimeout(dep string, wait time.Duration, bound int) *apiError {
	return &apiError{status: http.StatusTooManyRequests, typ: typeRate, code: "queue_timeout", retryAfter: queueRetryAfter,
		message: fmt.Sprintf("deployment %q: the request waited %s (the queue wait) in this gateway's queue and no replica fell below its bound of %d requests; retry later", dep, wait, bound)}
}

func errBadPriority(header, value string) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: typeInvalid, code: "invalid_priority",
		message: fmt.Sprintf("header %s: %q is not a priority; want %s", header, value, priorityWords)}
}

// priority is a request's class: the operator-allowed header's
// (Config.PriorityHeader), else its API key's, else default.
func (g *Gateway) priority(r *http.Request, k *apiKey) (Priority, *apiError) {
	if h := g.cfg.PriorityHeader; h != "" {
		if v := r.Header.Get(h); v != "" {
			p, ok := ParsePriority(v)
			if !ok {
				return PriorityDefault, errBadPriority(h, v)
			}
			return p, nil
		}
	}
	if k != nil {
		return k.class, nil
	}
	return PriorityDefault, nil
}

// queues are the gateway's queues, one per deployment that ever had to
// queue or had a bounded request; total counts the requests waiting in
// all of them, so that a request's end, on a gateway where nothing waits,
// costs one atomic read.
type queues struct {
	total atomic.Int64
	by    sync.Map // deployment name -> *depQueue
}

// depQueue is one deployment's queue.
type depQueue struct {
	name string

	mu      sync.Mutex
	classes [numPriorities]classQueue
	n       int // requests waiting
	// pending counts requests let through whose first attempt has not
	// begun yet: the replicas' estimates do not count them, so the room
	// they will take is set aside (exchange.releaseSlot).
	pending int
	// vtime is the pass of the last request let through (see the top of
	// the file).
	vtime float64
	// stop is closed when the queue empties, ending its recheck loop.
	stop chan struct{}
	// gone: dropped from queues (its deployment left the table while it
	// was empty); a request that finds it so takes the new one.
	gone bool
}

// classQueue is one class's requests in a deployment's queue.
type classQueue struct {
	pass float64
	n    int
	// turn holds the keys with requests waiting, the next to go first.
	turn  []*keyQueue
	byKey map[[sha256.Size]byte]*keyQueue
}

// keyQueue is one key's waiting requests of one class, first come first.
type keyQueue struct {
	waiting []*waiter
}

// waiter is one request in a queue.
type waiter struct {
	class Priority
	key   [sha256.Size]byte
	at    time.Time
	// ready is closed when the request is let through; sent says so,
	// under the queue's lock.
	ready chan struct{}
	sent  bool
}

// get is dep's queue, made on first use.
func (qs *queues) get(dep string) *depQueue {
	if v, ok := qs.by.Load(dep); ok {
		return v.(*depQueue)
	}
	v, _ := qs.by.LoadOrStore(dep, &depQueue{name: dep})
	return v.(*depQueue)
}

// lookup is dep's queue, nil when it has none.
func (qs *queues) lookup(dep string) *depQueue {
	if v, ok := qs.by.Load(dep); ok {
		return v.(*depQueue)
	}
	return nil
}

// push adds w; the caller holds q.mu.
func (q *depQueue) push(qs *queues, w *waiter) {
	c := &q.classes[w.class]
	if c.n == 0 {
		c.pass = max(c.pass, q.vtime)
	}
	if c.byKey == nil {
		c.byKey = map[[sha256.Size]byte]*keyQueue{}
	}
	kq := c.byKey[w.key]
	if kq == nil {
		kq = &keyQueue{}
		c.byKey[w.key] = kq
		c.turn = append(c.turn, kq)
	}
	kq.waiting = append(kq.waiting, w)
	c.n++
	q.n++
	qs.total.Add(1)
}

// pop takes the next request to let through (see the top of the file),
// nil when none waits; the caller holds q.mu.
func (q *depQueue) pop(qs *queues) *waiter {
	// The least virtual finish (pass + 1/weight), not the least pass:
	// classes that start together then go by weight, interactive
	// first, rather than one each before the weights tell.
	best, bestFinish := -1, 0.0
	for i := range q.classes {
		if f := q.classes[i].pass + 1/Priority(i).weight(); q.classes[i].n > 0 && (best < 0 || f < bestFinish) {
			best, bestFinish = i, f
		}
	}
	if best < 0 {
		return nil
	}
	c := &q.classes[best]
	kq := c.turn[0]
	w := kq.waiting[0]
	kq.waiting[0] = nil
	kq.waiting = kq.waiting[1:]
	c.turn[0] = nil
	c.turn = c.turn[1:]
	if len(kq.waiting) > 0 {
		c.turn = append(c.turn, kq) // its next request waits for the others' turns
	} else {
		delete(c.byKey, w.key)
	}
	q.vtime = c.pass
	c.pass += 1 / Priority(best).weight()
	q.left(qs, c)
	return w
}

// remove takes w out of the queue (it expired, or its client went away);
// the caller holds q.mu and knows w is still in it.
func (q *depQueue) remove(qs *queues, w *waiter) {
	c := &q.classes[w.class]
	kq := c.byKey[w.key]
	if kq == nil {
		return
	}
	for i, o := range kq.waiting {
		if o == w {
			kq.waiting = append(kq.waiting[:i], kq.waiting[i+1:]...)
			break
		}
	}
	if len(kq.waiting) == 0 {
		delete(c.byKey, w.key)
		for i, o := range c.turn {
			if o == kq {
				c.turn = append(c.turn[:i], c.turn[i+1:]...)
				break
			}
		}
	}
	q.left(qs, c)
}

// left counts one request out of class c, ending the recheck loop once
// the queue is empty.
func (q *depQueue) left(qs *queues, c *classQueue) {
	c.n--
	q.n--
	qs.total.Add(-1)
	if q.n == 0 && q.stop != nil {
		close(q.stop)
		q.stop = nil
	}
}

// headroom is how many more requests e's replicas take before each holds
// its bound, by this gateway's estimate, among the replicas a request
// would be sent to now (candidates); routable is false when there is
// none, and so nothing to wait for.
func (g *Gateway) headroom(rt *routing, e *Entry, now time.Time) (free int, routable bool) {
	for _, lr := range candidates(rt.routes[e.Name], nil, now) {
		routable = true
		load, _ := lr.rep.load.estimate(now, g.cfg.ScrapeInterval, lr.Load)
		free += max(0, e.Bound-int(math.Ceil(load)))
	}
	return free, routable
}

// letThrough lets up to free requests go, in turn; the caller holds q.mu.
func (g *Gateway) letThrough(q *depQueue, free int) {
	now := g.clock.Now()
	for ; free > 0; free-- {
		w := q.pop(&g.queues)
		if w == nil {
			return
		}
		w.sent = true
		q.pending++
		g.m.queueWait.WithLabelValues(q.name, w.class.String()).Observe(now.Sub(w.at).Seconds())
		close(w.ready)
	}
}

// dispatch lets through what q's deployment has room for: everything when
// the deployment has no bound any more, no routable replica, or left the
// table (each request is then answered as it would have been without the
// queue).
func (g *Gateway) dispatch(q *depQueue) {
	rt := g.routing.Load()
	now := g.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 {
		return
	}
	free := q.n
	if e := rt.table.entries[q.name]; e != nil && e.Bound > 0 {
		if room, ok := g.headroom(rt, e, now); ok {
			free = room - q.pending
		}
	}
	g.letThrough(q, free)
}

// kick lets requests waiting for dep through if its replicas have room:
// a request to one of them ended, or a scrape read its load.
func (g *Gateway) kick(dep string) {
	if g.queues.total.Load() == 0 {
		return
	}
	if q := g.queues.lookup(dep); q != nil {
		g.dispatch(q)
	}
}

// requeue runs after a new table is installed: the bound may have moved,
// replicas come or gone, loads been republished. The queues of
// deployments that left the table are dropped once empty.
func (g *Gateway) requeue(t *Table) {
	g.queues.by.Range(func(k, v any) bool {
		q := v.(*depQueue)
		if _, ok := t.entries[q.name]; !ok {
			q.mu.Lock()
			if q.n == 0 && q.pending == 0 {
				q.gone = true
				g.queues.by.Delete(k)
			}
			q.mu.Unlock()
		}
		if g.queues.total.Load() > 0 {
			g.dispatch(q)
		}
		return true
	})
}

// recheck runs while q has requests waiting: every ScrapeInterval it
// starts the due scrapes of the deployment's engines (scrapes otherwise
// start only from requests sent, and nothing is sent while everything
// waits) and lets through what they show room for. Its requests' ends and
// the scrapes' results let requests through as they come (kick); this
// covers the room made by other gateways' requests, seen only in scrapes.
func (g *Gateway) recheck(q *depQueue, stop <-chan struct{}) {
	t := g.clock.NewTicker(g.cfg.ScrapeInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-g.draining:
			return // what waits is answered by itself
		case <-t.Chan():
		}
		rt, now := g.routing.Load(), g.clock.Now()
		if e := rt.table.entries[q.name]; e != nil {
			for _, lr := range candidates(rt.routes[e.Name], nil, now) {
				g.scrape.maybe(e.Engine, lr, now)
			}
		}
		g.dispatch(q)
	}
}

// Queued is how many requests wait in this gateway's queue now, per
// deployment (those with none are absent): demand its replicas did not
// take yet.
func (g *Gateway) Queued() map[string]int {
	out := map[string]int{}
	if g.queues.total.Load() == 0 {
		return out
	}
	g.queues.by.Range(func(_, v any) bool {
		q := v.(*depQueue)
		q.mu.Lock()
		if q.n > 0 {
			out[q.name] = q.n
		}
		q.mu.Unlock()
		return true
	})
	return out
}

// queueDepths is each queue's waiting requests by class, for /metrics.
func (g *Gateway) queueDepths(each func(dep string, class Priority, n int)) {
	g.queues.by.Range(func(_, v any) bool {
		q := v.(*depQueue)
		q.mu.Lock()
		var ns [numPriorities]int
		for i := range q.classes {
			ns[i] = q.classes[i].n
		}
		q.mu.Unlock()
		for i, n := range ns {
			each(q.name, Priority(i), n)
		}
		return true
	})
}

// await decides whether the request for e, of class class, goes now or
// waits in e's queue (see the top of the file), and hands back the table
// to send it with. It goes now when a replica has room and nothing waits
// before it, or when no replica is routable (it is then answered as
// without the queue). Once it goes, it holds a slot in the queue's
// pending count until its first attempt begins (releaseSlot).
func (x *exchange) await(model string, rt *routing, e *Entry, byID bool, class Priority) (*routing, *Entry, bool, *apiError) {
	g := x.g
	now := g.clock.Now()
	var q *depQueue
	for {
		q = g.queues.get(e.Name)
		q.mu.Lock()
		if !q.gone {
			break
		}
		q.mu.Unlock()
	}
	free, routable := g.headroom(rt, e, now)
	if !routable || (q.n == 0 && free > q.pending) {
		q.pending++
		q.mu.Unlock()
		x.slot = q
		return rt, e, byID, nil
	}
	if g.stopping.Load() {
		q.mu.Unlock()
		return nil, nil, false, errStopping()
	}
	if q.n >= g.cfg.QueueDepth {
		q.mu.Unlock()
		g.m.queueRejected.WithLabelValues(e.Name, class.String(), "full").Inc()
		return nil, nil, false, errQueueFull(e.Name, g.cfg.QueueDepth, e.Bound)
	}
	w := &waiter{class: class, at: now, ready: make(chan struct{})}
	if x.key != nil {
		w.key = x.key.sum
	}
	if q.n == 0 {
		q.stop = make(chan struct{})
		go g.recheck(q, q.stop)
	}
	q.push(&g.queues, w)
	// Room a kick has not handed out yet (a scrape that read less just
	// now) goes at once, in turn.
	g.letThrough(q, free-q.pending)
	q.mu.Unlock()

	deadline := g.clock.NewTimer(g.cfg.QueueWait)
	defer deadline.Stop()
	var why *apiError
	select {
	case <-w.ready:
	case <-deadline.Chan():
		why = errQueueTimeout(e.Name, g.cfg.QueueWait, e.Bound)
	case <-g.draining:
		why = errStopping()
	case <-x.r.Context().Done():
	}
	q.mu.Lock()
	sent := w.sent
	if !sent {
		q.remove(&g.queues, w)
	}
	q.mu.Unlock()
	if sent {
		// Let through, perhaps as the wait ended otherwise: it holds
		// room now, given back unused if it does not go.
		x.slot = q
		if x.r.Context().Err() != nil {
			x.releaseSlot(true)
			x.clientGone()
			return nil, nil, false, errStopping()
		}
		rt = g.routing.Load()
		e2, byID2, err := rt.table.resolve(model)
		if err != nil {
			x.releaseSlot(true)
			return nil, nil, false, err
		}
		return rt, e2, byID2, nil
	}
	switch {
	case x.r.Context().Err() != nil:
		x.clientGone()
		return nil, nil, false, errStopping() // nobody reads it
	case why != nil && why.code == "queue_timeout":
		g.m.queueRejected.WithLabelValues(e.Name, class.String(), "expired").Inc()
	}
	return nil, nil, false, why
}

// releaseSlot gives back the room a request let through held in its
// queue's pending count: when its first attempt begins (the replica's
// estimate counts it from then), or, unused (the request was not sent
// after all), when it ends, which lets the next request through.
func (x *exchange) releaseSlot(unused bool) {
	q := x.slot
	if q == nil {
		return
	}
	x.slot = nil
	q.mu.Lock()
	q.pending--
	q.mu.Unlock()
	if unused {
		x.g.dispatch(q)
	}
}
