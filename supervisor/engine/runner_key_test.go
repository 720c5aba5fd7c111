package engine

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/secret"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
)

const testToken = "test-token-0123456789abcdef"

func keyFor(token string) func(string) string {
	return func(id string) string { return secret.EngineKey(token, id) }
}

// httpStatus sends one request with an optional bearer key and returns the
// status code.
func httpStatus(t *testing.T, method, url, key, body string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// An engine started with its key answers 401 on its API without it (and
// with another engine's key), so only whoever derives the key reaches it;
// the runner still finds it ready, scrapes its load, and, after an agent
// restart, adopts it as ready.
func TestEngineDemandsItsKeyAndTheRunnerPresentsIt(t *testing.T) {
	env := newRunnerEnv(t)
	r := env.openWith(func(c *Config) { c.EngineKey = keyFor(testToken) })
	d := desired("chat")
	runReady(t, r, d)
	pid := readyPID(r, "chat-0")
	url := r.Shards()[0].URL
	key := secret.EngineKey(testToken, placement.EngineID(d.ShardID, d.SpecVersion))
	// The key is in the engine's environment, not on its command line,
	// which every local user can read.
	argv, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(argv), key) {
		t.Errorf("the engine's key is on its command line: %q", strings.ReplaceAll(string(argv), "\x00", " "))
	}
	if environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err != nil || !slices.Contains(strings.Split(string(environ), "\x00"), "VLLM_API_KEY="+key) {
		t.Errorf("VLLM_API_KEY=<key> not in the engine's environment (%v)", err)
	}

	for _, tc := range []struct {
		key  string
		want int
	}{
		{"", http.StatusUnauthorized},
		{secret.EngineKey(testToken, "chat-0-another"), http.StatusUnauthorized},
		{secret.EngineKey("other-token-0123456789abcdef", placement.EngineID(d.ShardID, d.SpecVersion)), http.StatusUnauthorized},
		{key, http.StatusOK},
	} {
		if got := httpStatus(t, "GET", url+"/v1/models", tc.key, ""); got != tc.want {
			t.Errorf("/v1/models with key %q = %d, want %d", tc.key, got, tc.want)
		}
	}

	body := `{"model":"chat","messages":[{"role":"user","content":"one two three"}]}`
	testwait.Until(t, 10*time.Second, "load scraped, generation rate seen", func() (bool, string) {
		if c := httpStatus(t, "POST", url+"/v1/chat/completions", key, body); c != http.StatusOK {
			return false, fmt.Sprintf("chat with the key: %d", c)
		}
		l := r.Shards()[0].Load
		return l.Error == "" && l.RatesValid && l.GenerationTPS > 0 && !l.ScrapedAt.IsZero(), fmt.Sprintf("%+v", l)
	})

	// The agent restarts: the new runner derives the same key, so the
	// engine it adopts is ready at once.
	r.Close()
	r2 := env.openUnsettled(func(c *Config) { c.EngineKey = keyFor(testToken) })
	t.Cleanup(func() {
		r2.Settle()
		r2.Reconcile(context.Background(), nil)
		waitShard(t, r2, "stopped", func(s []string) bool { return len(s) == 0 })
	})
	if s := r2.Shards(); len(s) != 1 || !s[0].Ready || s[0].PID != pid {
		t.Fatalf("after the restart the runner reports %+v; want chat-0 ready, pid %d", s, pid)
	}
}

// A runner whose keys are not the engine's (another token) does not take
// the engine for ready: its models path refuses the probe.
func TestEngineWithAnotherKeyIsNotReady(t *testing.T) {
	env := newRunnerEnv(t)
	r := env.openWith(func(c *Config) { c.EngineKey = keyFor(testToken) })
	runReady(t, r, desired("chat"))
	r.Close()

	r2 := env.openUnsettled(func(c *Config) { c.EngineKey = keyFor("other-token-0123456789abcdef") })
	t.Cleanup(func() {
		r2.Settle()
		r2.Reconcile(context.Background(), nil)
		waitShard(t, r2, "stopped", func(s []string) bool { return len(s) == 0 })
	})
	if s := r2.Shards(); len(s) != 1 || s[0].Ready || s[0].PID == 0 {
		t.Fatalf("adopted with another token's keys: %+v; want chat-0 running but not ready", s)
	}
}
