package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmgw/llmgw/placement"
)

// Routing a request of a disaggregated deployment (issue 30): two legs,
// one to a prefill replica and one to a decode replica, as the engine's
// own protocol wants them (pd.go builds the bodies). The decode replica is
// chosen first, by load and prefix affinity, since its cache is what a
// shared prefix saves; then a prefill replica of the same spec version
// (two engine builds refuse each other's KV). Every request ends in one
// outcome, counted by llmgw_gateway_pd_requests_total{deployment,outcome}:
// a request that was not disaggregated says why, and each such reason is
// logged once per replica pair, so disaggregation never stops unseen.

// The outcomes of a disaggregated deployment's requests.
const (
	pdDisaggregated   = "disaggregated"
	pdSkipped         = "skipped"          // the prompt's uncached part was below transfer.skip_below
	pdFallback        = "fallback"         // decode alone, as transfer.fallback allows
	pdNoParams        = "no_params"        // the prefill answered without kv_transfer_params
	pdVersionMismatch = "version_mismatch" // no prefill of the decode's spec version
	pdFailed          = "failed"
)

// DefaultPDLegTimeout bounds the prefill leg, and the decode's first byte
// (which waits for the KV transfer) and each gap between its stream's
// events, unless the gateway is told otherwise: far below the engines'
// own 300 s waits (SGLANG_DISAGGREGATION_WAITING_TIMEOUT, vLLM's
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT of 480 s), which are what users of
// every other P/D proxy meet when a transfer fails (sglang #36108, vllm
// #50754).
const DefaultPDLegTimeout = 30 * time.Second

// maxPrefillAnswer bounds a prefill leg's answer (one token and the
// transfer's parameters).
const maxPrefillAnswer = 1 << 20

// pdSettings are a disaggregated deployment's gateway settings.
type pdSettings struct {
	// bootstrap: SGLang's protocol (both legs at once, a bootstrap room);
	// else vLLM's NixlConnector (prefill, then decode with its params).
	bootstrap bool
	fallback  bool
	skipBelow int
}

func pdSettingsOf(d placement.Deployment) *pdSettings {
	if !d.HasRoles() {
		return nil
	}
	s := &pdSettings{bootstrap: d.Engine == "sglang"}
	if t := d.Transfer; t != nil {
		s.fallback, s.skipBelow = t.Fallback, t.SkipBelow
	}
	return s
}

// routable reports whether a disaggregated deployment can serve through
// routes at now: a live decode replica, and a live prefill replica unless
// the fallback lets the decode serve alone.
func (s *pdSettings) routable(routes []*liveRoute, now time.Time) bool {
	decode, prefill := false, s.fallback
	for _, lr := range routes {
		if lr.live(now) {
			decode = decode || lr.Role == placement.RoleDecode
			prefill = prefill || lr.Role == placement.RolePrefill
		}
	}
	return decode && prefill
}

// pdSeen remembers which (deployment, prefill, decode, outcome) the
// gateway has logged, so each is logged once.
type pdSeen struct {
	mu   sync.Mutex
	seen map[string]bool
	// last is the latest reason of each deployment's outcomes other than
	// disaggregated, for llmgw models.
	last map[string]map[string]string
}

// note counts one outcome and logs its first occurrence per replica pair.
func (g *Gateway) pdNote(dep, prefill, decode, outcome, why string) {
	g.m.pdRequests.WithLabelValues(dep, outcome).Inc()
	if outcome == pdDisaggregated {
		return
	}
	k := dep + "\x00" + prefill + "\x00" + decode + "\x00" + outcome
	g.pd.mu.Lock()
	first := !g.pd.seen[k]
	if first {
		if g.pd.seen == nil {
			g.pd.seen, g.pd.last = map[string]bool{}, map[string]map[string]string{}
		}
		if len(g.pd.seen) < 4096 {
			g.pd.seen[k] = true
		}
	}
	if g.pd.last[dep] == nil {
		g.pd.last[dep] = map[string]string{}
	}
	g.pd.last[dep][outcome] = why
	g.pd.mu.Unlock()
	if first {
		g.cfg.Logger.Warn("prefill/decode: request not disaggregated", "deployment", dep, "outcome", outcome,
			"prefill", prefill, "decode", decode, "why", why)
	}
}

