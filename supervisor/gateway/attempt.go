package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/llmgw/llmgw/internal/clock"

	"go.opentelemetry.io/otel/trace"
)

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
//   - 500: counts toward ejection but is relayed, not retried. vLLM
//     answers a bare 500 both when its engine core died (EngineDeadError,
//     after which its API server exits unless
//     VLLM_KEEP_ALIVE_ON_ENGINE_DEATH is set) and when one request failed
//     in it (EngineGenerateError): vllm/entrypoints/launcher.py,
//     _add_shutdown_handlers. The second is the request's own error,
//     which every replica would repeat, at the cost of a generation each.
//   - 429 or 503: the engine is busy or loading, which is no fault:
//     never counted toward ejection; one other replica, when there is
//     one, else its answer goes back. SGLang refuses a request its full
//     waiting queue cannot take with 503 "The request queue is full."
//     (--max-queued-requests: python/sglang/srt/managers/scheduler.py,
//     Scheduler._abort_on_queued_limit); llama.cpp answers 503 "Loading
//     model" while it loads (tools/server/server-http.cpp,
//     middleware_server_state).
//   - No byte of the answer within the first-byte bound (Config.
//     FirstByteTimeout, else the engine's profile): counts toward
//     ejection, and the client gets 504 at once. Not retried: the bound is
//     minutes, long enough for a full-context prefill behind a queue, and
//     a request that needs longer would time out on the next replica too.
//     A plain (not streamed) answer's first byte is its last: vLLM writes
//     it once the whole generation is done (serving_chat.py,
//     chat_completion_full_generator), so for such a request the bound
//     caps the prefill and the decode together.
//   - The replica leaves routing unready while the request waits
//     (Gateway.Update): another replica, else 503. The table keeps it out
//     already, so nothing is counted against it.
//
// Every other answer, 4xx included, is relayed and never counts against
// the replica; its first byte resets the replica's failures and lifts an
// ejection.
//
// Each attempt (try) keeps its books in one place, done (account.go),
// whichever way it ends.
func (x *exchange) forward(e *Entry, rt *routing, ep endpoint, body []byte) {
	if e.PD != nil {
		x.forwardPD(e, rt, ep, body)
		return
	}
	g := x.g
	routes := x.adapterRoutes(rt.routes[e.Name], e)
	if x.adapter != "" && len(routes) == 0 {
		x.fail(errNoRoute(x.adapter, fmt.Sprintf("LoRA adapter %s of deployment %s is registered on no ready replica yet", x.adapter, e.Name)))
		return
	}
	req := &Request{Deployment: e.Name, Adapter: x.adapter, Body: body, Others: rt.table.Others(e.Name, rt.own[e.Name]), ep: ep}
	t := tries{body: body}
	t.firstByte, t.idle = g.bounds(e.Engine)
	for hold := time.Duration(0); ; {
		if x.attempts(e, req, routes, &t) {
			return
		}
		// Every replica failed, the last one because its holder's relay
		// could not be reached: that node's agent is restarting (its
		// engine serves on, its lease holds). Nothing of the answer
		// reached the client, so the request waits for it, within the
		// relay hold, and tries again, as it would try another replica.
		if !t.relayDown || hold >= g.cfg.RelayHold {
			break
		}
		wait := min(relayRetryGap<<min(t.holds, 3), g.cfg.RelayHold-hold)
		timer := g.clock.NewTimer(wait)
		select {
		case <-timer.Chan():
		case <-x.r.Context().Done():
			timer.Stop()
			x.clientGone()
			return
		}
		hold += wait
		t.holds++
		t.tried, t.relayDown, t.busyRetried = nil, false, false
		routes = x.adapterRoutes(g.routing.Load().routes[e.Name], e)
	}
	if t.final != nil {
		x.fail(t.final)
		return
	}
	x.fail(errUpstream("no replica of %q could take the request: %v", e.Name, t.lastErr))
}

// relayRetryGap is the first wait of a request whose replicas' holders'
// relays all refused it; each next wait doubles, up to eight times it.
const relayRetryGap = 100 * time.Millisecond

