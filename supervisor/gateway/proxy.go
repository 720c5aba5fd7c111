package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// statusClientGone is what the metrics and the access log call a request
// whose client went away before its answer ended (nginx's convention).
const statusClientGone = 499

// exchange is one proxied request on its way through the gateway.
type exchange struct {
	g     *Gateway
	w     http.ResponseWriter
	r     *http.Request
	rc    *http.ResponseController
	start time.Time
	// model is the deployment once resolved, else unknownModel.
	model    string
	resolved bool
	status   int
	gone     bool // the client went away
	ttfb     time.Duration
	entry    logEntry
	// key is the client's API key when the gateway has keys; its usage is
	// then read from the answers and counted under its name.
	key *apiKey
	use usage
	// body collects a plain answer for its usage, up to maxUsageBody.
	body []byte
	// bb holds the request body, shared with the attempts' readers.
	bb *bodyBuf
}

// maxUsageBody bounds how much of a plain answer is kept to read its usage;
// a longer one is not counted.
const maxUsageBody = 1 << 20

func (g *Gateway) proxyPost(w http.ResponseWriter, r *http.Request, ep endpoint) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		g.refuse(w, r, errMethod(r.Method, "POST"), "")
		return
	}
	x := &exchange{g: g, w: w, r: r, rc: http.NewResponseController(w), start: g.now(), model: unknownModel}
	x.entry = logEntry{at: x.start, method: r.Method, path: r.URL.Path}
	defer x.finish()
	err := g.admit()
	defer g.release()
	if err != nil {
		x.fail(err)
		return
	}
	if x.key, err = g.authorize(r); err != nil {
		x.fail(err)
		return
	}
	if x.key != nil {
		x.entry.key = x.key.name
		release, err := g.callers.admit(x.key, x.start)
		if err != nil {
			g.m.keyLimited.WithLabelValues(x.key.label()).Inc()
			x.fail(err)
			return
		}
		defer release()
	}
	err = g.readBody(x)
	if x.bb != nil {
		defer x.bb.release()
	}
	if err != nil {
		x.fail(err)
		return
	}
	body := x.bb.b
	p, err := parseBody(body, ep)
	if err != nil {
		x.fail(err)
		return
	}
	x.entry.stream = p.stream
	rt := g.routing.Load()
	e, byID, err := rt.table.resolve(p.model)
	if err != nil {
		x.fail(err)
		return
	}
	x.model, x.resolved = e.Name, true
	if byID {
		// The engine serves the deployment name only.
		body = withModel(body, p.modelSpan, e.Name)
	}
	g.forward(x, e, rt, ep, body)
}

// readBody reads the whole body (capped), so that a retry can resend it and
// a slow client never holds an engine's slot. Its deadline is real time:
// it is a network deadline, whatever clock the gateway judges leases by.
//
// The body lands in a pooled buffer (x.bb), which the exchange releases
// when it ends and each attempt when the transport closes its body.
func (g *Gateway) readBody(x *exchange) *apiError {
	limit := g.cfg.MaxBodyBytes
	if x.r.ContentLength > limit {
		return errBodyTooLarge(limit)
	}
	_ = x.rc.SetReadDeadline(time.Now().Add(g.cfg.BodyTimeout))
	defer func() { _ = x.rc.SetReadDeadline(time.Time{}) }()
	rd := http.MaxBytesReader(x.w, x.r.Body, limit)
	var err error
	if n := x.r.ContentLength; n > 0 {
		x.bb = g.bodies.get(int(n))
		x.bb.b = x.bb.b[:n]
		_, err = io.ReadFull(rd, x.bb.b)
	} else {
		x.bb = g.bodies.get(0)
		x.bb.b, err = readAll(rd, x.bb.b)
	}
	x.entry.bytesIn = int64(len(x.bb.b))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return errBodyTooLarge(limit)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &apiError{status: http.StatusRequestTimeout, typ: typeInvalid, code: "body_timeout",
			message: fmt.Sprintf("the request body took longer than %s to arrive", g.cfg.BodyTimeout)}
	case err != nil:
		return errBadRequest("", "reading the request body: %v", err)
	}
	return nil
}

