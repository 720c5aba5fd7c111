package main

import (
	"context"
	"testing"

	"github.com/urfave/cli/v3"
)

// tracingOf runs the tracing flags alone on args and returns what
// tracingConfig decided.
func tracingOf(t *testing.T, args ...string) (tracing, error) {
	t.Helper()
	var got tracing
	var cerr error
	cmd := &cli.Command{Name: "llmgw", Flags: tracingFlags(), Action: func(_ context.Context, c *cli.Command) error {
		got, cerr = tracingConfig(c)
		return nil
	}}
	if err := cmd.Run(context.Background(), append([]string{"llmgw"}, args...)); err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return got, cerr
}

// --otlp-engines gives vLLM the traces URL the node's own exporter
// uses: the flag's (with /v1/traces when it had no path), else
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is, else
// OTEL_EXPORTER_OTLP_ENDPOINT with /v1/traces; without it, none.
func TestOTLPEnginesEndpoint(t *testing.T) {
	for _, tt := range []struct {
		name           string
		args           []string
		env, tracesEnv string
		want           string
	}{
		{"flag without a path", []string{"--otlp-endpoint", "http://127.0.0.1:4318", "--otlp-engines"}, "", "", "http://127.0.0.1:4318/v1/traces"},
		{"flag with its path, over the env", []string{"--otlp-endpoint", "http://c:4318/custom/v1/traces", "--otlp-engines"}, "http://env:4318", "", "http://c:4318/custom/v1/traces"},
		{"traces env as it is", []string{"--otlp-engines"}, "http://env:4318", "http://traces:4318/x", "http://traces:4318/x"},
		{"endpoint env plus the signal's path", []string{"--otlp-engines"}, "http://env:4318/", "", "http://env:4318/v1/traces"},
		{"not asked", []string{"--otlp-endpoint", "http://127.0.0.1:4318"}, "", "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", tt.env)
			t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", tt.tracesEnv)
			got, err := tracingOf(t, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			if got.engines != tt.want || !got.on {
				t.Fatalf("engines' endpoint %q (tracing on: %v), want %q", got.engines, got.on, tt.want)
			}
		})
	}
	t.Run("LLMGW_OTLP_ENGINES", func(t *testing.T) {
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318")
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
		t.Setenv("LLMGW_OTLP_ENGINES", "true")
		if got, err := tracingOf(t); err != nil || got.engines != "http://env:4318/v1/traces" {
			t.Fatalf("with LLMGW_OTLP_ENGINES=true: %q, %v; want the env's endpoint", got.engines, err)
		}
	})
}