// attempts makes up to maxAttempts attempts of the request on the
// replicas not tried yet, and reports whether the client has its answer
// (or went away).
func (x *exchange) attempts(e *Entry, req *Request, routes []*liveRoute, t *tries) bool {
	g := x.g
	for n := range maxAttempts {
		now := g.clock.Now()
		if n > 0 {
			// A retry reads the table in use: the one the request began
			// with may still hold the replica that just left it.
			routes = x.adapterRoutes(g.routing.Load().routes[e.Name], e)
		}
		lr := g.choose(req, e, routes, t.tried, now)
		if lr == nil {
			if n == 0 {
				why := e.Why
				if why == "" {
					why = "the leases of its replicas lapsed since the last view"
				}
				x.fail(errNoRoute(e.Name, why))
				return true
			}
			break
		}
		if n > 0 || t.holds > 0 {
			g.m.retries.WithLabelValues(e.Name, t.reason).Inc()
		}
		t.tried = append(t.tried, lr.rep)
		switch x.try(lr, n, routes, t, now) {
		case answered:
			return true
		case aborted:
			// The answer's status went out and its body broke off: the
			// client's transfer must fail, not pass for a whole answer.
			panic(http.ErrAbortHandler)
		}
	}
	return false
}

// step is what forward does after an attempt.
type step int

const (
	// answered: the client has its answer, or went away.
	answered step = iota
	// retry: another replica may take the request.
	retry
	// aborted: the answer broke off after its status went out.
	aborted
)

// try makes attempt n of the request, on lr. Whichever way it ends, done
// closes its books, with the outcome it recorded on the way.
func (x *exchange) try(lr *liveRoute, n int, routes []*liveRoute, t *tries, now time.Time) step {
	a := x.open(t.parent(x.r.Context()), lr, n, t.firstByte, t.idle, now)
	var out outcome
	defer func() { x.done(a, out) }()
	body := t.body
	if x.byIndex {
		// The adapter's index is the route's engine's (its spec's order).
		if b := llamaCppAdapterBody(body, lr, x.adapter); b != nil {
			body = b
		}
	}
	resp, err := x.send(a, body)
	if err != nil {
		return x.lost(a, err, &out, t)
	}
	code := resp.StatusCode
	out.status = code
	if t.paired && failingStatus(code) {
		// The decode leg of a pair whose prefill leg was sent: a 500,
		// 502 or 504 there is most likely the KV transfer (vLLM's
		// kv_load_failure_policy fail answers 500; SGLang's decode 500s
		// when the bootstrap fails), and the client gets the gateway's
		// error saying so, in OpenAI's shape, not the engine's own. Not
		// retried: the prefill's blocks, or the bootstrap room, belong
		// to this decode. 429 and 503 take the usual way.
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		_ = resp.Body.Close()
		a.failing = true
		x.fail(errPD(lr.Deployment, fmt.Sprintf("the decode leg on %s (%s) answered %d: %s", lr.ReplicaID, lr.Node, code, clipAnswer(b))))
		return answered
	}
	// moveOn leaves this answer for another replica, when there is one
	// left to try.
	moveOn := func() bool {
		if n+1 >= maxAttempts || !hasCandidate(routes, t.tried, now) {
			return false
		}
		discard(resp)
		out.movedOn = true
		return true
	}
	switch code {
	case http.StatusUnauthorized, http.StatusForbidden:
		discard(resp)
		out.movedOn = true
		t.lastErr = fmt.Errorf("%s on %s refused the gateway's engine key (%s)", lr.ReplicaID, lr.Node, resp.Status)
		t.reason, t.final = reasonAuth, nil
		return retry
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		if !t.busyRetried && moveOn() {
			t.busyRetried, t.reason = true, reasonBusy
			return retry
		}
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusGatewayTimeout:
		a.failing = true
		if code != http.StatusInternalServerError && moveOn() {
			t.lastErr = fmt.Errorf("%s on %s answered %s", lr.ReplicaID, lr.Node, resp.Status)
			t.reason, t.final = statusReason(code), nil
			return retry
		}
	}
	err = x.relay(a, resp, &out)
	switch {
	case errors.Is(err, errAborted):
		return aborted
	case a.committed:
		return answered
	}
	return x.lost(a, err, &out, t)
}