// readAll appends r's bytes to b, as io.ReadAll does into a fresh slice.
func readAll(r io.Reader, b []byte) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if errors.Is(err, io.EOF) {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// forward sends the request to a replica, retrying on another where that is
// safe: nothing of the answer has reached the client yet, because the
// gateway commits to an upstream answer only once it decided to relay it,
// and to a plain (not event-stream) answer only with its first byte in
// hand. Busy is not dead: an engine under load answers slowly or says so,
// a hung one answers nothing, and only what a broken engine shows counts
// toward ejecting it (failures in a row: Config.EjectAfter).
//
//   - The connection fails (refused, reset, closed before any answer):
//     another replica, at most twice; counts toward ejection.
//   - 401 or 403: the engine and the gateway disagree on the engine's key.
//     That is the replica's fault, never the client's: it is ejected, and
//     another replica tried.
//   - 502 or 504: something in or before the engine could not answer, not
//     the request's fault; counts toward ejection, and is tried on
//     another replica like a failed connection (else relayed).
//   - 500: counts toward ejection (an engine whose core died answers 500
//     to everything) but is relayed, not retried: it is as often the
//     request's own error (a bad parameter the engine failed on), which
//     every replica would repeat, at the cost of a generation each.
//   - 429 or 503: the engine is busy or loading, which is no fault:
//     never counted toward ejection; one other replica, when there is
//     one, else its answer goes back.
//   - No byte of the answer within the first-byte bound (Config.
//     FirstByteTimeout, else the engine's profile): counts toward
//     ejection, and the client gets 504 at once. Not retried: the bound is
//     minutes, long enough for a full-context prefill behind a queue, and
//     a request that needs longer would time out on the next replica too.
//   - The replica leaves routing unready while the request waits
//     (Gateway.Update): another replica, else 503. The table keeps it out
//     already, so nothing is counted against it.
//
// Every other answer, 4xx included, is relayed and never counts against
// the replica; its first byte resets the replica's failures and lifts an
// ejection.
func (g *Gateway) forward(x *exchange, e *Entry, rt *routing, ep endpoint, body []byte) {
	routes := rt.routes[e.Name]
	req := &Request{Deployment: e.Name, Body: body, Others: rt.table.Others(e.Name, rt.own[e.Name]), ep: ep}
	firstByte, idle := g.bounds(e.Engine)
	var t tries
	busyRetried := false
	for n := range maxAttempts {
		now := g.now()
		if n > 0 {
			// A retry reads the table in use: the one the request began
			// with may still hold the replica that just left it.
			routes = g.routing.Load().routes[e.Name]
		}
		lr := g.choose(req, e, routes, t.tried, now)
		if lr == nil {
			if n == 0 {
				why := e.Why
				if why == "" {
					why = "the leases of its replicas lapsed since the last view"
				}
				x.fail(errNoRoute(e.Name, why))
				return
			}
			break
		}
		if n > 0 {
			g.m.retries.WithLabelValues(e.Name, t.reason).Inc()
		}
		t.tried = append(t.tried, lr.rep)
		x.entry.replica, x.entry.node, x.entry.attempts = lr.ReplicaID, lr.Node, n+1
		tk := lr.rep.begin(now)
		a := g.newAttempt(x, lr, firstByte, idle)
		resp, err := g.send(x, a, body)
		if err != nil {
			lr.rep.end(tk)
			a.done()
			if g.lost(x, a, err, now, &t) {
				continue
			}
			return
		}
		switch code := resp.StatusCode; code {
		case http.StatusUnauthorized, http.StatusForbidden:
			discard(resp)
			lr.rep.end(tk)
			a.done()
			lr.rep.eject(now, g.cfg.EjectFor)
			g.m.upstreamErrors.WithLabelValues(e.Name, lr.ReplicaID, reasonAuth).Inc()
			g.m.ejections.WithLabelValues(e.Name, lr.ReplicaID, reasonAuth).Inc()
			t.lastErr = fmt.Errorf("%s on %s refused the gateway's engine key (%s)", lr.ReplicaID, lr.Node, resp.Status)
			t.reason, t.final = reasonAuth, nil
			continue
		case http.StatusTooManyRequests, http.StatusServiceUnavailable:
			g.m.upstreamErrors.WithLabelValues(e.Name, lr.ReplicaID, reasonBusy).Inc()
			if !busyRetried && n+1 < maxAttempts && g.hasCandidate(routes, t.tried, now) {
				discard(resp)
				lr.rep.end(tk)
				a.done()
				lr.rep.answered()
				busyRetried, t.reason = true, reasonBusy
				continue
			}
		case http.StatusInternalServerError, http.StatusBadGateway, http.StatusGatewayTimeout:
			reason := statusReason(code)
			g.m.upstreamErrors.WithLabelValues(e.Name, lr.ReplicaID, reason).Inc()
			g.failed(lr, now, reason)
			a.counted = true
			if code != http.StatusInternalServerError && n+1 < maxAttempts && g.hasCandidate(routes, t.tried, now) {
				discard(resp)
				lr.rep.end(tk)
				a.done()
				t.lastErr = fmt.Errorf("%s on %s answered %s", lr.ReplicaID, lr.Node, resp.Status)
				t.reason, t.final = reason, nil
				continue
			}
		}
		// Deferred: a relay that breaks off a plain answer aborts the
		// handler with a panic.
		func() {
			defer func() {
				if a.committed {
					lr.rep.finish(tk, g.now())
				} else {
					lr.rep.end(tk)
				}
				a.done()
			}()
			err = g.relay(x, a, resp)
		}()
		if a.committed || !g.lost(x, a, err, now, &t) {
			return
		}
	}
	if t.final != nil {
		x.fail(t.final)
		return
	}
	x.fail(errUpstream("no replica of %q could take the request: %v", e.Name, t.lastErr))
}

// tries is what forward's attempts so far leave to the next.
type tries struct {
	tried   []*replica
	lastErr error
	// reason is why the next attempt is a retry (the retries' label).
	reason string
	// final, when set, is the answer when no replica is left to try, in
	// place of errUpstream.
	final *apiError
}

// Why an attempt failed, as the metrics' reason and kind labels say it.
const (
	reasonConnect     = "connect"
	reasonAuth        = "auth"
	reasonBusy        = "busy"
	reasonStream      = "stream"
	reasonFirstByte   = "first_byte_timeout"
	reasonStreamIdle  = "stream_idle_timeout"
	reasonLeftRouting = "left_routing"
)

// statusReason labels an engine's 5xx answer: status_500, status_502...
func statusReason(code int) string { return "status_" + strconv.Itoa(code) }

// failed counts a failure against the replica, and an ejection when it
// tips it over.
func (g *Gateway) failed(lr *liveRoute, now time.Time, reason string) {
	if lr.rep.failed(now, g.cfg.EjectAfter, g.cfg.EjectFor) {
		g.m.ejections.WithLabelValues(lr.Deployment, lr.ReplicaID, reason).Inc()
	}
}

// lost handles an attempt that failed before any byte of its answer
// reached the client, err being the failure. It reports whether to try
// another replica; when it does not, x has its answer, or its client went
// away.
func (g *Gateway) lost(x *exchange, a *attempt, err error, now time.Time, t *tries) (retry bool) {
	lr := a.lr
	if x.r.Context().Err() != nil {
		x.gone, x.entry.err = true, "client went away"
		return false
	}
	if c := a.cut(); c != nil {
		g.m.upstreamErrors.WithLabelValues(lr.Deployment, lr.ReplicaID, c.reason).Inc()
		if c.reason == reasonLeftRouting {
			t.lastErr, t.reason, t.final = c, c.reason, errLeftRouting(c.msg)
			return true
		}
		// Only the first-byte bound runs before the first byte.
		if !a.counted {
			g.failed(lr, now, c.reason)
		}
		x.fail(errFirstByteTimeout(c.msg + "; not retried on another replica, where it would likely take as long"))
		return false
	}
	g.m.upstreamErrors.WithLabelValues(lr.Deployment, lr.ReplicaID, reasonConnect).Inc()
	if !a.counted {
		g.failed(lr, now, reasonConnect)
	}
	t.lastErr = fmt.Errorf("%s on %s: %w", lr.ReplicaID, lr.Node, err)
	t.reason, t.final = reasonConnect, nil
	return true
}

// bounds are the first-byte and stream-idle bounds of an engine kind's
// answers: the configured ones, else its profile's; zero is none.
func (g *Gateway) bounds(engine string) (firstByte, idle time.Duration) {
	r := g.cfg.Profiles[engine].Readiness
	firstByte, idle = r.FirstByteTimeout, r.StreamIdleTimeout
	if g.cfg.FirstByteTimeout > 0 {
		firstByte = g.cfg.FirstByteTimeout
	}
	if g.cfg.StreamIdleTimeout > 0 {
		idle = g.cfg.StreamIdleTimeout
	}
	return firstByte, idle
}

// cutError is why the gateway cancelled an attempt itself: a bound passed,
// or the engine left routing. reason is its metrics label.
type cutError struct {
	reason string
	msg    string
}

func (e *cutError) Error() string { return e.msg }

// code is the error code the client sees.
func (e *cutError) code() string {
	if e.reason == reasonLeftRouting {
		return codeLeftRouting
	}
	return e.reason
}

// attempt is one try of a request on one replica. Its context is the
// client's, which the gateway also cancels, with a cutError as the cause,
// when a bound passes (its timer) or the engine leaves routing (the
// replica's tracking).
type attempt struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	lr     *liveRoute
	id     uint64 // the replica's tracking id
	// firstByte and idle are the bounds; timer enforces the one that
	// runs: firstByte until begun, idle after every read since.
	firstByte, idle time.Duration
	timer           *time.Timer
	begun           atomic.Bool
	// counted: a failure was counted against the replica already (a 5xx
	// answer), so nothing else of this attempt counts, and its first byte
	// does not clear it.
	counted bool
	// committed: the answer's status went to the client (commit).
	committed bool
}

