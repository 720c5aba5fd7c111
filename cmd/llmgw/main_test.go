package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/freeport"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/gateway"
	"github.com/llmgw/llmgw/supervisor/history"
	"github.com/llmgw/llmgw/supervisor/status"
)

// run executes the CLI in-process with a fresh command tree.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	app := newApp()
	var out bytes.Buffer
	app.Writer, app.ErrWriter = &out, &out
	err := app.Run(context.Background(), append([]string{"llmgw"}, args...))
	return out.String(), err
}

func TestBadNodeFlagsNameTheFlagAndStartNothing(t *testing.T) {
	// --otlp-engines is refused only when no endpoint is set anywhere.
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	dir := t.TempDir()
	shortKey := filepath.Join(dir, "short.key")
	os.WriteFile(shortKey, []byte("c2hvcnQ=\n"), 0o600) // "short": 5 bytes
	notB64 := filepath.Join(dir, "bad.key")
	os.WriteFile(notB64, []byte("!!!"), 0o600)
	goodKey := filepath.Join(dir, "good.key")
	os.WriteFile(goodKey, []byte("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n"), 0o600)
	base := []string{"node", "up", "--name", "n1", "--data-dir", filepath.Join(dir, "data"), "--bind", "127.0.0.1:0", "--api", "127.0.0.1:0", "--gateway", "127.0.0.1:0"}
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"--simulate-gpus", "4xH100"}, []string{"--simulate-gpus"}},
		{[]string{"--simulate-gpus", "lots-of-gpus"}, []string{"--simulate-gpus"}},
		{[]string{"--gossip-key-file", shortKey}, []string{"--gossip-key-file", "5 bytes", "16, 24 or 32"}},
		{[]string{"--gossip-key-file", notB64}, []string{"--gossip-key-file", "base64"}},
		{[]string{"--gossip-key-file", goodKey, "--insecure-gossip"}, []string{"--insecure-gossip", "--gossip-key-file"}},
		{[]string{"--join", "nowhere"}, []string{"--join", "host:port"}},
		{[]string{"--join", "no-such-host.invalid:7946"}, []string{"--join", "does not resolve"}},
		{[]string{"--join", "127.0.0.1:99999"}, []string{"--join", "port"}},
		{[]string{"--profile", "wan"}, []string{"--profile", "lan or local"}},
		{[]string{"--debug-addr", "0.0.0.0:6060"}, []string{"--debug-addr", "loopback"}},
		{[]string{"--debug-addr", "6060"}, []string{"--debug-addr", "loopback"}},
		{[]string{"--label", "novalue"}, []string{"--label", "key=value"}},
		{[]string{"--allow-from", "10.0.0.0/99"}, []string{"--allow-from", "CIDR"}},
		{[]string{"--bind", "7946"}, []string{"--bind", "host:port"}},
		{[]string{"--bind", "localhost:7946"}, []string{"--bind", "IP address"}},
		{[]string{"--otlp-endpoint", "collector:4318"}, []string{"--otlp-endpoint", "http://"}},
		{[]string{"--otlp-sample-ratio", "1.5"}, []string{"--otlp-sample-ratio", "0 to 1"}},
		{[]string{"--otlp-engines"}, []string{"--otlp-engines", "--otlp-endpoint"}},
		{[]string{"--advertise", "not-an-ip"}, []string{"--advertise"}},
		{[]string{"--advertise", "10.0.0.1:99999"}, []string{"--advertise", "0-65535"}},
		{[]string{"--lease-ttl", "10ms"}, []string{"--lease-ttl"}},
		{[]string{"--runtime", "docker"}, []string{"--runtime"}},
		{[]string{"--history-step", "10ms"}, []string{"--history-step", "at least 100ms"}},
		{[]string{"--gateway-scrape-interval", "1ms"}, []string{"--gateway-scrape-interval", "10ms to 1m"}},
		{[]string{"--gateway-balance", "0.5"}, []string{"--gateway-balance", "at least 1"}},
		{[]string{"--priority-header", "X Priority"}, []string{"--priority-header", "header name"}},
		{[]string{"--queue-depth", "0"}, []string{"--queue-depth", "1 to"}},
		{[]string{"--queue-wait", "1ms"}, []string{"--queue-wait", "100ms to 10m"}},
	}
	for _, c := range cases {
		_, err := run(t, append(append([]string{}, base...), c.args...)...)
		if err == nil {
			t.Errorf("%v: started; want an error", c.args)
			continue
		}
		msg := err.Error()
		if strings.Count(msg, "\n") > 0 {
			t.Errorf("%v: error spans several lines: %q", c.args, msg)
		}
		for _, w := range c.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%v: error %q does not mention %q", c.args, msg, w)
			}
		}
	}
	// Nothing half-started: flag validation runs before the data dir is
	// even created.
	if _, err := os.Stat(filepath.Join(dir, "data", "node.json")); !os.IsNotExist(err) {
		t.Fatalf("a failed start left node.json behind (%v)", err)
	}
}

