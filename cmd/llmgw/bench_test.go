package main

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/supervisor/fakeengine"
)

func benchEngine(t *testing.T) *httptest.Server {
	t.Helper()
	s, err := fakeengine.NewServer(fakeengine.Config{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return ts
}

// `llmgw bench --json` against a fake engine: the report counts what was
// sent and answered, in the shape scripts read.
func TestBenchJSON(t *testing.T) {
	ts := benchEngine(t)
	out, err := run(t, "bench", "--gateway-addr", ts.URL, "--model", "m", "--requests", "12", "--concurrency", "3",
		"--tenants", "2", "--system-prompt-tokens", "64", "--max-tokens", "4", "--stream", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var rep struct {
		Requests, Succeeded, Failed int
		OutputTokens                int                             `json:"output_tokens"`
		TTFB                        struct{ P50, P90, P99 float64 } `json:"ttfb_ms"`
		Errors                      map[string]int
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if rep.Requests != 12 || rep.Succeeded != 12 || rep.OutputTokens != 48 || len(rep.Errors) != 0 || rep.TTFB.P50 <= 0 {
		t.Errorf("report %+v from %s", rep, out)
	}
}

// The text report names every measure, and a prompt file is a workload.
func TestBenchTextWithPromptFile(t *testing.T) {
	ts := benchEngine(t)
	file := filepath.Join(t.TempDir(), "prompts.txt")
	os.WriteFile(file, []byte("what is a GPU?\n\nhow do leases work?\n"), 0o600)
	out, err := run(t, "bench", "--gateway-addr", ts.URL, "--model", "m", "--requests", "4", "--prompt-file", file)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"4 requests to m", "succeeded        4 of 4", "requests/s", "output tokens/s", "TTFB ms", "p99", "latency ms", "errors           none", "replicas"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// Nothing answering is a failure that says so, with the errors by kind.
func TestBenchNothingSucceeds(t *testing.T) {
	ts := benchEngine(t)
	out, err := run(t, "bench", "--gateway-addr", ts.URL, "--model", "other", "--requests", "2")
	if err == nil || !strings.Contains(err.Error(), "http 404: 2") || !strings.Contains(out, "succeeded        0 of 2") {
		t.Errorf("error %v, output:\n%s", err, out)
	}
}

func TestBenchBadFlagsNameTheFlag(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.txt")
	os.WriteFile(empty, nil, 0o600)
	base := []string{"bench", "--gateway-addr", "http://127.0.0.1:1", "--model", "m"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--concurrency", "0"}, "--concurrency"},
		{[]string{"--rate", "-2"}, "--rate"},
		{[]string{"--requests", "-1"}, "--requests"},
		{[]string{"--requests", "0"}, "--requests"},
		{[]string{"--duration", "-1s"}, "--duration"},
		{[]string{"--max-tokens", "-1"}, "--max-tokens"},
		{[]string{"--tenants", "0"}, "--tenants"},
		{[]string{"--tenants", "2", "--system-prompt-tokens", "0"}, "--system-prompt-tokens"},
		{[]string{"--system-prompt-tokens", "100"}, "--tenants"},
		{[]string{"--prompt-file", empty, "--tenants", "2"}, "choose one workload"},
		{[]string{"--prompt-file", empty}, "--prompt-file"},
		{[]string{"--prompt-file", "/no/such/file"}, "--prompt-file"},
		{[]string{"--gateway-addr", "127.0.0.1:8000"}, "--gateway-addr"},
	} {
		out, err := run(t, append(append([]string{}, base...), c.args...)...)
		var ce codedError
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one naming %s (output %q)", c.args, err, c.want, out)
		} else if !errors.As(err, &ce) || ce.code != 2 {
			t.Errorf("%v: %v is not a usage error", c.args, err)
		}
	}
}