func (g *Gateway) newAttempt(x *exchange, lr *liveRoute, firstByte, idle time.Duration) *attempt {
	a := &attempt{lr: lr, firstByte: firstByte, idle: idle}
	a.ctx, a.cancel = context.WithCancelCause(x.r.Context())
	if firstByte > 0 {
		a.timer = time.AfterFunc(firstByte, a.expire)
	}
	a.id = lr.rep.track(a.cancel)
	return a
}

// expire cancels the attempt when its timer fires: which bound it was is
// whether a byte had come.
func (a *attempt) expire() {
	lr := a.lr
	if a.begun.Load() {
		a.cancel(&cutError{reason: reasonStreamIdle, msg: fmt.Sprintf("replica %s on %s sent nothing more of its answer for %v (the stream-idle bound)",
			lr.ReplicaID, lr.Node, a.idle)})
		return
	}
	a.cancel(&cutError{reason: reasonFirstByte, msg: fmt.Sprintf("replica %s on %s sent no byte of its answer within %v (the first-byte bound)",
		lr.ReplicaID, lr.Node, a.firstByte)})
}

// progress notes a read of the answer's body that brought bytes, or its
// end: the first byte proves the engine answers, and starts the idle
// bound, which every later read starts afresh.
func (a *attempt) progress(end bool) {
	if !a.begun.Swap(true) && !a.counted {
		a.lr.rep.answered()
	}
	switch {
	case end || a.idle <= 0:
		if a.timer != nil {
			a.timer.Stop()
		}
	case a.timer == nil:
		a.timer = time.AfterFunc(a.idle, a.expire)
	default:
		a.timer.Reset(a.idle)
	}
}