func TestVersion(t *testing.T) {
	out, err := run(t, "version")
	if err != nil || !strings.HasPrefix(out, "llmgw ") {
		t.Fatalf("version: %q %v", out, err)
	}
}

func TestPlaceNeedsModelAndValidKV(t *testing.T) {
	_, err := run(t, "place", "chat", "--addr", "http://127.0.0.1:1")
	if err == nil || !strings.Contains(err.Error(), "--model") {
		t.Fatalf("got %v, want a --model error", err)
	}
	_, err = run(t, "place", "chat", "--model", "m", "--env", "NOEQUALS", "--addr", "http://127.0.0.1:1")
	if err == nil || !strings.Contains(err.Error(), "--env") {
		t.Fatalf("got %v, want an --env error", err)
	}
	for _, flag := range []string{"--tp", "--pp"} {
		// Sent as JSON, a 0 would be left out and run as 1.
		_, err = run(t, "place", "chat", "--model", "m", flag, "0", "--addr", "http://127.0.0.1:1")
		if err == nil || !strings.Contains(err.Error(), flag+" 0: want an integer from 1 to 64") {
			t.Fatalf("%s 0: got %v, want an error naming %s and the values it takes", flag, err, flag)
		}
	}
	_, err = run(t, "place", "chat", "--model", "m", "--gpu-memory", "lots", "--addr", "http://127.0.0.1:1")
	if err == nil || !strings.Contains(err.Error(), "--gpu-memory") {
		t.Fatalf("got %v, want a --gpu-memory error", err)
	}
}

func TestClientSaysWhichNodeItCannotReach(t *testing.T) {
	out, err := run(t, "nodes", "--addr", "http://127.0.0.1:1")
	if err == nil || !strings.Contains(err.Error(), "cannot reach a node") {
		t.Fatalf("unreachable node: %q %v", out, err)
	}
}

