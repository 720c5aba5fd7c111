package engine

import (
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Tracing, when Config.Tracer is set: what takes time on this node when
// it starts an engine. Each start attempt is a span "engine start" with a
// child per phase: "pull" (the image, where the runtime pulls one),
// "start" (the runtime creates and starts the engine) and "ready" (from
// then until the readiness check first passes). A shard this node takes
// over from a holder whose lease it saw lapse is a span "failover" from
// that lapse until the engine is ready, with the attempts under it.
//
// Spans of one shard on other nodes (the old holder's, a gateway's) are
// tied to these by their attributes (shard, deployment, spec version),
// never by a trace context carried in gossip: a record is the holder's
// word about its engines, and one trace across nodes would need every
// node's clock and sampler to agree.
//
// Times come from the runner's clock (trace.WithTimestamp), so spans
// follow a fake clock in tests. Without a Tracer nothing here runs: the
// spans are nil and every method returns at once.

// Span attributes, one key per fact, as the gateway's spans name them
// (supervisor/gateway/trace.go).
const (
	attrNode        = "llmgw.node"
	attrDeployment  = "llmgw.deployment"
	attrShard       = "llmgw.shard"
	attrEngineID    = "llmgw.engine.id"
	attrEngineKind  = "llmgw.engine.kind"
	attrSpecVersion = "llmgw.spec_version"
	attrImage       = "container.image.name"
	attrOutcome     = "llmgw.outcome"
	attrPrevious    = "llmgw.previous_holder"
	attrNewHolder   = "llmgw.new_holder"
	attrLapse       = "llmgw.lapse"
	attrAttempt     = "llmgw.attempt"
)

// Outcomes of a start attempt or a failover, in llmgw.outcome.
const (
	outcomeReady    = "ready"
	outcomeFailed   = "failed"
	outcomeStopped  = "stopped"
	outcomeDetached = "detached"
)

// startTrace is one engine's open spans, held by its watcher (watchState):
// the failover it is part of, if any, the current start attempt, and the
// attempt's open phase. Only the watch goroutine touches it.
type startTrace struct {
	tracer trace.Tracer
	// failover is open from the lapse until the engine is first ready;
	// failoverCtx carries it as the attempts' parent.
	failover    trace.Span
	failoverCtx context.Context
	// attempt is the open "engine start" span, ctx its context; phase its
	// open phase (pull, start or ready).
	attempt trace.Span
	ctx     context.Context
	phase   trace.Span
	// attempts counts this engine's start attempts.
	attempts int
	// marks are when the current attempt entered each phase, kept with
	// or without a tracer: the start's breakdown is published (took).
	marks map[string]time.Time
}

// took is how the current attempt spent its time up to ready at at: its
// pull (zero where the runtime pulls nothing) and from the process's
// start to ready. ok is false when this runner did not start it.
func (t *startTrace) took(at time.Time) (startTook, bool) {
	run, ok := t.marks["ready"]
	if !ok || at.Before(run) {
		return startTook{}, false
	}
	out := startTook{load: at.Sub(run)}
	if pull, ok := t.marks["pull"]; ok {
		if start, ok := t.marks["start"]; ok && !start.Before(pull) {
			out.pull = start.Sub(pull)
		}
	}
	return out, true
}

// engineAttrs are the attributes that name e's engine.
func engineAttrs(node string, d Desired, id string) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String(attrNode, node), attribute.String(attrDeployment, d.Deployment),
		attribute.String(attrShard, d.ShardID), attribute.String(attrEngineID, id),
		attribute.String(attrEngineKind, d.Spec.Engine), attribute.String(attrSpecVersion, d.SpecVersion),
	}
}

// beginFailover opens the failover span of e when the plan gave it to
// this node as a takeover (Desired.Failover), starting at the lapse.
func (t *startTrace) beginFailover(node string, e *managed) {
	f := e.failover
	if t.tracer == nil || f == nil {
		return
	}
	e.mu.Lock()
	d := e.desired
	e.mu.Unlock()
	attrs := append(engineAttrs(node, d, e.id), attribute.String(attrPrevious, f.From),
		attribute.String(attrNewHolder, node), attribute.String(attrLapse, f.Why))
	t.failoverCtx, t.failover = t.tracer.Start(context.Background(), "failover",
		trace.WithTimestamp(f.At), trace.WithAttributes(attrs...))
}

