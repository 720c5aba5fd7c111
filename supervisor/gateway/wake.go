package gateway

import (
	"fmt"
	"net/http"
	"sync"
	"time"
)

// Scale from zero. A deployment that may scale to zero (autoscaled, min
// 0) and has no replica in the routing table (at zero, or waking) keeps
// its requests here, each for at
// most WakeHold, instead of answering 503: they count as requests to it in
// the rates the node publishes (Gateway.Rates), which is what its decider
// wakes it on, and each is sent once a replica is routable. A streaming
// client gets its 200 and the stream's headers at once and an SSE comment
// every wakeComment while it waits, so that proxies and clients do not
// time it out; what then goes wrong ends the stream with a final error
// event instead of a status. The comments are the gateway's own bytes:
// nothing is retried once an engine's byte reached the client, as before.

// Defaults of the wake hold's bounds (Config.WakeHold, WakeQueue,
// WakeBytes).
const (
	DefaultWakeHold  = 10 * time.Minute
	DefaultWakeQueue = 256
	DefaultWakeBytes = 64 << 20
)

// wakeComment is how often a held stream gets a comment.
const wakeComment = 5 * time.Second

// wakes counts the requests held per deployment and their bytes.
type wakes struct {
	mu    sync.Mutex
	held  map[string]int
	bytes int
}

// hold admits one request of size bytes for deployment, within the
// bounds; release gives its place back.
func (w *wakes) hold(deployment string, size, queue, limit int) (release func(), err *apiError) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.held == nil {
		w.held = map[string]int{}
	}
	if w.held[deployment] >= queue || w.bytes+size > limit {
		return nil, &apiError{status: http.StatusTooManyRequests, typ: typeRate, code: "wake_queue_full", retryAfter: retryAfterNoRoute,
			message: fmt.Sprintf("deployment %q is starting from zero and this gateway already holds %d of its requests (%d bytes of all held): retry", deployment, w.held[deployment], w.bytes)}
	}
	w.held[deployment]++
	w.bytes += size
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.held[deployment]--; w.held[deployment] <= 0 {
			delete(w.held, deployment)
		}
		w.bytes -= size
	}, nil
}

// counts is a copy of the requests held per deployment.
func (w *wakes) counts() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int, len(w.held))
	for d, n := range w.held {
		out[d] = n
	}
	return out
}

// Held is how many requests this gateway holds for each deployment that
// is starting from zero.
func (g *Gateway) Held() map[string]int { return g.wakes.counts() }

// awaitWake holds a request for e, which may scale to zero and has no
// routable replica, until one is, and returns the table to send it with.
// stream: the client asked for a stream, and is kept waiting with
// comments.
func (x *exchange) awaitWake(model string, e *Entry, stream bool, size int) (*routing, *Entry, bool, *apiError) {
	g := x.g
	release, err := g.wakes.hold(e.Name, size, g.cfg.WakeQueue, g.cfg.WakeBytes)
	if err != nil {
		return nil, nil, false, err
	}
	defer release()
	g.m.wakeHeld.WithLabelValues(e.Name).Inc()
	waited := g.clock.Now()
	defer func() { g.m.wakeWait.WithLabelValues(e.Name).Observe(g.clock.Since(waited).Seconds()) }()
	deadline := g.clock.NewTimer(g.cfg.WakeHold)
	defer deadline.Stop()
	var comments <-chan time.Time
	if stream {
		x.startHeldStream(e.Name)
		t := g.clock.NewTicker(wakeComment)
		defer t.Stop()
		comments = t.Chan()
	}
	for {
		rt := g.routing.Load()
		e2, byID, rerr := rt.table.resolve(model)
		switch {
		case rerr != nil:
			return nil, nil, false, rerr // removed while it woke
		case len(rt.routes[e2.Name]) > 0:
			return rt, e2, byID, nil // a replica is routable: sent as any request
		case !e2.Wakes:
			why := e2.Why
			if why == "" {
				why = "it no longer scales from zero"
			}
			return nil, nil, false, errNoRoute(e2.Name, why)
		}
		select {
		case <-rt.replaced:
		case <-comments:
			if !x.comment(fmt.Sprintf(": waiting for a replica of %s to start (%s)\n\n", e.Name, g.clock.Since(waited).Round(time.Second))) {
				return nil, nil, false, errStopping() // the client went away: nobody reads it
			}
		case <-deadline.Chan():
			return nil, nil, false, errNoRoute(e.Name, fmt.Sprintf("it is starting from zero and no replica was ready within %s", g.cfg.WakeHold))
		case <-g.draining:
			return nil, nil, false, errStopping()
		case <-x.r.Context().Done():
			x.clientGone()
			return nil, nil, false, errStopping()
		}
	}
}

// startHeldStream sends a held stream's status and headers and a first
// comment: the client learns at once that its stream began.
func (x *exchange) startHeldStream(deployment string) {
	h := x.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	x.g.closing(x.w)
	x.w.WriteHeader(http.StatusOK)
	x.status, x.held, x.entry.stream = http.StatusOK, true, true
	x.comment(fmt.Sprintf(": %s is starting from zero; the answer follows once a replica is ready\n\n", deployment))
}

// comment writes an SSE comment to a held stream: the gateway's own
// bytes, not the answer's first (time to first byte is the engine's).
func (x *exchange) comment(c string) bool {
	n, err := x.w.Write([]byte(c))
	x.entry.bytesOut += int64(n)
	if err == nil {
		err = x.rc.Flush()
	}
	if err != nil {
		x.clientGone()
		return false
	}
	return true
}