// PDOutcomes is, per disaggregated deployment, the latest reason this
// gateway saw for each outcome other than disaggregated.
func (g *Gateway) PDOutcomes() map[string]map[string]string {
	g.pd.mu.Lock()
	defer g.pd.mu.Unlock()
	out := make(map[string]map[string]string, len(g.pd.last))
	for d, m := range g.pd.last {
		c := make(map[string]string, len(m))
		for k, v := range m {
			c[k] = v
		}
		out[d] = c
	}
	return out
}

// byRole keeps the routes of one role.
func byRole(routes []*liveRoute, role string) []*liveRoute {
	out := make([]*liveRoute, 0, len(routes))
	for _, lr := range routes {
		if lr.Role == role {
			out = append(out, lr)
		}
	}
	return out
}

// legBound is the P/D bound on a leg's first byte and idle gaps: the
// configured one, and never above the engine kind's own.
func legBound(own, pd time.Duration) time.Duration {
	if own <= 0 || pd < own {
		return pd
	}
	return own
}

// forwardPD routes a request of a disaggregated deployment.
func (x *exchange) forwardPD(e *Entry, rt *routing, ep endpoint, body []byte) {
	g := x.g
	set := e.PD
	all := rt.routes[e.Name]
	decodes, prefills := byRole(all, placement.RoleDecode), byRole(all, placement.RolePrefill)
	now := g.clock.Now()
	// During a rolling update both roles run two spec versions: a decode
	// is chosen among those whose version has a live prefill, so that an
	// old decode pairs with an old prefill while the new prefill loads,
	// and the update fails no request.
	versions := map[string]bool{}
	for _, p := range prefills {
		if p.live(now) {
			versions[p.SpecVersion] = true
		}
	}
	if paired := slices.DeleteFunc(slices.Clone(decodes), func(d *liveRoute) bool { return !versions[d.SpecVersion] }); len(paired) > 0 {
		decodes = paired
	}
	req := &Request{Deployment: e.Name, Body: body, Others: rt.table.Others(e.Name, rt.own[e.Name]), ep: ep}
	dec := g.choose(req, e, decodes, nil, now)
	if dec == nil {
		why := "no decode replica is ready"
		if e.Why != "" {
			why += ": " + e.Why
		}
		g.pdNote(e.Name, "", "", pdFailed, why)
		x.fail(errNoRoute(e.Name, why))
		return
	}
	t := tries{body: body}
	t.firstByte, t.idle = g.bounds(e.Engine)
	leg := g.cfg.PDLegTimeout
	// The prefill leg is bounded by the leg timeout (callLeg). So is a
	// streamed decode's first byte (which waits for the transfer) and
	// every gap in its stream; a plain decode's first byte is its whole
	// answer, which may take minutes, so it keeps the engine's bound.
	prefillBound := legBound(t.firstByte, leg)
	if x.entry.stream {
		t.firstByte = prefillBound
	}
	t.idle = legBound(t.idle, leg)
	x.role = placement.RoleDecode

	alone := func(outcome, pre, why string) {
		g.pdNote(e.Name, pre, dec.ReplicaID, outcome, why)
		x.attemptsOn(e, req, dec, &t)
	}
	if set.skipBelow > 0 {
		if n := uncachedTokens(body, req); n < set.skipBelow {
			alone(pdSkipped, "", fmt.Sprintf("about %d uncached prompt tokens, below transfer.skip_below %d", n, set.skipBelow))
			return
		}
	}
	// A prefill of the decode's spec version: engines of two versions may
	// be two builds, whose KV the decode cannot read.
	var same, other []*liveRoute
	for _, p := range prefills {
		if !p.live(now) {
			continue
		}
		if p.SpecVersion == dec.SpecVersion {
			same = append(same, p)
		} else {
			other = append(other, p)
		}
	}
	// refuse answers a request that cannot be disaggregated: served by
	// the decode alone with transfer.fallback, else failed. With the
	// fallback the outcome stays the cause where there is one
	// (no_params, version_mismatch); a prefill that could not serve at
	// all is the fallback itself.
	refuse := func(outcome, pre, why string) {
		if set.fallback {
			if outcome == pdFailed {
				outcome = pdFallback
			}
			alone(outcome, pre, why+"; decode serves alone (transfer.fallback)")
			return
		}
		g.pdNote(e.Name, pre, dec.ReplicaID, outcome, why)
		x.fail(errPD(e.Name, why+"; transfer.fallback is off, so decode does not serve alone"))
	}
	switch {
	case len(same) == 0 && len(other) > 0:
		refuse(pdVersionMismatch, other[0].ReplicaID, fmt.Sprintf("no prefill replica of the decode's spec version %s is ready (only %s)", dec.SpecVersion, other[0].SpecVersion))
		return
	case len(same) == 0:
		why := "no prefill replica is ready"
		refuse(pdFailed, "", why)
		return
	}
	if set.bootstrap {
		x.forwardBootstrap(e, req, dec, same, &t, prefillBound, refuse)
		return
	}
	x.forwardNixl(e, req, dec, same, &t, prefillBound, refuse)
}