// begin opens a start attempt of e at at, under the failover when there is
// one still open.
func (t *startTrace) begin(node string, e *managed, at time.Time) {
	clear(t.marks)
	if t.tracer == nil {
		return
	}
	t.attempts++
	e.mu.Lock()
	d := e.desired
	e.mu.Unlock()
	parent := context.Background()
	if t.failover != nil {
		parent = t.failoverCtx
	}
	t.ctx, t.attempt = t.tracer.Start(parent, "engine start", trace.WithTimestamp(at),
		trace.WithAttributes(append(engineAttrs(node, d, e.id), attribute.Int(attrAttempt, t.attempts))...))
}

// image names the image the attempt starts from.
func (t *startTrace) image(ref string) {
	if t.attempt == nil || ref == "" {
		return
	}
	t.attempt.SetAttributes(attribute.String(attrImage, ref))
}

// enter ends the open phase at at, as done, and opens the phase name.
func (t *startTrace) enter(name string, at time.Time) {
	if t.marks == nil {
		t.marks = map[string]time.Time{}
	}
	t.marks[name] = at
	if t.attempt == nil {
		return
	}
	t.endPhase(at, "")
	_, t.phase = t.tracer.Start(t.ctx, name, trace.WithTimestamp(at))
}

// endPhase ends the open phase at at: failed when why is not empty.
func (t *startTrace) endPhase(at time.Time, why string) {
	if t.phase == nil {
		return
	}
	if why != "" {
		t.phase.SetStatus(codes.Error, why)
	}
	t.phase.End(trace.WithTimestamp(at))
	t.phase = nil
}

// ready ends the attempt, and the failover it belongs to, at at: the
// engine passed its readiness check.
func (t *startTrace) ready(at time.Time) {
	if t.attempt == nil {
		return
	}
	t.endAttempt(at, outcomeReady, "")
	t.endFailover(at, outcomeReady, "")
}

// fail ends the attempt at at as failed, for why. A failover stays open:
// the next attempt continues it.
func (t *startTrace) fail(at time.Time, why string) {
	t.endAttempt(at, outcomeFailed, why)
}

// stop ends everything open at at: the engine is no longer wanted here
// before it was ready.
func (t *startTrace) stop(at time.Time) {
	const why = "stopped before it was ready"
	t.endAttempt(at, outcomeStopped, why)
	t.endFailover(at, outcomeStopped, why)
}

// detach ends everything open at at without an error: the agent closes
// and leaves the engine running for the next agent to adopt, so how its
// start ends is not this agent's to say.
func (t *startTrace) detach(at time.Time) {
	t.endAttempt(at, outcomeDetached, "")
	t.endFailover(at, outcomeDetached, "")
}

func (t *startTrace) endAttempt(at time.Time, outcome, why string) {
	if t.attempt == nil {
		return
	}
	t.endPhase(at, why)
	t.attempt.SetAttributes(attribute.String(attrOutcome, outcome))
	if why != "" {
		t.attempt.SetStatus(codes.Error, why)
	}
	t.attempt.End(trace.WithTimestamp(at))
	t.attempt, t.ctx = nil, nil
}

func (t *startTrace) endFailover(at time.Time, outcome, why string) {
	if t.failover == nil {
		return
	}
	t.failover.SetAttributes(attribute.String(attrOutcome, outcome), attribute.Int(attrAttempt, t.attempts))
	if why != "" {
		t.failover.SetStatus(codes.Error, why)
	}
	t.failover.End(trace.WithTimestamp(at))
	t.failover, t.failoverCtx = nil, nil
}

// exitedWhy is how an attempt whose engine exited before it was ready
// ended.
func exitedWhy(code int) string {
	return "exited with code " + strconv.Itoa(code) + " before it was ready"
}
