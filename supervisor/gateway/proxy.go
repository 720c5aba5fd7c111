package gateway

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"slices"
	"sync"
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
// gateway commits to an upstream answer only once it decided to relay it.
//
//   - The connection fails (refused, reset, closed before any answer):
//     another replica, at most twice; several failures in a row eject the
//     replica for a while.
//   - 401 or 403: the engine and the gateway disagree on the engine's key.
//     That is the replica's fault, never the client's: it is ejected, and
//     another replica tried.
//   - 429 or 503: the engine is busy or loading; one other replica, when
//     there is one, else its answer goes back.
//
// Every other answer, 4xx included, is relayed and never counts against
// the replica.
func (g *Gateway) forward(x *exchange, e *Entry, rt *routing, ep endpoint, body []byte) {
	routes := rt.routes[e.Name]
	req := &Request{Deployment: e.Name, Body: body, Others: rt.table.Others(e.Name, rt.own[e.Name]), ep: ep}
	var tried []*liveRoute
	var lastErr error
	retryReason := ""
	busyRetried := false
	for attempt := range maxAttempts {
		now := g.now()
		lr := g.choose(req, e, routes, tried, now)
		if lr == nil {
			if attempt == 0 {
				why := e.Why
				if why == "" {
					why = "the leases of its replicas lapsed since the last view"
				}
				x.fail(errNoRoute(e.Name, why))
				return
			}
			break
		}
		if attempt > 0 {
			g.m.retries.WithLabelValues(e.Name, retryReason).Inc()
		}
		tried = append(tried, lr)
		x.entry.replica, x.entry.node, x.entry.attempts = lr.ReplicaID, lr.Node, attempt+1
		tk := lr.rep.begin(now)
		resp, err := g.send(x, lr, body)
		if err != nil {
			lr.rep.end(tk)
			if x.r.Context().Err() != nil {
				x.gone, x.entry.err = true, "client went away"
				return
			}
			g.m.upstreamErrors.WithLabelValues(e.Name, lr.ReplicaID, "connect").Inc()
			if lr.rep.connectFailed(now, g.cfg.EjectAfter, g.cfg.EjectFor) {
				g.m.ejections.WithLabelValues(e.Name, lr.ReplicaID, "connect").Inc()
			}
			lastErr, retryReason = fmt.Errorf("%s on %s: %w", lr.ReplicaID, lr.Node, err), "connect"
			continue
		}
		switch resp.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			discard(resp)
			lr.rep.end(tk)
			lr.rep.eject(now, g.cfg.EjectFor)
			g.m.upstreamErrors.WithLabelValues(e.Name, lr.ReplicaID, "auth").Inc()
			g.m.ejections.WithLabelValues(e.Name, lr.ReplicaID, "auth").Inc()
			lastErr = fmt.Errorf("%s on %s refused the gateway's engine key (%s)", lr.ReplicaID, lr.Node, resp.Status)
			retryReason = "auth"
			continue
		case http.StatusTooManyRequests, http.StatusServiceUnavailable:
			g.m.upstreamErrors.WithLabelValues(e.Name, lr.ReplicaID, "busy").Inc()
			if !busyRetried && attempt+1 < maxAttempts && g.hasCandidate(routes, tried, now) {
				discard(resp)
				lr.rep.end(tk)
				lr.rep.answered()
				busyRetried, retryReason = true, "busy"
				continue
			}
		}
		lr.rep.answered()
		func() {
			defer func() { lr.rep.finish(tk, g.now()) }()
			g.relay(x, lr, resp)
		}()
		return
	}
	x.fail(errUpstream("no replica of %q could take the request: %v", e.Name, lastErr))
}

// candidates are the routes a request may go to now: live leases, not yet
// tried, and of the best health tier present. Healthy routes come first,
// then routes on suspect nodes, then ejected ones: when every replica is
// ejected they are tried anyway (Envoy's panic threshold), since refusing
// is certain to fail and an ejection may be stale.
func (g *Gateway) candidates(routes, tried []*liveRoute, now time.Time) []*liveRoute {
	best := 3
	var out []*liveRoute
	for _, lr := range routes {
		if !lr.live(now) || slices.Contains(tried, lr) {
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

func (g *Gateway) hasCandidate(routes, tried []*liveRoute, now time.Time) bool {
	return len(g.candidates(routes, tried, now)) > 0
}

// choose asks the policy among the candidates, and starts the load scrapes
// that are due for them.
func (g *Gateway) choose(req *Request, e *Entry, routes, tried []*liveRoute, now time.Time) *liveRoute {
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
func (g *Gateway) send(x *exchange, lr *liveRoute, body []byte) (*http.Response, error) {
	r := x.r
	url := lr.URL + r.URL.Path
	if r.URL.RawQuery != "" {
		url += "?" + r.URL.RawQuery
	}
	rd := x.bb.reader(body)
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, url, rd)
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
func (g *Gateway) relay(x *exchange, lr *liveRoute, resp *http.Response) {
	defer resp.Body.Close()
	h := x.w.Header()
	for k, vs := range cleanHeader(resp.Header) {
		h[k] = vs
	}
	h.Set("Llmgw-Replica", lr.ReplicaID)
	h.Set("Llmgw-Node", lr.Node)
	x.w.WriteHeader(resp.StatusCode)
	x.status = resp.StatusCode
	if isEventStream(resp.Header) {
		x.entry.stream = true
		// The client learns at once that its stream began.
		_ = x.rc.Flush()
		g.relayEvents(x, lr, resp)
		return
	}
	g.relayBody(x, lr, resp)
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

// relayBody copies a body that is not an event stream. An engine that dies
// part-way leaves a body that must not pass for a whole one: the client's
// connection is aborted, so it sees a failed transfer instead.
func (g *Gateway) relayBody(x *exchange, lr *liveRoute, resp *http.Response) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	chunked := resp.ContentLength < 0
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if x.key != nil && len(x.body)+n <= maxUsageBody {
				x.body = append(x.body, buf[:n]...)
			}
			if x.write(buf[:n]) != nil {
				return
			}
			if chunked {
				_ = x.rc.Flush()
			}
		}
		if errors.Is(err, io.EOF) {
			if u, ok := usageOf(x.body); ok {
				x.use = u
			}
			return
		}
		if err != nil {
			if x.r.Context().Err() != nil {
				x.gone, x.entry.err = true, "client went away"
				return
			}
			g.m.upstreamErrors.WithLabelValues(x.model, lr.ReplicaID, "stream").Inc()
			x.entry.err = "engine broke off the answer: " + err.Error()
			panic(http.ErrAbortHandler)
		}
	}
}

// relayEvents passes server-sent events one at a time. An event is only
// written whole, so when the engine dies mid-stream the client gets the
// events that completed and then a final error event, never half an event
// or a stream that merely stops.
func (g *Gateway) relayEvents(x *exchange, lr *liveRoute, resp *http.Response) {
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
			g.m.upstreamErrors.WithLabelValues(x.model, lr.ReplicaID, "stream").Inc()
			x.entry.err = "engine broke off the stream: " + err.Error()
			ev = ev[:0]
			_ = x.write(sseError(fmt.Sprintf("the engine of replica %s on %s broke off the stream: %v", lr.ReplicaID, lr.Node, err)))
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
