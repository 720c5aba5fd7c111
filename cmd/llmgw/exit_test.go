package main

import (
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/supervisor/fakeengine"
)

// Every usage error exits 2, urfave/cli's own parse errors included, and
// says where the command's help is; an operation that fails exits 1.
func TestExitStatus(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-token")
	for _, c := range []struct {
		args []string
		want int
		says string
	}{
		{[]string{"nodes", "--bogus"}, 2, "flag provided but not defined: -bogus (see llmgw nodes --help)"},
		{[]string{"--bogus"}, 2, "flag provided but not defined: -bogus (see llmgw --help)"},
		{[]string{"bench", "--model", "m", "--concurrency", "lots"}, 2, `invalid value "lots" for flag -concurrency`},
		{[]string{"logs", "chat-0", "--tail", "1.5"}, 2, `invalid value "1.5" for flag -tail`},
		{[]string{"bench"}, 2, `Required flag "model" not set (see llmgw bench --help)`},
		{[]string{"node", "bogus"}, 2, `no command "bogus" in llmgw node`},
		{[]string{"help", "bogus"}, 2, "No help topic for 'bogus'"},
		{[]string{"nodes", "--token-file", missing}, 2, "--token-file"},
		{[]string{"mcp", "--token-file", missing}, 2, "--token-file"},
		{[]string{"top", "--once", "--token-file", missing}, 2, "--token-file"},
		{[]string{"nodes", "--addr", "http://127.0.0.1:1"}, 1, "cannot reach a node at http://127.0.0.1:1"},
	} {
		out, err := run(t, c.args...)
		if got := exitStatus(err); got != c.want || !strings.Contains(errText(err), c.says) {
			t.Errorf("llmgw %s: exit status %d (%v), want %d and an error saying %q\n%s", strings.Join(c.args, " "), got, err, c.want, c.says, out)
		}
	}
	// A group without a command is its help, not an error.
	if out, err := run(t, "node"); exitStatus(err) != 0 || !strings.Contains(out, "install") {
		t.Errorf("llmgw node: %v\n%s", err, out)
	}
	// A value from the environment that does not parse is a usage error
	// too; it is refused before anything starts.
	t.Setenv("LLMGW_LEASE_TTL", "soon")
	if _, err := run(t, "node", "up", "--data-dir", t.TempDir()); exitStatus(err) != 2 || !strings.Contains(errText(err), "LLMGW_LEASE_TTL") {
		t.Errorf("LLMGW_LEASE_TTL=soon: exit status %d (%v), want 2 naming the variable", exitStatus(err), err)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// chat and bench take the gateway's key as --api-key; --key, chat's old
// spelling, still works, hidden from the help.
func TestAPIKeyAndItsOldSpelling(t *testing.T) {
	s, err := fakeengine.NewServer(fakeengine.Config{Model: "m", APIKey: "sk-test"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	for _, flag := range []string{"--api-key", "--key"} {
		if out, err := run(t, "chat", "--gateway-addr", ts.URL, flag, "sk-test", "--max-tokens", "4", "m", "hello"); err != nil {
			t.Errorf("chat %s: %v\n%s", flag, err, out)
		}
		if out, err := run(t, "bench", "--gateway-addr", ts.URL, flag, "sk-test", "--model", "m", "--requests", "2", "--max-tokens", "2"); err != nil {
			t.Errorf("bench %s: %v\n%s", flag, err, out)
		}
	}
	// The negative control: without the key the engine refuses.
	if _, err := run(t, "chat", "--gateway-addr", ts.URL, "m", "hello"); exitStatus(err) != 1 || !strings.Contains(errText(err), "401") {
		t.Errorf("chat without a key: %v, want HTTP 401", err)
	}
	// The environment gives way to the old spelling on the command line;
	// both spellings on the command line must agree.
	t.Setenv("LLMGW_GATEWAY_KEY", "sk-stale")
	if out, err := run(t, "chat", "--gateway-addr", ts.URL, "--key", "sk-test", "m", "hello"); err != nil {
		t.Errorf("chat --key with LLMGW_GATEWAY_KEY set: %v\n%s", err, out)
	}
	if _, err := run(t, "chat", "--gateway-addr", ts.URL, "--api-key", "sk-test", "--key", "sk-other", "m", "hello"); exitStatus(err) != 2 {
		t.Errorf("--api-key and --key differing: %v, want a usage error", err)
	}
	for _, cmd := range []string{"chat", "bench"} {
		out, err := run(t, cmd, "--help")
		if err != nil || !strings.Contains(out, "--api-key") || strings.Contains(out, "--key") {
			t.Errorf("%s --help: %v; want --api-key shown and --key hidden:\n%s", cmd, err, out)
		}
	}
	out, err := run(t, "demo", "up", "--help")
	if err != nil || !strings.Contains(out, "--simulate-gpus") || strings.Contains(out, "--gpus") {
		t.Errorf("demo up --help: %v; want --simulate-gpus shown and --gpus hidden:\n%s", err, out)
	}
}
