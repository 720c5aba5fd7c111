package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/runtime/process"
	"github.com/llmgw/llmgw/supervisor/status"
)

// One real node, run as `llmgw node up` with the process runtime and the
// fake engine: a request through its gateway shows in GET
// /v1/gateway/stats, in `llmgw top` (as that node's gateway sees it) and
// the gateway's address in `llmgw models`. A node with --gateway "" answers
// the stats with 404 saying so, and top leaves the columns blank.
func TestGatewayStatsThroughARealNode(t *testing.T) {
	n, token, self := nodeWithChat(t, "23100-23199")
	gw := self.GatewayURL()
	if !strings.HasPrefix(gw, "http://127.0.0.1:") || self.GatewayTLS {
		t.Fatalf("published gateway %q (tls %v), want http://127.0.0.1:port", gw, self.GatewayTLS)
	}
	// Routable once the gateway lists it; /v1/models is not counted in
	// the stats, so the figures below are the one request's.
	testwait.Until(t, 30*time.Second, "the gateway routes chat", func() (bool, string) {
		var models struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if err := getJSON(gw+"/v1/models", &models); err != nil {
			return false, err.Error()
		}
		return len(models.Data) == 1 && models.Data[0].ID == "chat", fmt.Sprint(models)
	})
	cl := &http.Client{Timeout: 10 * time.Second}
	defer cl.CloseIdleConnections()
	resp, err := cl.Post(gw+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"chat","messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat through the gateway: %s %s", resp.Status, body)
	}

	var st gatewayStats
	if err := getJSON(n.api+gatewayStatsPath, &st); err != nil {
		t.Fatal(err)
	}
	if st.Node != "n1" || st.URL != gw || st.Window != time.Minute || len(st.Models) != 1 {
		t.Fatalf("stats = %+v, want n1's gateway at %s over 1m with one model", st, gw)
	}
	if m := st.Models[0]; m.Model != "chat" || m.Requests != 1 || m.Errors != 0 || m.Rate <= 0 || m.TTFBP50 <= 0 || m.TTFBP99 < m.TTFBP50 {
		t.Errorf("chat's stats = %+v, want one answered request with a time to first byte", m)
	}

	out, err := run(t, "top", "--once", "--addr", n.api)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`as seen by n1's gateway \(` + regexp.QuoteMeta(gw) + `\)`),
		regexp.MustCompile(`(?m)^MODEL\s+READY\s+REQ/S\s+REQ/S 1H\s+P50\s+P99\s+RUN\s`),
		// 1 request over 1m; the sparkline has a point once the history
		// sampled chat (every 10 s), a dash before.
		regexp.MustCompile(`(?m)^chat\s+1/1\s+0\.02\s+(-|[ ▁-█]*[▁-█])\s+[0-9.]+m?s\s+[0-9.]+m?s\s`),
	} {
		if !want.MatchString(out) {
			t.Errorf("top lacks %s:\n%s", want, out)
		}
	}
	if out, err := run(t, "models", "--addr", n.api); err != nil || !strings.HasPrefix(out, "GATEWAYS  "+gw+" (n1)") {
		t.Errorf("models: %v\n%s", err, out)
	}

	// Engines outlive their node: unplace, so that none is left behind.
	if out, err := run(t, "unplace", "chat", "--addr", n.api, "--token", token); err != nil {
		t.Fatalf("unplace: %v\n%s", err, out)
	}
	testwait.Until(t, 20*time.Second, "chat's engine stops", func() (bool, string) {
		var shards []status.ShardInfo
		err := getJSON(n.api+"/v1/shards", &shards)
		return err == nil && len(shards) == 0, fmt.Sprint(shards, err)
	})

	off := startNode(t, "off", filepath.Join(t.TempDir(), "off"), "--gateway", "")
	resp, err = cl.Get(off.api + gatewayStatsPath)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "node off runs no gateway (--gateway is empty)") {
		t.Errorf("stats without a gateway: %s %s, want 404 saying so", resp.Status, body)
	}
	out, err = run(t, "top", "--once", "--addr", off.api)
	if err != nil || !strings.Contains(out, "REQ/S and TTFB blank: 404 Not Found: node off runs no gateway (--gateway is empty)") {
		t.Errorf("top against a node without a gateway: %v\n%s", err, out)
	}
}

// nodeWithChat starts node n1 (the process runtime, engine ports in
// ports, no access log, and extra flags) and places chat on it with the
// fake engine; it hands back the node, the cluster token and the node's
// published record, once that names its gateway.
func nodeWithChat(t *testing.T, ports string, extra ...string) (*testNode, string, status.MemberInfo) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "n1")
	stopEngines(t, dir)
	n := startNode(t, "n1", dir, append([]string{"--runtime", "process", "--engine-ports", ports, "--gateway-access-log=false"}, extra...)...)
	tok, err := os.ReadFile(datadir.New(dir).TokenFile())
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tok))
	if out, err := run(t, "place", "chat", "--model", "m/tiny", "--engine", "fake", "--addr", n.api, "--token", token); err != nil {
		t.Fatalf("place: %v\n%s", err, out)
	}
	return n, token, publishedGateway(t, n)
}

// stopEngines stops, when the test ends, every engine the process runtime
// in dataDir still runs: engines outlive their node by design. Registered
// before the node starts, it runs after the node stopped.
func stopEngines(t *testing.T, dataDir string) {
	t.Helper()
	t.Cleanup(func() {
		rt, err := process.New(datadir.New(dataDir).RuntimeDir())
		if err != nil {
			return
		}
		engines, _ := rt.List(context.Background(), "")
		for _, e := range engines {
			t.Logf("stopping engine %s left running", e.ID)
			_ = rt.Stop(context.Background(), e.ID, time.Second)
		}
	})
}

// publishedGateway waits until the record of n, alone in its cluster,
// names its gateway, and hands that record back.
func publishedGateway(t *testing.T, n *testNode) status.MemberInfo {
	t.Helper()
	var self status.MemberInfo
	testwait.Until(t, 10*time.Second, "the node publishes its gateway", func() (bool, string) {
		var info status.ClusterInfo
		if err := getJSON(n.api+"/v1/cluster", &info); err != nil || len(info.Members) != 1 {
			return false, fmt.Sprint(info, err)
		}
		self = info.Members[0]
		return self.Gateway != "", "no gateway in the record"
	})
	return self
}

func getJSON(url string, out any) error {
	cl := &http.Client{Timeout: 2 * time.Second}
	defer cl.CloseIdleConnections()
	resp, err := cl.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// The stats figures top shows are written compactly; none is a dash.
func TestTTFBText(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "-", 400 * time.Microsecond: "0.4ms", 35 * time.Millisecond: "35ms", 1250 * time.Millisecond: "1.25s"} {
		if got := ttfbText(d); got != want {
			t.Errorf("ttfbText(%v) = %q, want %q", d, got, want)
		}
	}
}