// attemptsOn makes the request's attempts, the first on lr, the next on
// the other routes of the exchange's role (adapterRoutes keeps to it), and
// answers the client when none took it.
func (x *exchange) attemptsOn(e *Entry, req *Request, lr *liveRoute, t *tries) {
	if x.attempts(e, req, []*liveRoute{lr}, t) {
		return
	}
	if t.final != nil {
		x.fail(t.final)
		return
	}
	x.fail(errUpstream("no %s replica of %q could take the request: %v", x.role, e.Name, t.lastErr))
}

// forwardNixl is vLLM's protocol: the prefill leg, then the decode leg
// with the prefill's kv_transfer_params.
func (x *exchange) forwardNixl(e *Entry, req *Request, dec *liveRoute, prefills []*liveRoute, t *tries, bound time.Duration, refuse func(outcome, pre, why string)) {
	g := x.g
	x.requestID()
	lreq := x.legRequest()
	leg1, err := pdPrefillBody(t.body)
	if err != nil {
		x.fail(errBadRequest("", "%v", err))
		return
	}
	var tried []*replica
	var lastErr error
	for range maxAttempts {
		now := g.clock.Now()
		pre := g.choose(req, e, prefills, tried, now)
		if pre == nil {
			break
		}
		tried = append(tried, pre.rep)
		status, answer, err := g.callLeg(x.r.Context(), lreq, pre, leg1, bound, now)
		switch {
		case x.r.Context().Err() != nil:
			x.clientGone()
			return
		case err != nil:
			lastErr = fmt.Errorf("prefill %s on %s: %w", pre.ReplicaID, pre.Node, err)
			continue
		case retryableLeg(status):
			lastErr = fmt.Errorf("prefill %s on %s answered %d", pre.ReplicaID, pre.Node, status)
			continue
		case status != http.StatusOK:
			// The client's own mistake (400): the decode would say the
			// same. The prefill's words go back in OpenAI's shape.
			g.pdNote(e.Name, pre.ReplicaID, dec.ReplicaID, pdFailed, fmt.Sprintf("prefill answered %d", status))
			x.fail(&apiError{status: status, typ: typeInvalid, code: "invalid_request", message: "the prefill engine refused the request: " + clipAnswer(answer)})
			return
		}
		params, ok := pdPrefillParams(answer)
		if !ok {
			refuse(pdNoParams, pre.ReplicaID, fmt.Sprintf("prefill %s answered without kv_transfer_params (is it started with --kv-transfer-config?)", pre.ReplicaID))
			return
		}
		leg2, err := pdDecodeBody(t.body, params)
		if err != nil {
			x.fail(errBadRequest("", "%v", err))
			return
		}
		t.body, t.paired = leg2, true
		x.attemptsOn(e, req, dec, t)
		x.pdDone(e, pre.ReplicaID, dec.ReplicaID)
		return
	}
	refuse(pdFailed, "", fmt.Sprintf("the prefill leg failed on every prefill replica tried: %v", lastErr))
}

