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
	pdDisaggregated = "disaggregated"
	pdSkipped       = "skipped"   // the prompt's uncached part was below transfer.skip_below
	pdFallback      = "fallback"  // decode alone, as transfer.fallback allows
	pdNoParams      = "no_params" // the prefill answered without kv_transfer_params
	// pdRecomputed is the engine reporting that it recomputed a prompt
	// whose KV it could not load: not produced, since engines started by
	// llmgw run kv_load_failure_policy fail (a failed load fails the
	// request, counted failed) and say it only in their own metrics.
	pdRecomputed      = "recomputed"
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
	t.firstByte, t.idle = legBound(t.firstByte, leg), legBound(t.idle, leg)
	x.role = placement.RoleDecode

	alone := func(outcome, pre, why string) {
		g.pdNote(e.Name, pre, dec.ReplicaID, outcome, why)
		x.decodeLeg(e, req, dec, &t)
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
		x.forwardBootstrap(e, req, dec, same, &t, refuse)
		return
	}
	x.forwardNixl(e, req, dec, same, &t, refuse)
}

// decodeLeg sends the request (t.body) to decode replica dec first, and
// to the other decode replicas when it fails before its answer began.
func (x *exchange) decodeLeg(e *Entry, req *Request, dec *liveRoute, t *tries) {
	x.attemptsOn(e, req, dec, t)
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
func (x *exchange) forwardNixl(e *Entry, req *Request, dec *liveRoute, prefills []*liveRoute, t *tries, refuse func(outcome, pre, why string)) {
	g := x.g
	x.requestID()
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
		status, answer, err := x.callLeg(x.r.Context(), pre, leg1, t.firstByte, now)
		switch {
		case x.r.Context().Err() != nil:
			x.clientGone()
			return
		case err != nil:
			lastErr = fmt.Errorf("prefill %s on %s: %w", pre.ReplicaID, pre.Node, err)
			continue
		case status >= 500:
			lastErr = fmt.Errorf("prefill %s on %s answered %d", pre.ReplicaID, pre.Node, status)
			continue
		case status != http.StatusOK:
			// The client's own mistake (400): the decode would say the
			// same. Relay it as the prefill gave it.
			x.relayLegAnswer(status, answer)
			g.pdNote(e.Name, pre.ReplicaID, dec.ReplicaID, pdFailed, fmt.Sprintf("prefill answered %d", status))
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
		t.body = leg2
		// Only the chosen decode: the prefill's blocks are read once.
		x.attemptsOn(e, req, dec, t)
		x.pdDone(e, pre.ReplicaID, dec.ReplicaID)
		return
	}
	refuse(pdFailed, "", fmt.Sprintf("the prefill leg failed on every prefill replica tried: %v", lastErr))
}

// forwardBootstrap is SGLang's protocol: the same body, with the prefill's
// bootstrap address and a fresh room, to both at once; the decode's answer
// is the client's. A prefill leg that fails cancels the decode's wait, and
// before anything reached the client the pair is sent again, with a new
// room, to another prefill replica (mini_lb's retry).
func (x *exchange) forwardBootstrap(e *Entry, req *Request, dec *liveRoute, prefills []*liveRoute, t *tries, refuse func(outcome, pre, why string)) {
	g := x.g
	x.requestID()
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
		t.body, t.tried = body, nil
		perr := x.bootstrapPair(e, req, dec, pre, t)
		if perr == nil || x.answered() {
			x.pdDone(e, pre.ReplicaID, dec.ReplicaID)
			return
		}
		lastErr = perr
	}
	refuse(pdFailed, "", fmt.Sprintf("the prefill leg failed on every prefill replica tried: %v", lastErr))
}