// tries is a request's attempts: what they share (the body as sent, the
// engine kind's bounds: Gateway.bounds), and what each leaves to the next.
type tries struct {
	body            []byte
	firstByte, idle time.Duration
	tried           []*replica
	busyRetried     bool
	lastErr         error
	// reason is why the next attempt is a retry (the retries' label).
	reason string
	// final, when set, is the answer when no replica is left to try, in
	// place of errUpstream.
	final *apiError
	// relayDown: the last attempt's holder refused the connection to its
	// relay; holds counts the waits for it (forward).
	relayDown bool
	holds     int
	// ctx, when set, is the parent of the attempts' contexts instead of
	// the client's request (SGLang's decode leg, which its prefill leg
	// may cancel); paired marks the decode leg of a disaggregated pair
	// whose prefill leg was sent (pdroute.go).
	ctx    context.Context
	paired bool
}

// parent is the context the attempts derive from.
func (t *tries) parent(client context.Context) context.Context {
	if t.ctx != nil {
		return t.ctx
	}
	return client
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
	// reasonStopping: the gateway's drain bound passed (cutInFlight).
	reasonStopping = "stopping"
)

// statusReason labels an engine's 5xx answer: status_500, status_502...
func statusReason(code int) string { return "status_" + strconv.Itoa(code) }

// lost handles an attempt that failed before any byte of its answer
// reached the client, err being the failure: it records why in out, and
// says whether to try another replica; when it does not, x has its
// answer, or its client went away.
func (x *exchange) lost(a *attempt, err error, out *outcome, t *tries) step {
	lr := a.lr
	if x.r.Context().Err() != nil {
		x.clientGone()
		return answered
	}
	if t.ctx != nil && errors.As(context.Cause(t.ctx), new(*pdLegError)) {
		// The decode leg of a pair whose prefill leg failed before the
		// answer began: forwardBootstrap answers, or sends the pair
		// again. Nothing counts against the decode.
		return answered
	}
	if c := a.cut(); c != nil {
		out.broke = c.reason
		switch c.reason {
		case reasonLeftRouting:
			t.lastErr, t.reason, t.final = c, c.reason, errLeftRouting(c.msg)
			return retry
		case reasonStopping:
			// The drain's bound: no other replica is tried, this
			// door is closing.
			x.fail(errStoppingCut(c.msg))
			return answered
		}
		// Only the first-byte bound runs before the first byte.
		x.fail(errFirstByteTimeout(c.msg + "; not retried on another replica, where it would likely take as long"))
		return answered
	}
	out.broke = reasonConnect
	t.lastErr = fmt.Errorf("%s on %s: %w", lr.ReplicaID, lr.Node, err)
	t.reason, t.final = reasonConnect, nil
	// Through a relay, a connection that fails (refused, or a kept-alive
	// one closed before any answer) is the holder's agent, not its engine:
	// the relay answers 502 for an engine that does not.
	t.relayDown = lr.Relay != ""
	return retry
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
	switch e.reason {
	case reasonLeftRouting:
		return codeLeftRouting
	case reasonStopping:
		return codeStopping
	}
	return e.reason
}

// attempt is one try of a request on one replica, from open to done. Its
// context is the client's, which the gateway also cancels, with a
// cutError as the cause, when a bound passes (its timer) or the engine
// leaves routing (the replica's tracking).
type attempt struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	lr     *liveRoute
	n      int    // the request's attempt this is, from 0
	id     uint64 // the replica's tracking id
	ticket ticket // its count in the replica's load
	// firstByte and idle are the bounds; timer, on clock, enforces the
	// one that runs: firstByte until begun, idle after every read since.
	clock           clock.Clock
	firstByte, idle time.Duration
	timer           clock.Timer
	begun           atomic.Bool
	// failing: the engine's answer counts as a failure (a 5xx), so its
	// first byte does not clear the replica's failures.
	failing bool
	// committed: the answer's status went to the client (commit).
	committed bool
	// span is the attempt's, when the gateway traces.
	span trace.Span
}

