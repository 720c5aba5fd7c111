package gateway

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	collector "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/fakeengine"
)

// otlpReceiver is an OTLP/HTTP collector: it keeps every span exported to
// it.
type otlpReceiver struct {
	*httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	rc := &otlpReceiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req collector.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
			http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				rc.spans = append(rc.spans, ss.Spans...)
			}
		}
		rc.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&collector.ExportTraceServiceResponse{})
		w.Write(out)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *otlpReceiver) named(name string) []*tracepb.Span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range rc.spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s *tracepb.Span, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			v := kv.Value
			switch {
			case v.GetStringValue() != "":
				return v.GetStringValue()
			default:
				return fmt.Sprint(v.GetIntValue())
			}
		}
	}
	return ""
}

// A chat through a tracing gateway, sent with a client's traceparent,
// is exported over OTLP/HTTP as the gateway's span, a child of the
// client's, with an attempt span under it; and the engine receives a
// traceparent of the same trace, naming the attempt's span as its parent.
func TestTracesContinueTheClientsTraceIntoTheEngine(t *testing.T) {
	rc := newOTLPReceiver(t)
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(rc.URL+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	up := newUpstream(t, chatOK)
	h := newHarness(t, Config{Tracer: tp.Tracer("test")}, oneDeployment(up.URL).snapshot())

	const traceID, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	// Sampled by the client: the gateway's sampler (parent-based, never
	// sampling a root) follows the client's decision.
	a := h.post("/v1/chat/completions", chatBody("chat", false), "traceparent", "00-"+traceID+"-"+clientSpan+"-01")
	if a.status != http.StatusOK {
		t.Fatalf("chat: %d %s", a.status, a.body)
	}
	var gw, att *tracepb.Span
	testwait.Until(t, 5*time.Second, "the gateway's and the attempt's spans exported", func() (bool, string) {
		g, at := rc.named("llmgw.gateway /v1/chat/completions"), rc.named("llmgw.attempt")
		if len(g) != 1 || len(at) != 1 {
			return false, fmt.Sprintf("%d gateway spans, %d attempt spans", len(g), len(at))
		}
		gw, att = g[0], at[0]
		return true, ""
	})
	if got := hex.EncodeToString(gw.TraceId); got != traceID {
		t.Errorf("gateway span in trace %s, want the client's %s", got, traceID)
	}
	if got := hex.EncodeToString(gw.ParentSpanId); got != clientSpan {
		t.Errorf("gateway span's parent %s, want the client's span %s", got, clientSpan)
	}
	if gw.Kind != tracepb.Span_SPAN_KIND_SERVER || att.Kind != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("kinds: gateway %v, attempt %v", gw.Kind, att.Kind)
	}
	if hex.EncodeToString(att.TraceId) != traceID || string(att.ParentSpanId) != string(gw.SpanId) {
		t.Errorf("attempt span: trace %x parent %x, want trace %s under the gateway's span %x", att.TraceId, att.ParentSpanId, traceID, gw.SpanId)
	}
	for k, want := range map[string]string{"llmgw.deployment": "chat", "llmgw.node": "n1", "llmgw.attempts": "1", "http.response.status_code": "200"} {
		if got := attr(gw, k); got != want {
			t.Errorf("gateway span %s = %q, want %q", k, got, want)
		}
	}
	tp0 := up.lastHeader().Get("traceparent")
	if want := "00-" + traceID + "-" + hex.EncodeToString(att.SpanId) + "-01"; tp0 != want {
		t.Errorf("the engine got traceparent %q, want %q (the attempt's span, same trace)", tp0, want)
	}
}

// Without a Tracer the gateway traces nothing and passes a client's
// traceparent to the engine untouched.
func TestNoTracerPassesTraceparentThrough(t *testing.T) {
	up := newUpstream(t, chatOK)
	h := newHarness(t, Config{}, oneDeployment(up.URL).snapshot())
	const in = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if a := h.post("/v1/chat/completions", chatBody("chat", false), "traceparent", in); a.status != http.StatusOK {
		t.Fatalf("chat: %d %s", a.status, a.body)
	}
	if got := up.lastHeader().Get("traceparent"); !strings.EqualFold(got, in) {
		t.Errorf("the engine got traceparent %q, want the client's %q", got, in)
	}
}

// BenchmarkGatewayTracing offers the same 1,000 requests/s, open loop, to
// two gateways in alternate windows, one without a Tracer and one tracing
// every request (ratio 1.0: a span per request and per attempt, the
// traceparent to the engine, batched OTLP/HTTP export to a collector on
// loopback): added is what tracing costs a request.
func BenchmarkGatewayTracing(b *testing.B) {
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer sink.Close()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(sink.URL+"/v1/traces"))
	if err != nil {
		b.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	off := newBenchPairWith(b, fixedChat, Config{})
	on := newBenchPairWith(b, fixedChat, Config{Tracer: tp.Tracer("bench")})
	defer off.close()
	defer on.close()
	p := &benchPair{direct: off.gateway, gateway: on.gateway}
	body := promptBody(1<<10, false)
	untraced, traced := interleave(b, p, 2, benchWindow/2, func(pt *benchPath, d time.Duration, s *pathStats) error {
		return openLoop(pt, body, d, s)
	})
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	for _, q := range []struct {
		name string
		q    float64
	}{{"p50", .5}, {"p99", .99}} {
		u, t := pct(untraced.lat, q.q), pct(traced.lat, q.q)
		b.ReportMetric(us(u), "untraced-"+q.name+"-µs")
		b.ReportMetric(us(t), "traced-"+q.name+"-µs")
		b.ReportMetric(us(t-u), "added-"+q.name+"-µs")
	}
	b.ReportMetric(traced.rate()/untraced.rate(), "throughput-ratio")
}

// A disaggregated request has a span per leg, both under the gateway's:
// llmgw.pd.prefill for the prefill leg and llmgw.attempt for the decode's.
func TestPDTracesASpanPerLeg(t *testing.T) {
	rc := newOTLPReceiver(t)
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(rc.URL+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	pre, _, _ := pdFake(t, fakeengine.KVTransfer{Connector: "NixlConnector", Role: "kv_both", EngineID: "engine-p"})
	dec, _, _ := pdFake(t, fakeengine.KVTransfer{Connector: "NixlConnector", Role: "kv_both", EngineID: "engine-d"})
	h := newHarness(t, Config{Tracer: tp.Tracer("test")}, pdWorld("fake", pre.URL, dec.URL, 0, nil).snapshot())
	if a := h.post("/v1/chat/completions", longChat(false)); a.status != http.StatusOK {
		t.Fatalf("chat: %d %s", a.status, a.body)
	}
	testwait.Until(t, 5*time.Second, "a span per leg under the gateway's", func() (bool, string) {
		g, p, d := rc.named("llmgw.gateway /v1/chat/completions"), rc.named("llmgw.pd.prefill"), rc.named("llmgw.attempt")
		if len(g) != 1 || len(p) != 1 || len(d) != 1 {
			return false, fmt.Sprintf("%d gateway, %d prefill, %d attempt spans", len(g), len(p), len(d))
		}
		if string(p[0].ParentSpanId) != string(g[0].SpanId) || string(d[0].ParentSpanId) != string(g[0].SpanId) {
			return false, "a leg's span is not under the gateway's"
		}
		return attr(p[0], "llmgw.replica") == "pd-p0" && attr(d[0], "llmgw.replica") == "pd-d0", fmt.Sprintf("replicas %q and %q", attr(p[0], "llmgw.replica"), attr(d[0], "llmgw.replica"))
	})
}
