package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// statusClientGone is what the metrics and the access log call a request
// whose client went away before its answer ended (nginx's convention).
const statusClientGone = 499

// exchange is one proxied request on its way through the gateway: admitted
// (proxyPost), read (readBody), forwarded over one or more attempts
// (forward, attempt.go), relayed (relay.go), each attempt's books closed
// (done, account.go), and counted and logged once when it ends (finish).
// Those steps are its methods because what they change is the request's
// own (its answer, status, usage and log line); what the gateway shares
// between requests (the table, the policy, health and load, the metrics,
// the transport) they reach through g.
type exchange struct {
	g     *Gateway
	w     http.ResponseWriter
	r     *http.Request
	rc    *http.ResponseController
	start time.Time
	// model is the deployment once resolved, else unknownModel.
	model string
	// adapter is the LoRA adapter the request names, of deployment
	// model; empty for the deployment itself (lora.go). byIndex: its
	// engine takes it by index, per route (llamaCppAdapterBody).
	adapter string
	byIndex bool
	// role keeps a disaggregated deployment's attempts to one role's
	// replicas (pdroute.go); empty for any other deployment.
	role string
	// begun is set once an answer's status went to the client (commit):
	// read by SGLang's prefill leg, which runs beside the decode's
	// attempts and may cancel them only before it.
	begun    atomic.Bool
	resolved bool
	status   int
	gone     bool // the client went away
	// held: the request waited for its deployment to start from zero as
	// a stream, whose status and headers went out then (wake.go): from
	// then on every answer is an event of that stream.
	held  bool
	ttfb  time.Duration
	entry logEntry
	// key is the client's API key when the gateway has keys; its usage is
	// then read from the answers and counted under its name.
	key *apiKey
	use usage
	// body collects a plain answer for its usage, up to maxUsageBody.
	body []byte
	// bb holds the request body, shared with the attempts' readers.
	bb *bodyBuf
	// span is the request's span and tctx its context, when the gateway
	// traces (trace.go); tries counts the attempts made, and replica
	// and node name the last one's.
	span          trace.Span
	tctx          context.Context
	tries         int
	replica, node string
	// slot is the queue whose room the request holds until its first
	// attempt begins (queue.go), nil when none.
	slot *depQueue
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
	x := &exchange{g: g, w: w, r: r, rc: http.NewResponseController(w), start: g.clock.Now(), model: unknownModel}
	x.entry = logEntry{at: x.start, method: r.Method, path: r.URL.Path}
	x.startSpan()
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
	class, err := g.priority(r, x.key)
	if err != nil {
		x.fail(err)
		return
	}
	err = x.readBody()
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
	rt, e, byID, err := x.route(p.model)
	if err != nil {
		x.fail(err)
		return
	}
	// Held only when nothing of it is routable at all (at zero, or
	// waking): a replica that is there but failing answers as before.
	if e.Wakes && len(rt.routes[e.Name]) == 0 {
		rt, e, byID, err = x.awaitWake(p.model, e, p.stream, len(body))
		if x.gone {
			return
		}
		if err != nil {
			x.fail(err)
			return
		}
	}
	// The queue, for a deployment with a bound only: the rest pay
	// nothing for it.
	if e.Bound > 0 {
		x.model = e.Name
		rt, e, byID, err = x.await(p.model, rt, e, byID, class)
		if x.gone {
			return
		}
		if err != nil {
			x.fail(err)
			return
		}
		defer x.releaseSlot(true)
	}
	x.model, x.resolved = e.Name, true
	if dep, ok := rt.table.adapter(p.model); ok && dep == e.Name {
		x.adapter, x.byIndex = p.model, g.byIndex(e.Engine)
		if name := g.adapterModel(e, x.adapter); name != p.model {
			body = withModel(body, p.modelSpan, name)
		}
	}
	if byID {
		// The engine serves the deployment name only.
		body = withModel(body, p.modelSpan, e.Name)
	}
	x.forward(e, rt, ep, body)
}

// readBody reads the whole body (capped), so that a retry can resend it and
// a slow client never holds an engine's slot. Its deadline is real time:
// it is a network deadline, whatever clock the gateway judges leases by.
//
// The body lands in a pooled buffer (x.bb), which the exchange releases
// when it ends and each attempt when the transport closes its body.
func (x *exchange) readBody() *apiError {
	g := x.g
	limit := g.cfg.MaxBodyBytes
	if x.r.ContentLength > limit {
		return errBodyTooLarge(limit)
	}
	_ = x.rc.SetReadDeadline(time.Now().Add(g.cfg.BodyTimeout)) // real time: a network deadline
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

// fail answers with the gateway's own error: as a final error event when
// the stream's status already went out (a held stream).
func (x *exchange) fail(e *apiError) {
	x.status, x.entry.err = e.status, e.code
	if x.held {
		_ = x.write(sseError(e.code, e.message))
		_ = x.rc.Flush()
		return
	}
	x.g.closing(x.w)
	e.write(x.w)
}

// clientGone notes that the client went away before its answer ended:
// the metrics and the access log count it as 499.
func (x *exchange) clientGone() { x.gone, x.entry.err = true, "client went away" }

// finish counts the request and logs it; it runs even when the relay
// aborts the connection.
func (x *exchange) finish() {
	g := x.g
	end := g.clock.Now()
	d := end.Sub(x.start)
	status := x.status
	if x.gone {
		status = statusClientGone
	}
	g.m.requests.WithLabelValues(x.model, statusLabel(status)).Inc()
	if x.key != nil {
		l := x.key.label()
		a := g.adapterLabels.label(x.adapter)
		g.m.keyRequests.WithLabelValues(l, a, statusLabel(status)).Inc()
		if x.use.PromptTokens > 0 {
			g.m.keyTokens.WithLabelValues(l, a, "prompt").Add(float64(x.use.PromptTokens))
		}
		if x.use.CompletionTokens > 0 {
			g.m.keyTokens.WithLabelValues(l, a, "completion").Add(float64(x.use.CompletionTokens))
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
	x.endSpan(status, end)
}