// forwardBootstrap is SGLang's protocol (mini_lb.py): the same body, with
// the prefill's bootstrap address and a fresh room, to both at once; the
// decode's answer is the client's. A prefill leg that fails before the
// decode's answer began cancels the decode's wait on its room, and the
// pair is sent again, with a new room, to another prefill replica (mini_lb
// itself does not retry; a decode waiting on a dead prefill's room would
// otherwise wait out SGLANG_DISAGGREGATION_WAITING_TIMEOUT).
func (x *exchange) forwardBootstrap(e *Entry, req *Request, dec *liveRoute, prefills []*liveRoute, t *tries, bound time.Duration, refuse func(outcome, pre, why string)) {
	g := x.g
	x.requestID()
	lreq := x.legRequest()
	client := t.body
	var tried []*replica
	var lastErr error
	for range maxAttempts {
		pre := g.choose(req, e, prefills, tried, g.clock.Now())
		if pre == nil {
			break
		}
		tried = append(tried, pre.rep)
		host := pre.kvHost()
		if host == "" || pre.KVPort <= 0 {
			lastErr = fmt.Errorf("prefill %s publishes no bootstrap port", pre.ReplicaID)
			continue
		}
		body, err := pdBootstrapBody(client, host, pre.KVPort, g.cfg.Rand()&(1<<63-1))
		if err != nil {
			x.fail(errBadRequest("", "%v", err))
			return
		}
		t.body, t.tried, t.paired = body, nil, true
		perr, again := x.bootstrapPair(e, req, lreq, dec, pre, t, bound)
		if perr == nil || x.answered() {
			x.pdDone(e, pre.ReplicaID, dec.ReplicaID)
			return
		}
		lastErr = perr
		if !again {
			break
		}
	}
	refuse(pdFailed, "", fmt.Sprintf("the prefill leg failed on every prefill replica tried: %v", lastErr))
}

// bootstrapPair sends one pair: the prefill leg beside the decode's
// attempts. It returns the prefill leg's failure when the client has no
// answer yet because of it, and whether another prefill may do better
// (not after the prefill refused the request itself).
func (x *exchange) bootstrapPair(e *Entry, req *Request, lreq legRequest, dec, pre *liveRoute, t *tries, bound time.Duration) (error, bool) {
	// The decode's attempts derive from ctx: a prefill leg that fails
	// while the decode's answer has not begun cancels it with the
	// prefill's error as the cause, which lost leaves to the caller.
	ctx, cancel := context.WithCancelCause(x.r.Context())
	t.ctx = ctx
	type result struct {
		err   error
		again bool
	}
	done := make(chan result, 1)
	var res result
	waited := false
	defer func() {
		t.ctx = nil
		cancel(nil)
		if !waited {
			<-done // the prefill leg never outlives the request
		}
	}()
	now := x.g.clock.Now()
	go func() {
		status, answer, err := x.g.callLeg(ctx, lreq, pre, t.body, bound, now)
		r := result{again: true}
		switch {
		case err != nil:
			r.err = fmt.Errorf("prefill %s on %s: %w", pre.ReplicaID, pre.Node, err)
		case status != http.StatusOK:
			r.err = fmt.Errorf("prefill %s on %s answered %d: %s", pre.ReplicaID, pre.Node, status, clipAnswer(answer))
			r.again = retryableLeg(status)
		}
		if r.err != nil && ctx.Err() == nil && !x.begun.Load() {
			cancel(&pdLegError{r.err})
		}
		done <- r
	}()
	x.attemptsOn(e, req, dec, t)
	cancel(nil)
	res, waited = <-done, true
	if res.err != nil && !x.answered() {
		return res.err, res.again
	}
	return nil, false
}