// cut is why the gateway cancelled the attempt, if it did.
func (a *attempt) cut() *cutError {
	if a.ctx.Err() == nil {
		return nil
	}
	var c *cutError
	if errors.As(context.Cause(a.ctx), &c) {
		return c
	}
	return nil
}

// done ends the attempt: its timer, its tracking, its context.
func (a *attempt) done() {
	if a.timer != nil {
		a.timer.Stop()
	}
	a.lr.rep.untrack(a.id)
	a.cancel(nil)
}

// watchedBody is an answer's body as the attempt reads it: each read feeds
// the bounds, and a read the gateway cut says why.
type watchedBody struct {
	io.ReadCloser
	a *attempt
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case errors.Is(err, io.EOF):
		b.a.progress(true)
	case n > 0:
		b.a.progress(false)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		if c := b.a.cut(); c != nil {
			err = c
		}
	}
	return n, err
}

// candidates are the routes a request may go to now: live leases, not yet
// tried, and of the best health tier present. Healthy routes come first,
// then routes on suspect nodes, then ejected ones: when every replica is
// ejected they are tried anyway (Envoy's panic threshold), since refusing
// is certain to fail and an ejection may be stale.
func (g *Gateway) candidates(routes []*liveRoute, tried []*replica, now time.Time) []*liveRoute {
	best := 3
	var out []*liveRoute
	for _, lr := range routes {
		if !lr.live(now) || slices.Contains(tried, lr.rep) {
			continue
		}
		tier := 0
		switch {
		case lr.rep.ejected(now):
			tier = 2
		case lr.Suspect:
			tier = 1
		}
		if tier < best {
			best, out = tier, out[:0]
		}
		if tier == best {
			out = append(out, lr)
		}
	}
	return out
}