// recorder is a node stand-in that records what the CLI sends.
func recorder(t *testing.T) (*httptest.Server, *[]string, *[]byte) {
	t.Helper()
	var paths []string
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.Method+" "+r.URL.RequestURI())
		body, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"name":"chat","model":"m","replicas":1}`))
	}))
	t.Cleanup(srv.Close)
	return srv, &paths, &body
}

// A comma inside an --arg or --env value belongs to the value; --label
// still takes comma-separated lists.
func TestPlaceKeepsCommasInArgsAndEnv(t *testing.T) {
	srv, _, body := recorder(t)
	_, err := run(t, "place", "chat", "--model", "m", "--addr", srv.URL, "--token", "0123456789abcdef0123",
		"--arg=--served-model-name=a,b", "--arg", "--x", "--env", "A=1,2", "--label", "zone=a,rack=r1")
	if err != nil {
		t.Fatal(err)
	}
	var d placement.Deployment
	if err := json.Unmarshal(*body, &d); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.Args, []string{"--served-model-name=a,b", "--x"}) || d.Env["A"] != "1,2" || d.Labels["zone"] != "a" || d.Labels["rack"] != "r1" {
		t.Fatalf("sent args %q env %v labels %v", d.Args, d.Env, d.Labels)
	}
}

// With --file the file is the whole spec; a spec flag beside it is refused
// (it would be ignored), and nothing is sent.
func TestPlaceFileRefusesSpecFlags(t *testing.T) {
	srv, paths, _ := recorder(t)
	f := filepath.Join(t.TempDir(), "d.yaml")
	if err := os.WriteFile(f, []byte("name: chat\nmodel: m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := run(t, "place", "-f", f, "--replicas", "3", "--addr", srv.URL, "--token", "0123456789abcdef0123")
	if err == nil || !strings.Contains(err.Error(), "--replicas") {
		t.Fatalf("got %v, want an error naming --replicas", err)
	}
	if len(*paths) != 0 {
		t.Fatalf("requests sent: %v", *paths)
	}
}

// A name that is not a deployment name is refused before anything is
// sent: "fk?x=1" would otherwise delete "fk".
func TestUnplaceRefusesNonNames(t *testing.T) {
	srv, paths, _ := recorder(t)
	for _, name := range []string{"fk?x=1", "../cluster", "a/b", "Chat"} {
		_, err := run(t, "unplace", name, "--addr", srv.URL, "--token", "0123456789abcdef0123")
		if err == nil || !strings.Contains(err.Error(), "NAME") {
			t.Errorf("unplace %q: %v, want a NAME error", name, err)
		}
	}
	if len(*paths) != 0 {
		t.Fatalf("requests sent: %v", *paths)
	}
	if _, err := run(t, "unplace", "chat", "--addr", srv.URL, "--token", "0123456789abcdef0123"); err != nil {
		t.Fatal(err)
	}
	if len(*paths) != 1 || (*paths)[0] != "DELETE /v1/deployments/chat" {
		t.Fatalf("requests: %v", *paths)
	}
}

// A token file in the data dir is kept or refused, never replaced: a
// fresh token would quietly cut the node off from its cluster.
func TestDataDirTokenIsNeverReplaced(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p := filepath.Join(dir, "token")
	if err := os.WriteFile(p, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadToken("", dir, log); err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("short token: %v, want an error naming %s", err, p)
	}
	if b, _ := os.ReadFile(p); string(b) != "short\n" {
		t.Fatalf("the token file was changed to %q", b)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	tok, err := loadToken("", dir, log)
	if err != nil || len(tok) < 16 {
		t.Fatalf("no file: %q, %v; want a generated token", tok, err)
	}
	again, err := loadToken("", dir, log)
	if err != nil || again != tok {
		t.Fatalf("second start: %q, %v; want the same token %q", again, err, tok)
	}
}

func TestDemoUpRefusesBadSizes(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{{"--nodes", "0"}, {"--api-port", "65535", "--nodes", "3"}, {"--gossip-port", "0"}} {
		_, err := run(t, append([]string{"demo", "up", "--dir", dir}, args...)...)
		if err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("demo up %v: %v, want an error naming %s", args, err, args[0])
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("a refused demo wrote %d files", len(ents))
	}
}

// top --once draws one frame from /v1/cluster, /v1/deployments and
// /v1/shards: every node, each model with its engines' summed load, and
// each shard with its own.
func TestTopDrawsOneFrame(t *testing.T) {
	now := time.Now()
	nan := math.NaN()
	load := func(run, kv, gen float64) gossip.ShardLoad {
		return gossip.ShardLoad{Running: run, Waiting: 1, KVCacheUsage: kv, GenerationTPS: gen, PromptTPS: 10, RatesValid: true, ScrapedAt: now,
			PrefixHitRate: run / 5, PrefixQueriesPS: 100 * run}
	}
	answers := map[string]any{
		"/v1/cluster": status.ClusterInfo{Self: "n1", Members: []status.MemberInfo{
			{Name: "n1", State: gossip.StateAlive, GPUs: []placement.GPU{{Name: "NVIDIA H200", MemoryTotal: 140 << 30, MemoryUsed: 70 << 30}}, StartedAt: now.Add(-time.Hour),
				Telemetry: gossip.Telemetry{Links: []gossip.LinkRate{{Device: "mlx5_0", Port: 1, Up: true, TxMBps: 800.4, RxMBps: 12}, {Device: "mlx5_1", Port: 1, Up: true, TxMBps: 11.7}}}},
			{Name: "n2", State: gossip.StateDead, Probes: gossip.ProbeSummary{DriverFaultsRecent: 3, XidRecent: 1},
				Telemetry: gossip.Telemetry{Links: []gossip.LinkRate{{Device: "mlx5_0", Port: 1}}}},
		}},
		"/v1/deployments": []status.DeploymentInfo{
			{Deployment: placement.Deployment{Name: "chat", Replicas: 2}, Ready: 2},
			{Deployment: placement.Deployment{Name: "big", Replicas: 1}, Why: []string{"big-0: needs 8 GPUs"}},
		},
		// n1's gateway saw chat's requests; big's, none.
		gatewayStatsPath: gatewayStats{Node: "n1", URL: "http://10.0.0.1:8000", Window: time.Minute, Models: []gateway.ModelStats{
			{Model: "chat", Requests: 90, Rate: 1.5, Window: time.Minute, TTFBP50: 12 * time.Millisecond, TTFBP99: 1250 * time.Millisecond},
		}},
		// The asked node's hour in 12 points, one a sparkline cell: n1's
		// GPUs since the middle of it, chat's requests for the last third.
		"/v1/history": history.View{Node: "n1", StepSeconds: 300, Points: 12,
			Nodes:       []history.NodeHistory{{Name: "n1", Self: true, UtilPct: history.Series{nan, nan, nan, nan, nan, nan, 0, 20, 40, 60, 80, 100}}},
			Deployments: []history.DeploymentHistory{{Name: "chat", RequestsPerS: history.Series{1, 2, 3, 4}}}},
		"/v1/shards": []status.ShardInfo{
			{ShardID: "chat-1", Deployment: "chat", Node: "n1", GPUs: []int{1}, Status: gossip.ShardReady, Lease: placement.LeaseValid, Load: load(3, 0.5, 40)},
			{ShardID: "chat-0", Deployment: "chat", Node: "n1", GPUs: []int{0}, Status: gossip.ShardReady, Lease: placement.LeaseValid, Load: load(2, 0.25, 60)},
			{ShardID: "big-0", Deployment: "big"},
		},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := answers[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(a)
	}))
	defer srv.Close()
	out, err := run(t, "top", "--once", "--addr", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`nodes 1/2 alive\s+models 2\s+shards 2/3 ready`),
		regexp.MustCompile(`(?m)^NODE\s+STATE\s+GPUS\s+GPU MEM\s+UTIL 1H\s+SHARDS\s+FAULTS/15m\s+LINK MB/S\s+RUNTIME\s+AGE$`),
		regexp.MustCompile(`(?m)^n1\s+alive\s+1× H200\s+70\.0/140 GiB\s+ {6}▁▂▄▅▇█\s+0\s+-\s+812/12\s`),
		regexp.MustCompile(`(?m)^n2\s+dead\s+-\s+-\s+-\s+0\s+3 \(1 Xid\)\s+no link\s`),
		regexp.MustCompile(`time to first byte: last 1m, as seen by n1's gateway \(http://10\.0\.0\.1:8000\)`),
		regexp.MustCompile(`(?m)^MODEL\s+READY\s+REQ/S\s+REQ/S 1H\s+P50\s+P99\s+RUN\s+WAIT\s+KV\s+HIT\s+PROMPT/S\s+GEN/S\s+WHY$`),
		regexp.MustCompile(`(?m)^chat\s+2/2\s+1\.50\s+ {8}▃▅▆█\s+12ms\s+1\.25s\s+5\s+2\s+38%\s+52%\s+20\s+100\s+-$`),
		regexp.MustCompile(`(?m)^big\s+0/1\s+0\.00\s+-\s+-\s+-\s+-\s+-\s+-\s+-\s+-\s+-\s+big-0: needs 8 GPUs$`),
		regexp.MustCompile(`(?m)^chat-0\s+n1\s+0\s+ready\s+valid\s+2\s+1\s+25%\s+60\s+\d+s\s+0$`),
	} {
		if !want.MatchString(out) {
			t.Errorf("frame lacks %s:\n%s", want, out)
		}
	}
	if i, j := strings.Index(out, "chat-0 "), strings.Index(out, "chat-1 "); i < 0 || j < i {
		t.Errorf("shards not in order:\n%s", out)
	}
	js, err := run(t, "top", "--once", "--json", "--addr", srv.URL)
	var frame struct {
		Cluster     status.ClusterInfo      `json:"cluster"`
		Deployments []status.DeploymentInfo `json:"deployments"`
		Shards      []status.ShardInfo      `json:"shards"`
		Gateway     *gatewayStats           `json:"gateway"`
		History     *history.View           `json:"history"`
	}
	if err != nil || json.Unmarshal([]byte(js), &frame) != nil || len(frame.Shards) != 3 || len(frame.Cluster.Members) != 2 || len(frame.Deployments) != 2 ||
		frame.Gateway == nil || len(frame.Gateway.Models) != 1 || frame.History == nil || len(frame.History.Nodes) != 1 {
		t.Errorf("top --once --json: %v\n%s", err, js)
	}

	// A node without a gateway (or one too old to say): the gateway
	// columns are blank and the frame says why.
	delete(answers, gatewayStatsPath)
	out, err = run(t, "top", "--once", "--addr", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`REQ/S and TTFB blank: GET /v1/gateway/stats: 404 Not Found`),
		regexp.MustCompile(`(?m)^chat\s+2/2\s+-\s+ {8}▃▅▆█\s+-\s+-\s+5\s+2\s+38%`),
	} {
		if !want.MatchString(out) {
			t.Errorf("frame without gateway stats lacks %s:\n%s", want, out)
		}
	}
	if _, err := run(t, "top", "--interval", "10ms", "--addr", srv.URL); err == nil || !strings.Contains(err.Error(), "--interval") {
		t.Errorf("--interval 10ms: %v, want an error naming --interval", err)
	}
}