// pdDone counts a request both of whose legs were sent, by its answer.
func (x *exchange) pdDone(e *Entry, pre, dec string) {
	if x.status >= 200 && x.status < 300 {
		x.g.pdNote(e.Name, pre, dec, pdDisaggregated, "")
		return
	}
	if x.gone {
		return
	}
	x.g.pdNote(e.Name, pre, dec, pdFailed, fmt.Sprintf("the decode leg answered %d (a failed KV transfer fails the request: kv_load_failure_policy fail)", x.status))
}

// pdLegError is the cause a decode leg is cancelled with when its prefill
// leg failed.
type pdLegError struct{ err error }

func (e *pdLegError) Error() string { return e.err.Error() }

// answered reports whether the client has an answer's status.
func (x *exchange) answered() bool { return x.status != 0 || x.gone }

// requestID gives the request one X-Request-Id for both legs: the
// client's, else a new one (the engines pair the legs' logs by it, and
// vLLM's toy proxy sends one to both).
func (x *exchange) requestID() {
	if x.r.Header.Get("X-Request-Id") != "" {
		return
	}
	x.r.Header.Set("X-Request-Id", fmt.Sprintf("llmgw-%016x", x.g.cfg.Rand()))
}

// legRequest is what a prefill leg takes of the client's request, read
// before SGLang's prefill leg runs beside the decode's attempts, so that
// the leg touches no field of the exchange.
type legRequest struct {
	path, query, caller string
	header              http.Header
	tctx                context.Context // the request's trace context; nil untraced
}

func (x *exchange) legRequest() legRequest {
	l := legRequest{path: x.r.URL.Path, query: x.r.URL.RawQuery, caller: x.caller(),
		header: cleanHeader(x.r.Header, "Authorization", "Content-Length", "Expect", "Cookie")}
	if x.span != nil {
		l.tctx = x.tctx
	}
	return l
}

// retryableLeg reports whether a prefill leg's answer says another prefill
// replica may take the leg: an engine key refused (the replica is ejected),
// busy, or failing. Any other 4xx is the request's own mistake.
func retryableLeg(status int) bool { return status != http.StatusOK && answerReason(status) != "" }

// callLeg sends a leg whose answer the gateway reads whole (a prefill) to
// lr, within bound from sending to the answer's end, and closes its books
// as an attempt's are closed (account.go): the replica's load counts it
// and frees its room when it ends, leaving routing cuts it, a refused key
// ejects the replica, a failure counts toward ejecting it, any other
// answer proves it up; it has a span of its own when the gateway traces.
func (g *Gateway) callLeg(ctx context.Context, l legRequest, lr *liveRoute, body []byte, bound time.Duration, now time.Time) (int, []byte, error) {
	ticket := lr.rep.load.begin(now)
	ctx, cancel := context.WithCancelCause(ctx)
	id := lr.rep.track(cancel)
	served := false
	defer func() {
		lr.rep.untrack(id)
		cancel(nil)
		if served {
			lr.rep.load.finish(ticket, g.clock.Now())
		} else {
			lr.rep.load.end(ticket)
		}
		g.kick(lr.Deployment)
	}()
	if bound > 0 {
		timer := g.clock.AfterFunc(bound, func() {
			cancel(&cutError{reason: reasonFirstByte, msg: fmt.Sprintf("prefill %s on %s did not answer within %s", lr.ReplicaID, lr.Node, bound)})
		})
		defer timer.Stop()
	}
	base := lr.base()
	if lr.Relay != "" {
		base = lr.Relay
	}
	u := base + l.path
	if l.query != "" {
		u += "?" + l.query
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return 0, nil, fmt.Errorf("gateway: %w", err)
	}
	req.ContentLength = int64(len(body))
	req.Header = l.header.Clone()
	if l.tctx != nil {
		sctx, sp := g.cfg.Tracer.Start(l.tctx, "llmgw.pd.prefill", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("llmgw.replica", lr.ReplicaID), attribute.String("llmgw.node", lr.Node)))
		defer sp.End()
		traceContext.Inject(sctx, propagation.HeaderCarrier(req.Header))
	}
	if lr.Relay != "" {
		if g.cfg.Relay == nil {
			return 0, nil, errNoRelaySigner
		}
		g.cfg.Relay.Sign(req, l.caller, body)
	} else if g.cfg.EngineKey != nil {
		if k := g.cfg.EngineKey(lr.EngineID); k != "" {
			req.Header.Set("Authorization", "Bearer "+k)
		}
	}
	resp, err := g.tr.RoundTrip(req)
	var answer []byte
	if err == nil {
		answer, err = io.ReadAll(io.LimitReader(resp.Body, maxPrefillAnswer))
		_ = resp.Body.Close()
	}
	var cut *cutError
	if errors.As(context.Cause(ctx), &cut) {
		err = cut
	}
	if err != nil && cut == nil && ctx.Err() != nil {
		return 0, nil, err // the client went away, or the decode leg ended
	}
	out := outcome{}
	switch {
	case cut != nil:
		out.broke = cut.reason
	case err != nil:
		out.broke = reasonConnect
	default:
		out.status = resp.StatusCode
	}
	g.closeLeg(lr, out)
	if err != nil {
		return 0, nil, err
	}
	served = resp.StatusCode == http.StatusOK
	return resp.StatusCode, answer, nil
}