func (g *Gateway) hasCandidate(routes []*liveRoute, tried []*replica, now time.Time) bool {
	return len(g.candidates(routes, tried, now)) > 0
}

// choose asks the policy among the candidates, and starts the load scrapes
// that are due for them.
func (g *Gateway) choose(req *Request, e *Entry, routes []*liveRoute, tried []*replica, now time.Time) *liveRoute {
	lrs := g.candidates(routes, tried, now)
	if len(lrs) == 0 {
		return nil
	}
	cands := make([]Candidate, len(lrs))
	for i, lr := range lrs {
		g.scrape.maybe(e.Engine, lr, now)
		load, own := lr.rep.load(now, g.cfg.ScrapeInterval, lr.Load)
		cands[i] = Candidate{Route: &lr.Route, Load: load, Own: own}
	}
	c := Choice{}
	if len(cands) > 1 {
		c = g.policy.Choose(req, cands)
		if c.Index < 0 || c.Index >= len(cands) {
			c.Index = 0
		}
	}
	if c.Outcome != NoAffinity && len(tried) == 0 {
		g.m.affinity.WithLabelValues(e.Name, string(c.Outcome)).Inc()
	}
	return lrs[c.Index]
}

// hopHeaders are meaningful for one connection only (RFC 9110 §7.6.1), so
// a proxy never passes them on.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// cleanHeader copies h without hop-by-hop headers, those the Connection
// header names, and drop.
func cleanHeader(h http.Header, drop ...string) http.Header {
	out := make(http.Header, len(h))
	for k, vs := range h {
		out[k] = vs
	}
	for _, c := range h.Values("Connection") {
		for _, name := range bytes.Split([]byte(c), []byte(",")) {
			out.Del(string(bytes.TrimSpace(name)))
		}
	}
	for _, k := range hopHeaders {
		delete(out, k)
	}
	for _, k := range drop {
		delete(out, k)
	}
	return out
}

// send makes one attempt. The client's Authorization never goes upstream:
// it is the client's key to the gateway, and the engine has a key of its
// own.
func (g *Gateway) send(x *exchange, a *attempt, body []byte) (*http.Response, error) {
	r, lr := x.r, a.lr
	url := lr.URL + r.URL.Path
	if r.URL.RawQuery != "" {
		url += "?" + r.URL.RawQuery
	}
	rd := x.bb.reader(body)
	req, err := http.NewRequestWithContext(a.ctx, http.MethodPost, url, rd)
	if err != nil {
		_ = rd.Close()
		return nil, fmt.Errorf("gateway: %w", err)
	}
	// Only the standard library's own readers get a length by themselves.
	req.ContentLength = int64(len(body))
	req.Header = cleanHeader(r.Header, "Authorization", "Content-Length", "Expect", "Cookie")
	if g.cfg.EngineKey != nil {
		if k := g.cfg.EngineKey(lr.EngineID); k != "" {
			req.Header.Set("Authorization", "Bearer "+k)
		}
	}
	return g.tr.RoundTrip(req)
}

// discard reads a little of a body the gateway will not relay, so its
// connection can be reused, and closes it.
func discard(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
}