// open starts attempt n on lr at now: the replica's load counts it, its
// first-byte bound runs, and an engine that leaves routing can cut it.
// done closes each of these.
func (x *exchange) open(parent context.Context, lr *liveRoute, n int, firstByte, idle time.Duration, now time.Time) *attempt {
	clk := x.g.clock
	a := &attempt{lr: lr, n: n, clock: clk, firstByte: firstByte, idle: idle}
	a.ticket = lr.rep.load.begin(now)
	// The replica's estimate counts the request now: the room its queue
	// set aside for it is its own.
	x.releaseSlot(false)
	a.ctx, a.cancel = context.WithCancelCause(parent)
	if firstByte > 0 {
		a.timer = clk.AfterFunc(firstByte, a.expire)
	}
	a.id = lr.rep.track(a.cancel)
	return a
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

// candidates are the routes a request may go to now: live leases, not yet
// tried, and of the best health tier present. Healthy routes come first,
// then routes on suspect nodes, then ejected ones: when every replica is
// ejected they are tried anyway (Envoy's panic threshold), since refusing
// is certain to fail and an ejection may be stale.
func candidates(routes []*liveRoute, tried []*replica, now time.Time) []*liveRoute {
	best := 3
	var out []*liveRoute
	for _, lr := range routes {
		if !lr.live(now) || slices.Contains(tried, lr.rep) {
			continue
		}
		tier := 0
		switch {
		case lr.rep.health.ejected(now):
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

func hasCandidate(routes []*liveRoute, tried []*replica, now time.Time) bool {
	return len(candidates(routes, tried, now)) > 0
}

// choose asks the policy among the candidates, and starts the load scrapes
// that are due for them.
func (g *Gateway) choose(req *Request, e *Entry, routes []*liveRoute, tried []*replica, now time.Time) *liveRoute {
	lrs := candidates(routes, tried, now)
	if len(lrs) == 0 {
		return nil
	}
	cands := make([]Candidate, len(lrs))
	for i, lr := range lrs {
		g.scrape.maybe(e.Engine, lr, now)
		load, own := lr.rep.load.estimate(now, g.cfg.ScrapeInterval, lr.Load)
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
func (x *exchange) send(a *attempt, body []byte) (*http.Response, error) {
	g, r, lr := x.g, x.r, a.lr
	base := lr.base()
	if lr.Relay != "" {
		base = lr.Relay
	}
	url := base + r.URL.Path
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
	x.traceAttempt(a, req)
	if lr.Relay != "" {
		// The holder checks the signature and presents the engine's key
		// itself: the key never crosses the network.
		if g.cfg.Relay == nil {
			_ = rd.Close()
			return nil, errNoRelaySigner
		}
		g.cfg.Relay.Sign(req, x.caller(), body)
		return g.tr.RoundTrip(req)
	}
	if g.cfg.EngineKey != nil {
		if k := g.cfg.EngineKey(lr.EngineID); k != "" {
			req.Header.Set("Authorization", "Bearer "+k)
		}
	}
	return g.tr.RoundTrip(req)
}

// errNoRelaySigner: a route through another node's relay, on a gateway
// given no key to sign with (Config.Relay).
var errNoRelaySigner = errors.New("gateway: the engine listens on its holder's loopback only, and this gateway has no relay key to reach it (Config.Relay)")

// caller names the client to the holder of a relayed request: the name of
// its gateway key, else its address.
func (x *exchange) caller() string {
	if x.key != nil {
		return "key:" + x.key.name
	}
	return x.r.RemoteAddr
}

// discard reads a little of a body the gateway will not relay, so its
// connection can be reused, and closes it.
func discard(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
}
