package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/freeport"
	"github.com/llmgw/llmgw/internal/testwait"
)

// The engine model's flags, as a deployment's args pass them, reach the
// fake engine: the cache's shape shows in vllm:cache_config_info, and with
// --max-num-seqs 1 and a prefill of an hour a second request waits.
func TestEngineFakeModelFlags(t *testing.T) {
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		app := newApp()
		app.Writer, app.ErrWriter = io.Discard, io.Discard
		done <- app.Run(ctx, []string{"llmgw", "engine", "fake", "--model", "m", "--host", "127.0.0.1",
			"--port", strconv.Itoa(port), "--max-num-seqs", "1", "--prefill-base", "1h", "--prefill-per-1k-tokens", "1s",
			"--block-size", "32", "--num-gpu-blocks-override", "100", "--no-enable-prefix-caching"})
	}()
	var clients sync.WaitGroup
	defer func() {
		cancel()
		clients.Wait()
		if err := <-done; err != nil {
			t.Errorf("engine fake after cancel: %v", err)
		}
	}()
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	metrics := func() string {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	testwait.Until(t, 10*time.Second, "the fake engine serves /metrics", func() (bool, string) {
		m := metrics()
		return m != "", "no answer"
	})
	m := metrics()
	for _, want := range []string{`block_size="32"`, `num_gpu_blocks="100"`, `enable_prefix_caching="False"`} {
		if !regexp.MustCompile(`vllm:cache_config_info\{[^}]*` + want).MatchString(m) {
			t.Errorf("cache_config_info lacks %s:\n%s", want, m)
		}
	}
	for range 2 {
		clients.Add(1)
		go func() {
			defer clients.Done()
			req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"x"}`))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	testwait.Until(t, 10*time.Second, "one running, one waiting", func() (bool, string) {
		m := metrics()
		ok := strings.Contains(m, `vllm:num_requests_running{model_name="m"} 1`) && strings.Contains(m, `vllm:num_requests_waiting{model_name="m"} 1`)
		return ok, m
	})
}
