package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

func tracingFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "otlp-endpoint", Usage: "send the gateway's traces to this OTLP/HTTP collector (http://host:4318; a URL without a path gets /v1/traces); off by default, and OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT turn it on too (this flag wins)", Sources: cli.EnvVars("LLMGW_OTLP_ENDPOINT")},
		&cli.FloatFlag{Name: "otlp-sample-ratio", Value: 1, Usage: "the share of requests traced that come without a sampled traceparent (a client's decision is followed)", Sources: cli.EnvVars("LLMGW_OTLP_SAMPLE_RATIO")},
		// Engines run in the host's network (containerd with host
		// networking, or host processes), so the node's endpoint is
		// theirs as it is, loopback included.
		&cli.BoolFlag{Name: "otlp-engines", Usage: "vLLM engines send their own traces to the node's OTLP endpoint too (--otlp-traces-endpoint over http/protobuf; not SGLang or llama.cpp); engines share the host's network, so the address must be one the host reaches (127.0.0.1 works); needs --otlp-endpoint (or OTEL_EXPORTER_OTLP_*) and an engine image with opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http (the pinned vLLM image has none: vLLM then refuses to start)", Sources: cli.EnvVars("LLMGW_OTLP_ENGINES")},
	}
}

// tracing is what the tracing flags decided: off (endpoint and env both
// empty), or an OTLP/HTTP exporter's endpoint ("" with env: the
// exporter reads OTEL_EXPORTER_OTLP_* itself) and the sampling ratio;
// engines is the traces endpoint vLLM engines are started with ("":
// none, without --otlp-engines).
type tracing struct {
	on       bool
	endpoint string
	ratio    float64
	engines  string
}

// tracingConfig checks the tracing flags; every error names the flag.
func tracingConfig(c *cli.Command) (tracing, error) {
	t := tracing{endpoint: c.String("otlp-endpoint"), ratio: c.Float("otlp-sample-ratio")}
	if t.ratio < 0 || t.ratio > 1 {
		return t, fmt.Errorf("--otlp-sample-ratio %g: want 0 to 1 (1 traces every request)", t.ratio)
	}
	if t.endpoint != "" {
		u, err := url.Parse(t.endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return t, fmt.Errorf("--otlp-endpoint %q: want an http:// or https:// URL of an OTLP/HTTP collector, e.g. http://127.0.0.1:4318", t.endpoint)
		}
		if u.Path == "" || u.Path == "/" {
			u.Path = "/v1/traces"
		}
		t.endpoint = u.String()
	}
	t.on = t.endpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	if c.Bool("otlp-engines") {
		if t.engines = engineEndpoint(t.endpoint); t.engines == "" {
			return t, fmt.Errorf("--otlp-engines: needs --otlp-endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT): the engines send their traces where the node sends its own")
		}
	}
	return t, nil
}

// engineEndpoint is the full traces URL an engine exports to, as the
// node's exporter resolves it: the flag's (already ending in /v1/traces
// when it had no path), else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is,
// else OTEL_EXPORTER_OTLP_ENDPOINT with /v1/traces (the OTLP
// specification's rule for the signal-less variable). "" when none is set.
func engineEndpoint(flag string) string {
	if flag != "" {
		return flag
	}
	if v := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"); v != "" {
		return v
	}
	if v := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"); v != "" {
		return strings.TrimRight(v, "/") + "/v1/traces"
	}
	return ""
}

// Tracer names: the node's spans come from one provider, under the name
// of the package that makes them.
const (
	gatewayTracer = "github.com/llmgw/llmgw/supervisor/gateway"
	engineTracer  = "github.com/llmgw/llmgw/supervisor/engine"
)

// provider starts the exporter and returns the node's tracer provider (the
// gateway's spans and the engine runner's come from it) and its shutdown,
// which flushes what is batched; nil and a no-op when tracing is off.
func (t tracing) provider(ctx context.Context, node string) (trace.TracerProvider, func(), error) {
	if !t.on {
		return nil, func() {}, nil
	}
	var opts []otlptracehttp.Option
	if t.endpoint != "" {
		opts = append(opts, otlptracehttp.WithEndpointURL(t.endpoint))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("--otlp-endpoint: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(t.ratio))),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "llmgw"), attribute.String("host.name", node))))
	return tp, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(ctx)
	}, nil
}
