package engine

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/supervisor/profile"
	"github.com/llmgw/llmgw/supervisor/shardstate"
)

// An engine whose /metrics lacks a metric its profile reads (here vLLM's
// KV usage, under both its names) is reported once, however often it is
// scraped: one log line, one count per metric, a note on its record while
// it is otherwise fine. (That its KV usage is unknown, not 0, is
// probes/load's TestAbsentReadingsAreUnknownNotZero.)
func TestMissingMetricIsSaidOnceAndUnknown(t *testing.T) {
	prof, err := profile.Lookup("vllm")
	if err != nil {
		t.Fatal(err)
	}
	page := "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n" +
		"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n" +
		"# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total 10\n" +
		"# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total 20\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(page)) }))
	defer srv.Close()
	_, portS, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portS)

	var logs bytes.Buffer
	env := newRunnerEnv(t)
	r, f := env.openFake(func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	defer r.Close()
	e := &managed{id: "kv-0-v1", mu: &r.mu, changes: r.changes, prof: &prof, planned: true, ready: true,
		state: shardstate.State{ShardID: "kv-0", ReplicaID: "kv-0", Spec: shardstate.Spec{HTTPPort: port, Engine: "vllm"}}}
	r.mu.Lock()
	r.engines[e.id] = e
	r.mu.Unlock()
	for range 3 {
		if _, ok := r.probe.scrapeLoad(context.Background(), e, 0); !ok {
			t.Fatal("scrape failed")
		}
		f.clk.Advance(f.poll)
	}
	want := []string{prof.Metrics.KVCacheUsage, prof.Metrics.KVCacheUsageFallback}
	got := r.MissingMetrics()
	for _, m := range want {
		if got[m] != 1 {
			t.Errorf("count of %s: %d, want 1 (once per engine): %v", m, got[m], got)
		}
	}
	if n := strings.Count(logs.String(), "does not export metrics"); n != 1 {
		t.Errorf("%d log lines about missing metrics, want 1:\n%s", n, logs.String())
	}
	s, ok := shardByID(r, "kv-0")
	if !ok || !strings.Contains(s.Note, prof.Metrics.KVCacheUsage) {
		t.Fatalf("record's note %q does not name the missing metric", s.Note)
	}
}
