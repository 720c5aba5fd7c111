package main

import (
	"testing"

	"github.com/llmgw/llmgw/supervisor"
	"github.com/llmgw/llmgw/supervisor/gateway"
)

// The node tells Prometheus to scrape engines at a path the relay serves:
// the two packages spell it apart (supervisor may not import the
// gateway), so this binary, which wires them, pins them equal.
func TestEngineMetricsPathIsTheRelays(t *testing.T) {
	want := "GET " + supervisor.EngineMetricsPrefix + "{engine}/metrics"
	if gateway.MetricsPattern != want {
		t.Errorf("the relay serves engine metrics at %q, Prometheus discovery names %q", gateway.MetricsPattern, want)
	}
}
