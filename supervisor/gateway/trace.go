package gateway

import (
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Tracing, when Config.Tracer is set: each proxied request is a server
// span that continues the client's W3C traceparent (so the sampling
// decision is the client's when it sent one: the node's sampler is
// parent-based), each attempt a client span under it, and each attempt's
// own traceparent goes to the engine, which continues the trace (vLLM
// with --otlp-traces-endpoint). With no Tracer nothing here runs: no span,
// no allocation, and a client's traceparent passes to the engine as any
// header does.

// traceContext reads and writes the traceparent and tracestate headers.
var traceContext = propagation.TraceContext{}

// startSpan opens the request's span, as a child of the client's
// traceparent when it sent one.
func (x *exchange) startSpan() {
	t := x.g.cfg.Tracer
	if t == nil {
		return
	}
	ctx := traceContext.Extract(x.r.Context(), propagation.HeaderCarrier(x.r.Header))
	x.tctx, x.span = t.Start(ctx, "llmgw.gateway "+x.r.URL.Path,
		trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(x.start))
}

// endSpan closes the request's span at end with what became of it: the
// deployment, the last replica tried and its node, how many attempts, the
// policy, time to first byte, tokens when the answer said, and the status
// the client got.
func (x *exchange) endSpan(status int, end time.Time) {
	if x.span == nil {
		return
	}
	attrs := []attribute.KeyValue{
		attribute.String("llmgw.deployment", x.model),
		attribute.String("gen_ai.request.model", x.model),
		attribute.Int("http.response.status_code", status),
		attribute.Int("llmgw.attempts", x.tries),
		attribute.String("llmgw.policy", x.g.policy.Name()),
		attribute.Bool("llmgw.stream", x.entry.stream),
	}
	if x.replica != "" {
		attrs = append(attrs, attribute.String("llmgw.replica", x.replica), attribute.String("llmgw.node", x.node))
	}
	if x.ttfb > 0 {
		attrs = append(attrs, attribute.Float64("llmgw.time_to_first_byte_seconds", x.ttfb.Seconds()))
	}
	if x.use.PromptTokens > 0 || x.use.CompletionTokens > 0 {
		attrs = append(attrs, attribute.Int64("gen_ai.usage.input_tokens", x.use.PromptTokens),
			attribute.Int64("gen_ai.usage.output_tokens", x.use.CompletionTokens))
	}
	x.span.SetAttributes(attrs...)
	if status >= http.StatusInternalServerError || status == statusClientGone {
		x.span.SetStatus(codes.Error, strconv.Itoa(status))
	}
	x.span.End(trace.WithTimestamp(end))
}

// traceAttempt opens attempt a's span under the request's and puts its
// traceparent on req, the request to the engine.
func (x *exchange) traceAttempt(a *attempt, req *http.Request) {
	x.tries++
	x.replica, x.node = a.lr.ReplicaID, a.lr.Node
	if x.span == nil {
		return
	}
	ctx, sp := x.g.cfg.Tracer.Start(x.tctx, "llmgw.attempt", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("llmgw.replica", a.lr.ReplicaID), attribute.String("llmgw.node", a.lr.Node),
			attribute.Int("llmgw.attempt", a.n), attribute.Bool("llmgw.relayed", a.lr.Relay != "")))
	a.span = sp
	traceContext.Inject(ctx, propagation.HeaderCarrier(req.Header))
}

// endAttemptSpan closes a's span with the engine's status, or why it
// broke off.
func (a *attempt) endAttemptSpan(out outcome) {
	if a.span == nil {
		return
	}
	if out.status > 0 {
		a.span.SetAttributes(attribute.Int("http.response.status_code", out.status))
	}
	if out.broke != "" {
		a.span.SetAttributes(attribute.String("llmgw.broke", out.broke))
	}
	if out.status >= http.StatusInternalServerError || out.broke != "" {
		a.span.SetStatus(codes.Error, out.broke)
	}
	a.span.End()
}
