package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/history"
	"github.com/llmgw/llmgw/supervisor/status"
)

// One real node (the process runtime, the fake engine, a gateway) under a
// request loop, its history taking a point every 200 ms: GET /v1/history
// has points in every series of chat (requests through the gateway,
// their TTFB, the engine's running, waiting and KV cache from its
// /metrics) and the node's GPU memory; simulated GPUs read no
// utilisation, and the chart says so. The page draws chat's charts and
// `llmgw top` its sparkline.
func TestHistoryThroughARealNode(t *testing.T) {
	n, token, self := nodeWithChat(t, "23400-23499", "--history-step", "200ms")
	gw := self.GatewayURL()
	testwait.Until(t, 30*time.Second, "chat ready", func() (bool, string) {
		var shards []status.ShardInfo
		err := getJSON(n.api+"/v1/shards", &shards)
		return err == nil && len(shards) == 1 && shards[0].Lease == "valid", fmt.Sprint(shards, err)
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	cl := &http.Client{Timeout: 10 * time.Second}
	defer cl.CloseIdleConnections()
	wg.Go(func() {
		for ctx.Err() == nil {
			req, _ := http.NewRequestWithContext(ctx, "POST", gw+"/v1/chat/completions", strings.NewReader(`{"model":"chat","messages":[{"role":"user","content":"hello"}],"max_tokens":8}`))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := cl.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	})
	var h history.View
	testwait.Until(t, 30*time.Second, "every series of chat has points", func() (bool, string) {
		if err := getJSON(n.api+"/v1/history", &h); err != nil {
			return false, err.Error()
		}
		if len(h.Deployments) != 1 || len(h.Nodes) != 1 {
			return false, fmt.Sprintf("%d deployments, %d nodes", len(h.Deployments), len(h.Nodes))
		}
		d := h.Deployments[0]
		rate, _ := d.RequestsPerS.Last()
		for name, s := range map[string]history.Series{"requests/s": d.RequestsPerS, "ttfb p50": d.TTFBP50, "ttfb p99": d.TTFBP99,
			"running": d.Running, "waiting": d.Waiting, "kv": d.KVCacheUsage, "gpu memory": h.Nodes[0].MemoryPct} {
			if s.Points() < 2 {
				return false, fmt.Sprintf("%s: %v", name, s)
			}
		}
		return rate > 0, fmt.Sprintf("requests/s %v", d.RequestsPerS)
	})
	if h.Node != "n1" || h.StepSeconds != 0.2 || h.Points != history.DefaultPoints || h.Collecting || !h.Nodes[0].Self || h.Nodes[0].UtilPct.Points() != 0 {
		t.Errorf("history = node %s, step %g, points %d, collecting %v, self %v, util %v", h.Node, h.StepSeconds, h.Points, h.Collecting, h.Nodes[0].Self, h.Nodes[0].UtilPct)
	}
	resp, err := cl.Get(n.api + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`<table id="charts">`, `<td class="nw">chat</td>`, `<path class="l0" d="M`, `<path class="l1" d="M`, `<div class="empty">no reading</div>`} {
		if !strings.Contains(string(page), want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	out, err := run(t, "top", "--once", "--addr", n.api)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^chat\s+1/1\s+[0-9.]+\s+ *[▁-█]+\s`).MatchString(out) {
		t.Errorf("top has no sparkline for chat:\n%s", out)
	}
	cancel()
	wg.Wait()
	if out, err := run(t, "unplace", "chat", "--addr", n.api, "--token", token); err != nil {
		t.Fatalf("unplace: %v\n%s", err, out)
	}
	testwait.Until(t, 20*time.Second, "chat's engine stops", func() (bool, string) {
		var shards []status.ShardInfo
		err := getJSON(n.api+"/v1/shards", &shards)
		return err == nil && len(shards) == 0, fmt.Sprint(shards, err)
	})
}