// closeLeg counts a leg's outcome against its replica, as done counts an
// attempt's: upstream errors by kind, a refused key ejects at once, a
// failure counts toward ejection, any other answer proves the replica up.
func (g *Gateway) closeLeg(lr *liveRoute, out outcome) {
	now := g.clock.Now()
	answer := answerReason(out.status)
	for _, kind := range [...]string{answer, out.broke} {
		if kind != "" {
			g.m.upstreamErrors.WithLabelValues(lr.Deployment, lr.ReplicaID, kind).Inc()
		}
	}
	switch {
	case answer == reasonAuth:
		lr.rep.health.eject(now, g.cfg.EjectFor)
		g.m.ejections.WithLabelValues(lr.Deployment, lr.ReplicaID, reasonAuth).Inc()
	case out.failure() != "":
		if lr.rep.health.failed(now, g.cfg.EjectAfter, g.cfg.EjectFor) {
			g.m.ejections.WithLabelValues(lr.Deployment, lr.ReplicaID, out.failure()).Inc()
		}
	case out.status > 0:
		lr.rep.health.answered()
	}
}

// kvHost is where the route's holder is reached: the host of its URL.
func (r *Route) kvHost() string {
	u, err := url.Parse(r.URL)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// uncachedTokens estimates the prompt's tokens a decode replica would
// compute itself. The gateway does not tokenize and does not see the
// engines' caches, so: four bytes of prompt text a token (the usual
// English ratio), and of a chat of several messages whose earlier turns
// have a prefix key (prefix.go), only the last message: the prefix policy
// sends the rest where it is cached.
func uncachedTokens(body []byte, req *Request) int {
	m, err := pdFields(body)
	if err != nil {
		return 0
	}
	if p, ok := m["prompt"]; ok {
		return len(p) / 4
	}
	var msgs []json.RawMessage
	if json.Unmarshal(m["messages"], &msgs) != nil || len(msgs) == 0 {
		return 0
	}
	if _, keyed := req.PrefixKey(DefaultPrefixBytes); keyed && len(msgs) > 1 {
		return len(msgs[len(msgs)-1]) / 4
	}
	n := 0
	for _, msg := range msgs {
		n += len(msg)
	}
	return n / 4
}

func clipAnswer(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// errPD is the answer for a request of a disaggregated deployment that
// could not be disaggregated and may not be served otherwise.
func errPD(name, why string) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, typ: typeServer, code: "disaggregation_failed", retryAfter: time.Second,
		message: fmt.Sprintf("deployment %q: %s", name, why)}
}