// bufPool holds the relay buffers: one per request in flight would
// otherwise be garbage at every request.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// eventEnd ends a server-sent event (engines end lines with "\n").
var eventEnd = []byte("\n\n")

// maxEvent bounds how much of one server-sent event is held before it is
// passed on anyway.
const maxEvent = 1 << 20

// relay passes the engine's answer to the client. The status and headers go
// first; a stream of server-sent events is then passed event by event,
// each flushed as it completes, and anything else as it arrives.
//
// A stream is committed to at once: the client learns that its stream
// began. A plain answer is committed to only with its first byte read, so
// that until then a failure can still be retried or answered in full
// (504, 503) instead of cutting a response whose status went out: when it
// is not, a.committed is false and err says why.
func (g *Gateway) relay(x *exchange, a *attempt, resp *http.Response) error {
	defer resp.Body.Close()
	resp.Body = &watchedBody{ReadCloser: resp.Body, a: a}
	if isEventStream(resp.Header) {
		g.commit(x, a, resp)
		x.entry.stream = true
		// The client learns at once that its stream began.
		_ = x.rc.Flush()
		g.relayEvents(x, a, resp)
		return nil
	}
	return g.relayBody(x, a, resp)
}

// commit sends the engine's status and headers to the client.
func (g *Gateway) commit(x *exchange, a *attempt, resp *http.Response) {
	a.committed = true
	lr := a.lr
	h := x.w.Header()
	for k, vs := range cleanHeader(resp.Header) {
		h[k] = vs
	}
	h.Set("Llmgw-Replica", lr.ReplicaID)
	h.Set("Llmgw-Node", lr.Node)
	x.w.WriteHeader(resp.StatusCode)
	x.status = resp.StatusCode
}

func isEventStream(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	enc := h.Get("Content-Encoding")
	// A compressed stream cannot be split into events; it is passed on
	// as it arrives instead.
	return err == nil && mt == "text/event-stream" && (enc == "" || enc == "identity")
}

// write sends b to the client, noting the first byte.
func (x *exchange) write(b []byte) error {
	if x.ttfb == 0 && len(b) > 0 {
		x.ttfb = max(x.g.now().Sub(x.start), time.Nanosecond)
	}
	n, err := x.w.Write(b)
	x.entry.bytesOut += int64(n)
	if err != nil {
		x.gone, x.entry.err = true, "client went away"
	}
	return err
}

// relayBody copies a body that is not an event stream, committing to it
// once its first byte (or its end) is read. An engine that dies part-way,
// or goes quiet past the stream-idle bound, leaves a body that must not
// pass for a whole one: the client's connection is aborted, so it sees a
// failed transfer instead.
func (g *Gateway) relayBody(x *exchange, a *attempt, resp *http.Response) error {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var n int
	var err error
	for n == 0 && err == nil {
		n, err = resp.Body.Read(buf)
	}
	if n == 0 && !errors.Is(err, io.EOF) {
		return err
	}
	g.commit(x, a, resp)
	chunked := resp.ContentLength < 0
	for {
		if n > 0 {
			if x.key != nil && len(x.body)+n <= maxUsageBody {
				x.body = append(x.body, buf[:n]...)
			}
			if x.write(buf[:n]) != nil {
				return nil
			}
			if chunked {
				_ = x.rc.Flush()
			}
		}
		if errors.Is(err, io.EOF) {
			if u, ok := usageOf(x.body); ok {
				x.use = u
			}
			return nil
		}
		if err != nil {
			if x.r.Context().Err() != nil {
				x.gone, x.entry.err = true, "client went away"
				return nil
			}
			g.brokeOff(x, a, err, "answer")
			panic(http.ErrAbortHandler)
		}
		n, err = resp.Body.Read(buf)
	}
}