// bootstrapPair sends one pair: the prefill leg beside the decode's
// attempts. It returns the prefill leg's failure, if any; the client has
// no answer yet when the decode was let go because of it.
func (x *exchange) bootstrapPair(e *Entry, req *Request, dec, pre *liveRoute, t *tries) error {
	// The decode waits on the bootstrap room until the prefill hands the
	// KV over; if the prefill leg fails, the decode leg is cancelled with
	// the prefill's error as the cause, which lost leaves to the caller.
	ctx, cancel := context.WithCancelCause(x.r.Context())
	defer cancel(nil)
	outer := x.r
	x.r = x.r.WithContext(ctx)
	defer func() { x.r = outer }()
	prefillErr := make(chan error, 1)
	body, now := t.body, x.g.clock.Now()
	go func() {
		status, answer, err := x.callLeg(ctx, pre, body, t.firstByte, now)
		switch {
		case err != nil:
			err = fmt.Errorf("prefill %s on %s: %w", pre.ReplicaID, pre.Node, err)
		case status != http.StatusOK:
			err = fmt.Errorf("prefill %s on %s answered %d: %s", pre.ReplicaID, pre.Node, status, clipAnswer(answer))
		}
		if err != nil && ctx.Err() == nil {
			cancel(&pdLegError{err})
		}
		prefillErr <- err
	}()
	x.attemptsOn(e, req, dec, t)
	cancel(nil)
	perr := <-prefillErr
	if perr != nil && !x.answered() {
		return perr
	}
	return nil
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

// callLeg sends a leg whose answer the gateway reads whole (a prefill)
// to lr, within bound from sending to the answer's end. The replica's
// load counts it, it has a span of its own when the gateway traces, and a
// connection that fails or a 5xx counts toward ejecting the replica. It
// touches nothing of the exchange but what it reads, so SGLang's prefill
// leg runs beside the decode leg's attempts.
func (x *exchange) callLeg(ctx context.Context, lr *liveRoute, body []byte, bound time.Duration, now time.Time) (int, []byte, error) {
	g := x.g
	ticket := lr.rep.load.begin(now)
	defer lr.rep.load.end(ticket)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
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
	u := base + x.r.URL.Path
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return 0, nil, fmt.Errorf("gateway: %w", err)
	}
	req.Header = cleanHeader(x.r.Header, "Authorization", "Content-Length", "Expect", "Cookie")
	if x.span != nil {
		sctx, sp := g.cfg.Tracer.Start(x.tctx, "llmgw.pd.prefill", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("llmgw.replica", lr.ReplicaID), attribute.String("llmgw.node", lr.Node)))
		defer sp.End()
		traceContext.Inject(sctx, propagation.HeaderCarrier(req.Header))
	}
	var resp *http.Response
	if lr.Relay != "" {
		if g.cfg.Relay == nil {
			return 0, nil, errNoRelaySigner
		}
		g.cfg.Relay.Sign(req, x.caller(), body)
	} else if g.cfg.EngineKey != nil {
		if k := g.cfg.EngineKey(lr.EngineID); k != "" {
			req.Header.Set("Authorization", "Bearer "+k)
		}
	}
	resp, err = g.tr.RoundTrip(req)
	var answer []byte
	if err == nil {
		answer, err = io.ReadAll(io.LimitReader(resp.Body, maxPrefillAnswer))
		_ = resp.Body.Close()
	}
	if c := (*cutError)(nil); errors.As(context.Cause(ctx), &c) {
		err = c
	}
	kind := ""
	switch {
	case err != nil && ctx.Err() != nil && !errors.As(context.Cause(ctx), new(*cutError)):
		return 0, nil, err // the client went away, or the decode leg ended
	case err != nil:
		kind = reasonConnect
		if errors.As(err, new(*cutError)) {
			kind = reasonFirstByte
		}
	case failingStatus(resp.StatusCode):
		kind = statusReason(resp.StatusCode)
	}
	if kind != "" {
		g.m.upstreamErrors.WithLabelValues(lr.Deployment, lr.ReplicaID, kind).Inc()
		if lr.rep.health.failed(g.clock.Now(), g.cfg.EjectAfter, g.cfg.EjectFor) {
			g.m.ejections.WithLabelValues(lr.Deployment, lr.ReplicaID, kind).Inc()
		}
	}
	if err != nil {
		return 0, nil, err
	}
	if !failingStatus(resp.StatusCode) {
		lr.rep.health.answered()
	}
	return resp.StatusCode, answer, nil
}

// relayLegAnswer gives the client a leg's answer as the engine gave it.
func (x *exchange) relayLegAnswer(status int, answer []byte) {
	x.w.Header().Set("Content-Type", "application/json")
	x.w.WriteHeader(status)
	_, _ = x.w.Write(answer)
	x.status = status
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
