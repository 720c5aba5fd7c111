package main

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/freeport"
	"github.com/llmgw/llmgw/internal/testwait"
)

// `llmgw engine fake` demands its key on /v1/* and leaves /health open, as
// the engine runner relies on when it starts the fake profile. The runner
// passes the key in VLLM_API_KEY (off the command line); --api-key wins
// over it, as vLLM's does.
func TestEngineFakeDemandsItsAPIKey(t *testing.T) {
	t.Run("from VLLM_API_KEY", func(t *testing.T) {
		t.Setenv("VLLM_API_KEY", "k-0123")
		fakeDemands(t, "k-0123")
	})
	t.Run("--api-key over VLLM_API_KEY", func(t *testing.T) {
		t.Setenv("VLLM_API_KEY", "k-env")
		fakeDemands(t, "k-flag", "--api-key", "k-flag")
	})
}

// fakeDemands runs `llmgw engine fake` with extra args and checks that it
// demands key on /v1/* and nothing on /health.
func fakeDemands(t *testing.T, key string, extra ...string) {
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	defer runEngineFake(t, append([]string{"--model", "m", "--host", "127.0.0.1", "--port", strconv.Itoa(port)}, extra...))()
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	status := func(path, auth string) int {
		req, _ := http.NewRequest("GET", base+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	testwait.Until(t, 10*time.Second, "the fake engine serves /health", func() (bool, string) {
		c := status("/health", "")
		return c == 200, "status " + strconv.Itoa(c)
	})
	if c := status("/v1/models", ""); c != 401 {
		t.Errorf("/v1/models without the key = %d, want 401", c)
	}
	if c := status("/v1/models", "Bearer "+key); c != 200 {
		t.Errorf("/v1/models with the key = %d, want 200", c)
	}
	if c := status("/v1/models", "Bearer k-env"); key != "k-env" && c != 401 {
		t.Errorf("/v1/models with VLLM_API_KEY's value under --api-key = %d, want 401", c)
	}
}