// brokeOff counts an answer that ended early after the client got its
// status, and says why: the engine broke it off, or the gateway cut it
// (a bound, or the engine left routing). Only a first-byte timeout counts
// against the replica here (the stream's headers came, nothing else): a
// stream that goes quiet had its first byte, which cleared the replica's
// failures, so one more would never add up to an ejection; a hung
// engine leaves routing by its readiness instead, and its streams are cut
// then (Update).
func (g *Gateway) brokeOff(x *exchange, a *attempt, err error, what string) (code, msg string) {
	lr := a.lr
	if c := a.cut(); c != nil {
		g.m.upstreamErrors.WithLabelValues(x.model, lr.ReplicaID, c.reason).Inc()
		if c.reason == reasonFirstByte && !a.counted {
			g.failed(lr, g.now(), c.reason)
		}
		x.entry.err = c.msg
		return c.code(), c.msg
	}
	g.m.upstreamErrors.WithLabelValues(x.model, lr.ReplicaID, reasonStream).Inc()
	x.entry.err = "engine broke off the " + what + ": " + err.Error()
	return "upstream_stream_error", fmt.Sprintf("the engine of replica %s on %s broke off the %s: %v", lr.ReplicaID, lr.Node, what, err)
}

// relayEvents passes server-sent events one at a time. An event is only
// written whole, so when the engine dies mid-stream the client gets the
// events that completed and then a final error event, never half an event
// or a stream that merely stops.
func (g *Gateway) relayEvents(x *exchange, a *attempt, resp *http.Response) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	br := bufio.NewReaderSize(resp.Body, len(*bp))
	var ev []byte
	line := 0 // bytes of the current line read so far
	emit := func() bool {
		if x.key != nil {
			if u, ok := usageOf(eventData(ev)); ok {
				x.use = u // the last chunk's usage covers the whole answer
			}
		}
		if x.write(ev) != nil {
			return false
		}
		ev = ev[:0]
		// Events that arrived together leave together: when the next
		// event is already whole in the buffer, it is written first and
		// the flush covers both. Nothing waits for bytes still to come.
		if n := br.Buffered(); n > 0 {
			if next, _ := br.Peek(n); bytes.Contains(next, eventEnd) {
				return true
			}
		}
		if x.rc.Flush() != nil {
			x.gone = true
			return false
		}
		return true
	}
	for {
		chunk, err := br.ReadSlice('\n')
		ev = append(ev, chunk...)
		if n := len(chunk); n > 0 && chunk[n-1] == '\n' {
			total := line + n
			line = 0
			// A blank line ("\n" or "\r\n") ends the event.
			if (total == 1 || (total == 2 && ev[len(ev)-2] == '\r')) && !emit() {
				return
			}
		} else {
			line += n
		}
		if len(ev) > maxEvent && !emit() {
			return
		}
		switch {
		case err == nil, errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if len(ev) > 0 {
				emit()
			}
			return
		case x.r.Context().Err() != nil:
			x.gone, x.entry.err = true, "client went away"
			return
		default:
			code, msg := g.brokeOff(x, a, err, "stream")
			ev = ev[:0]
			_ = x.write(sseError(code, msg))
			_ = x.rc.Flush()
			return
		}
	}
}

// fail answers with the gateway's own error.
func (x *exchange) fail(e *apiError) {
	e.write(x.w)
	x.status, x.entry.err = e.status, e.code
}

// finish counts the request and logs it; it runs even when the relay
// aborts the connection.
func (x *exchange) finish() {
	g := x.g
	end := g.now()
	d := end.Sub(x.start)
	status := x.status
	if x.gone {
		status = statusClientGone
	}
	g.m.requests.WithLabelValues(x.model, statusLabel(status)).Inc()
	if x.key != nil {
		l := x.key.label()
		g.m.keyRequests.WithLabelValues(l, statusLabel(status)).Inc()
		if x.use.PromptTokens > 0 {
			g.m.keyTokens.WithLabelValues(l, "prompt").Add(float64(x.use.PromptTokens))
		}
		if x.use.CompletionTokens > 0 {
			g.m.keyTokens.WithLabelValues(l, "completion").Add(float64(x.use.CompletionTokens))
		}
	}
	if x.resolved {
		g.m.duration.WithLabelValues(x.model).Observe(d.Seconds())
		if x.ttfb > 0 {
			g.m.ttfb.WithLabelValues(x.model).Observe(x.ttfb.Seconds())
		}
		g.stats.record(x.model, x.start, x.ttfb, status)
	}
	if g.log != nil {
		x.entry.model, x.entry.status, x.entry.ttfb, x.entry.duration = x.model, status, x.ttfb, d
		g.log.add(x.entry)
	}
}