// A bad value that came from the environment says so: the flag it names
// was never typed.
func TestBadFlagFromTheEnvironmentNamesTheVariable(t *testing.T) {
	t.Setenv("LLMGW_SIMULATE_GPUS", "lots")
	if got := fromEnv("--simulate-gpus: bad"); got != "--simulate-gpus: bad (set by LLMGW_SIMULATE_GPUS)" {
		t.Errorf("fromEnv = %q", got)
	}
	if got := fromEnv("--lease-ttl 0s: want at least 1s"); got != "--lease-ttl 0s: want at least 1s" {
		t.Errorf("a flag not set by the environment: %q", got)
	}
}

// A node that cannot start says why in one line and exits 1. Before the
// fix both of these crashed with a nil dereference in supervisor.Start's
// cleanup instead, and the real error was lost.
func TestNodeUpStartErrorsAreOneLineExitOne(t *testing.T) {
	gossipPort, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	apiPort, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	args := func(dir string) []string {
		return []string{"node", "up", "--name", "n1", "--simulate-gpus", "1xH100-80GB", "--runtime", "none", "--log-level", "error",
			"--data-dir", dir, "--bind", fmt.Sprintf("127.0.0.1:%d", gossipPort), "--api", fmt.Sprintf("127.0.0.1:%d", apiPort), "--gateway", ""}
	}
	truncated := t.TempDir()
	if err := os.WriteFile(filepath.Join(truncated, "deployments.json"), []byte(`{"format_version":1,"deployments":[{"na`), 0o600); err != nil {
		t.Fatal(err)
	}
	busy := t.TempDir()
	for _, tc := range []struct {
		name string
		dir  string
		hold bool
		want string
	}{
		{"a truncated deployments.json", truncated, false, filepath.Join(truncated, "deployments.json")},
		{"the gossip port in use", busy, true, fmt.Sprintf("gossip: listen on 127.0.0.1:%d", gossipPort)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.hold {
				pc, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", gossipPort))
				if err != nil {
					t.Fatal(err)
				}
				defer pc.Close()
			}
			_, err := run(t, args(tc.dir)...)
			var ce codedError
			if !errors.As(err, &ce) || ce.code != 1 {
				t.Fatalf("err = %v; want a failure with exit status 1", err)
			}
			if !strings.Contains(ce.msg, tc.want) || strings.Contains(ce.msg, "\n") {
				t.Errorf("error %q: want one line naming %q", ce.msg, tc.want)
			}
		})
	}
}

// `llmgw logs` sends the token, which the node wants for engine logs, and
// says what the node answered when it is missing. Before, it sent none.
func TestLogsSendsTheToken(t *testing.T) {
	const token = "logs-token-0123456789"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/shards/chat-0/logs" || r.URL.Query().Get("tail") != "5" {
			http.Error(w, "unexpected "+r.URL.String(), http.StatusBadRequest)
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":"this call needs the cluster token"}`)
			return
		}
		io.WriteString(w, "engine line\n")
	}))
	defer srv.Close()
	out, err := run(t, "logs", "chat-0", "--tail", "5", "--addr", srv.URL, "--token", token)
	if err != nil || out != "engine line\n" {
		t.Fatalf("with --token: %q, %v", out, err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, "logs", "chat-0", "--tail", "5", "--addr", srv.URL, "--token-file", tokenFile); err != nil || out != "engine line\n" {
		t.Fatalf("with --token-file: %q, %v", out, err)
	}
	if _, err := run(t, "logs", "chat-0", "--tail", "5", "--addr", srv.URL); err == nil || !strings.Contains(err.Error(), "needs the cluster token") {
		t.Fatalf("without a token: %v, want the node's answer", err)
	}
}

// --min-replicas and --max-replicas send an autoscaled spec that the
// node's decoder reads back as it was meant; what only flags can get
// wrong is refused naming the flag, and nothing is sent.
func TestPlaceAutoscaleFlags(t *testing.T) {
	srv, paths, body := recorder(t)
	_, err := run(t, "place", "chat", "--model", "m", "--addr", srv.URL, "--token", "0123456789abcdef0123",
		"--min-replicas", "2", "--max-replicas", "6", "--target-inflight", "4", "--scale-down-delay", "90s")
	if err != nil {
		t.Fatal(err)
	}
	d, err := placement.DecodeDeployment(*body)
	if err != nil {
		t.Fatalf("the node would refuse %s: %v", *body, err)
	}
	if a := d.Autoscale; a == nil || *a != (placement.Autoscale{Min: 2, Max: 6, TargetInflight: 4, ScaleDownDelay: placement.Duration(90 * time.Second)}) || d.Replicas != 2 {
		t.Errorf("sent %s", *body)
	}
	sent := len(*paths)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--replicas", "3", "--min-replicas", "1", "--max-replicas", "4"}, "--replicas: not with --min-replicas/--max-replicas"},
		{[]string{"--min-replicas", "1"}, "--min-replicas and --max-replicas: give both"},
		{[]string{"--target-inflight", "4"}, "--target-inflight: only with --min-replicas and --max-replicas"},
		{[]string{"--min-replicas", "1", "--max-replicas", "4", "--target-inflight", "0"}, "--target-inflight 0: want 1 or more"},
		{[]string{"--min-replicas", "1", "--max-replicas", "4", "--scale-down-delay", "-1m"}, "--scale-down-delay -1m0s: want a duration above 0"},
		{[]string{"--min-replicas", "0", "--max-replicas", "4", "--idle-window", "0s"}, "--idle-window 0s: want a duration above 0"},
		{[]string{"--idle-window", "5m"}, "--idle-window: only with --min-replicas and --max-replicas"},
	} {
		_, err := run(t, append([]string{"place", "chat", "--model", "m", "--addr", srv.URL, "--token", "0123456789abcdef0123"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
	if len(*paths) != sent {
		t.Errorf("a refused place was sent: %v", (*paths)[sent:])
	}
}
