package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/probes/host"
)

func twoNodes(t *testing.T) (alpha, bravo *testNode) {
	t.Helper()
	alpha = startNode(t, "alpha")
	bravo = startNode(t, "bravo", alpha)
	waitAlive(t, alpha, bravo)
	return alpha, bravo
}

func clusterToolNames() []string {
	return []string{"nodes", "deployments", "shards", "why_not", "load", "place", "unplace"}
}

func TestToolsList(t *testing.T) {
	alpha, _ := twoNodes(t)
	cs := connect(t, alpha, testToken)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*mcp.Tool{}
	for _, tool := range res.Tools {
		got[tool.Name] = tool
	}
	hostTools := host.Tools(host.Config{Host: "x"})
	for _, ht := range hostTools {
		tool, ok := got[ht.Name]
		if !ok {
			t.Errorf("host tool %s missing from tools/list", ht.Name)
			continue
		}
		schema := schemaOf(t, tool)
		props := schema["properties"].(map[string]any)
		want := []string{"node"}
		for _, p := range ht.Params {
			want = append(want, p.Name)
		}
		var have []string
		for k := range props {
			have = append(have, k)
		}
		slices.Sort(want)
		slices.Sort(have)
		if !slices.Equal(want, have) {
			t.Errorf("%s: schema properties %v, want %v", ht.Name, have, want)
		}
		if schema["additionalProperties"] != false {
			t.Errorf("%s: schema allows unknown arguments: %v", ht.Name, schema)
		}
		if !strings.Contains(tool.Description, "node") {
			t.Errorf("%s: description does not mention the node argument", ht.Name)
		}
	}
	for _, name := range clusterToolNames() {
		tool, ok := got[name]
		if !ok {
			t.Errorf("cluster tool %s missing", name)
			continue
		}
		if len(tool.Description) < 60 {
			t.Errorf("%s: description too thin to say what it returns: %q", name, tool.Description)
		}
	}
	if es := got["engine_stacks"]; es == nil || !strings.Contains(es.Description, "round") {
		t.Errorf("engine_stacks must explain why it takes several rounds")
	}
	if want := len(hostTools) + len(clusterToolNames()); len(res.Tools) != want {
		t.Errorf("%d tools, want %d", len(res.Tools), want)
	}
}

func schemaOf(t *testing.T, tool *mcp.Tool) map[string]any {
	t.Helper()
	b, err := json.Marshal(tool.InputSchema)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// hostCalls are arguments that make each host tool answer.
var hostCalls = map[string]map[string]any{
	"meminfo":           nil,
	"gpu":               {"view": "apps"},
	"processes":         nil,
	"network":           nil,
	"rdma_counters":     nil,
	"pci":               nil,
	"usb":               nil,
	"systemd_units":     nil,
	"containers":        nil,
	"list_logs":         nil,
	"read_log":          {"name": "engine.log", "lines": 5, "filter": "ready"},
	"engine_stacks":     {"name": "llama-0"},
	"memory_accounting": nil,
	"driver_faults":     nil,
}

func TestEveryHostToolAnswersLocally(t *testing.T) {
	alpha, _ := twoNodes(t)
	cs := connect(t, alpha, testToken)
	for _, ht := range host.Tools(host.Config{Host: "x"}) {
		args, ok := hostCalls[ht.Name]
		if !ok {
			t.Errorf("no test call for host tool %s", ht.Name)
			continue
		}
		res := callTool(t, cs, ht.Name, args)
		out := text(res)
		if res.IsError {
			t.Errorf("%s: error: %s", ht.Name, out)
			continue
		}
		if !strings.HasPrefix(out, "[host-alpha ") {
			t.Errorf("%s: answer not stamped with host-alpha: %.200q", ht.Name, out)
		}
	}
	// Spot checks that canned and real output made it through.
	if out := text(callTool(t, cs, "gpu", map[string]any{"view": "apps"})); !strings.Contains(out, "GPU-host-alpha-0") {
		t.Errorf("gpu apps: %q", out)
	}
	if out := text(callTool(t, cs, "read_log", map[string]any{"name": "engine.log", "filter": "ready"})); !strings.Contains(out, "ready on alpha") {
		t.Errorf("read_log: %q", out)
	}
	if out := text(callTool(t, cs, "engine_stacks", nil)); strings.Count(out, "round ") < 3 {
		t.Errorf("engine_stacks: want three rounds: %q", out)
	}
	if out := text(callTool(t, cs, "engine_stacks", map[string]any{"rounds": 2, "gap_s": 0.1})); strings.Count(out, "===== round ") != 2 || !strings.Contains(out, "2 rounds 100ms apart") {
		t.Errorf("engine_stacks rounds=2 gap_s=0.1: %q", out)
	}
	// No systemd is an answer (here: not installed, or not the init
	// system, or its services listed).
	if out := text(callTool(t, cs, "systemd_units", nil)); !strings.Contains(out, "systemd") && !strings.Contains(out, "running") {
		t.Errorf("systemd_units: %q", out)
	}
	if out := text(callTool(t, cs, "meminfo", nil)); !strings.Contains(out, "MemTotal") {
		t.Errorf("meminfo: %q", out)
	}
}

func TestBadArgumentsAreToolErrors(t *testing.T) {
	alpha, _ := twoNodes(t)
	cs := connect(t, alpha, testToken)
	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"meminfo", map[string]any{"view": "apps"}, "view"}, // not a parameter of meminfo
		{"gpu", map[string]any{"view": "bogus"}, "bogus"},   // host refuses the view
		{"gpu", map[string]any{"view": 7}, "view"},          // wrong type
		{"engine_stacks", map[string]any{"rounds": 50}, "rounds 50: want 1 to 10"},
		{"engine_stacks", map[string]any{"gap_s": 600}, "gap_s 600: want 0.1 to 10 seconds"},
		{"engine_stacks", map[string]any{"gap_s": "soon"}, "gap_s"},
		{"systemd_units", map[string]any{"view": "all"}, "view"},
		{"read_log", map[string]any{"name": "../../etc/passwd"}, "leaves"}, // path escape
		{"read_log", map[string]any{"name": "engine.log", "filter": "("}, ""},
		{"why_not", nil, "give deployment"},
		{"why_not", map[string]any{"deployment": "nope"}, "no deployment"},
		{"place", map[string]any{"spec": map[string]any{"name": "Bad Name!", "model": "m"}}, "name"},
		{"place", map[string]any{}, "spec"},
		{"unplace", map[string]any{"name": "nope"}, "no deployment"},
		{"nodes", map[string]any{"name": "zulu"}, "alpha"},
	} {
		res := callTool(t, cs, c.tool, c.args)
		if !res.IsError {
			t.Errorf("%s %v: want a tool error, got %s", c.tool, c.args, text(res))
			continue
		}
		if !strings.Contains(text(res), c.want) {
			t.Errorf("%s %v: error %q does not mention %q", c.tool, c.args, text(res), c.want)
		}
	}
}

func TestClusterTools(t *testing.T) {
	alpha, bravo := twoNodes(t)
	cs := connect(t, alpha, testToken)

	res := callTool(t, cs, "nodes", nil)
	var nodes nodesOut
	decode(t, res, &nodes)
	if nodes.Self != "alpha" || len(nodes.Nodes) != 2 || nodes.Nodes[1].Name != "bravo" || len(nodes.Nodes[1].GPUs) != 4 {
		t.Fatalf("nodes: %s", text(res))
	}

	// place is the MCP twin of POST /v1/deployments.
	res = callTool(t, cs, "place", map[string]any{"spec": map[string]any{"name": "chat", "model": "m/tiny", "engine": "fake", "replicas": 2}})
	if res.IsError {
		t.Fatalf("place: %s", text(res))
	}
	res = callTool(t, cs, "place", map[string]any{"spec": map[string]any{"name": "huge", "model": "m/huge", "engine": "fake", "tensor_parallel": 8, "gpu_memory": "70GiB"}})
	if res.IsError {
		t.Fatalf("place huge: %s", text(res))
	}

	// Both nodes' plans place chat; huge fits nowhere (4 GPUs per node).
	var why whyNotOut
	bcs := connect(t, bravo, testToken)
	waitFor(t, "chat placed and huge refused, seen from bravo's view", func() bool {
		res := callTool(t, bcs, "why_not", map[string]any{"deployment": "chat"})
		if res.IsError {
			return false // not gossiped to bravo yet
		}
		decode(t, res, &why)
		if why.Placed != 2 {
			return false
		}
		res = callTool(t, bcs, "why_not", map[string]any{"deployment": "huge"})
		if res.IsError {
			return false
		}
		decode(t, res, &why)
		return len(why.Shards) == 1 && !why.Shards[0].Placed
	})
	if !strings.Contains(why.Shards[0].Why, "placed nowhere") || why.Summary == "" {
		t.Errorf("why_not huge: %+v", why)
	}
	decode(t, callTool(t, cs, "why_not", map[string]any{"shard": "chat-0"}), &why)
	if len(why.Shards) == 0 || !why.Shards[0].Placed || why.Shards[0].Node == "" || !strings.Contains(why.Summary, why.Shards[0].Node) {
		t.Errorf("why_not chat-0: %+v", why)
	}

	var deps deploymentsOut
	decode(t, callTool(t, cs, "deployments", nil), &deps)
	if len(deps.Deployments) != 2 {
		t.Errorf("deployments: %+v", deps)
	}
	decode(t, callTool(t, cs, "deployments", map[string]any{"name": "huge"}), &deps)
	if len(deps.Deployments) != 1 || len(deps.Deployments[0].Why) == 0 {
		t.Errorf("deployments huge: %+v", deps)
	}

	var sh shardsOut
	decode(t, callTool(t, cs, "shards", map[string]any{"deployment": "chat"}), &sh)
	if len(sh.Shards) != 2 {
		t.Errorf("shards chat: %+v", sh)
	}
	decode(t, callTool(t, cs, "shards", map[string]any{"status": "unplaced"}), &sh)
	if len(sh.Shards) != 1 || sh.Shards[0].Deployment != "huge" {
		t.Errorf("unplaced shards: %+v", sh)
	}

	var ld loadOut
	res = callTool(t, cs, "load", nil)
	decode(t, res, &ld)
	if ld.Shards == nil || ld.ByDeployment == nil {
		t.Errorf("load: %s", text(res))
	}

	res = callTool(t, cs, "unplace", map[string]any{"name": "huge"})
	if res.IsError {
		t.Fatalf("unplace: %s", text(res))
	}
	waitFor(t, "huge gone from bravo's view", func() bool {
		return len(bravo.node.Status().Deployments(bravo.node.Now())) == 1
	})
}

func decode(t *testing.T, res *mcp.CallToolResult, v any) {
	t.Helper()
	if res.IsError {
		t.Fatalf("tool error: %s", text(res))
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	if text(res) == "" {
		t.Errorf("no text content next to the structured answer")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, 20*time.Second, what, func() (bool, string) { return cond(), "" })
}

func TestForwardToOtherNode(t *testing.T) {
	alpha, bravo := twoNodes(t)
	cs := connect(t, alpha, testToken)

	out := text(callTool(t, cs, "meminfo", map[string]any{"node": "bravo"}))
	if !strings.HasPrefix(out, "[host-bravo ") {
		t.Errorf("meminfo forwarded to bravo: stamped %.80q", out)
	}
	// Arguments travel with the call.
	out = text(callTool(t, cs, "gpu", map[string]any{"node": "bravo", "view": "apps"}))
	if !strings.Contains(out, "GPU-host-bravo-0") {
		t.Errorf("gpu apps on bravo: %q", out)
	}
	// The peer's own tool error comes back as a tool error.
	res := callTool(t, cs, "gpu", map[string]any{"node": "bravo", "view": "bogus"})
	if !res.IsError || !strings.Contains(text(res), "bravo") {
		t.Errorf("bad view on bravo: %v %q", res.IsError, text(res))
	}
	// Naming the node itself runs locally.
	if out := text(callTool(t, cs, "meminfo", map[string]any{"node": "alpha"})); !strings.HasPrefix(out, "[host-alpha ") {
		t.Errorf("node=alpha on alpha: %.80q", out)
	}
	// And the other way round.
	bcs := connect(t, bravo, testToken)
	if out := text(callTool(t, bcs, "processes", map[string]any{"node": "alpha"})); !strings.HasPrefix(out, "[host-alpha ") {
		t.Errorf("processes from bravo on alpha: %.80q", out)
	}
	// The forwarded call counted in alpha's metrics.
	if n := countMetric(t, alpha.mcp, "meminfo", "forwarded"); n < 1 {
		t.Errorf("forwarded meminfo calls counted: %d", n)
	}
}

// A forwarded call goes to an address learned from gossip, which a forged
// record could name: it carries a signature made with a key derived from
// the token, never the token.
func TestForwardedCallsNeverCarryTheToken(t *testing.T) {
	alpha, bravo := twoNodes(t)
	_ = bravo
	cs := connect(t, alpha, testToken)
	if out := text(callTool(t, cs, "meminfo", map[string]any{"node": "bravo"})); !strings.HasPrefix(out, "[host-bravo ") {
		t.Fatalf("meminfo forwarded to bravo: %.80q", out)
	}
	sent := alpha.sent.all()
	if len(sent) == 0 {
		t.Fatal("alpha recorded no forwarded request")
	}
	for i, h := range sent {
		if a := h.Get("Authorization"); a != "" {
			t.Errorf("forwarded request %d carried Authorization %q", i, a)
		}
		if h.Get("X-Llmgw-Hop") == "" {
			t.Errorf("forwarded request %d is not signed: %v", i, h)
		}
	}
}

func TestForwardNeedsCallersToken(t *testing.T) {
	alpha, bravo := twoNodes(t)
	_ = bravo
	// A call that reached alpha without the right token never gets as
	// far as forwarding; one with it passes it on (shown above). Here:
	// a call already forwarded once is not forwarded again.
	hc := tokenClient(testToken)
	hc.Transport.(*headerTransport).set.Set(forwardedHeader, "charlie")
	cl := mcp.NewClient(&mcp.Implementation{Name: "t"}, nil)
	cs, err := cl.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: alpha.url(Path), HTTPClient: hc, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res := callTool(t, cs, "meminfo", map[string]any{"node": "bravo"})
	if !res.IsError || !strings.Contains(text(res), "not forwarding it again") {
		t.Errorf("second hop: %v %q", res.IsError, text(res))
	}
}

func TestUnknownOrGoneNode(t *testing.T) {
	alpha, bravo := twoNodes(t)
	cs := connect(t, alpha, testToken)
	res := callTool(t, cs, "meminfo", map[string]any{"node": "zulu"})
	if !res.IsError || !strings.Contains(text(res), `"zulu"`) || !strings.Contains(text(res), "live nodes: alpha, bravo") {
		t.Errorf("unknown node: %v %q", res.IsError, text(res))
	}
	if err := bravo.node.Leave(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "alpha sees bravo gone", func() bool {
		for _, m := range alpha.node.Status().Members() {
			if m.Name == "bravo" {
				return !reachable(m.State)
			}
		}
		return false
	})
	res = callTool(t, cs, "meminfo", map[string]any{"node": "bravo"})
	if !res.IsError || !strings.Contains(text(res), `node "bravo" is`) || !strings.Contains(text(res), "live nodes: alpha") || strings.Contains(text(res), "live nodes: alpha, bravo") {
		t.Errorf("gone node: %v %q", res.IsError, text(res))
	}
}

func TestTokenRequired(t *testing.T) {
	alpha := startNode(t, "alpha")
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`)
	for _, c := range []struct {
		auth string
		want int
	}{
		{"", http.StatusUnauthorized},
		{"Bearer wrong-token-0123456789", http.StatusForbidden},
		{"Basic " + testToken, http.StatusUnauthorized},
	} {
		req, _ := http.NewRequest("POST", alpha.url(Path), bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("auth %q: HTTP %d, want %d: %s", c.auth, resp.StatusCode, c.want, b)
		}
	}
	// The SDK client without the token cannot connect at all.
	cl := mcp.NewClient(&mcp.Implementation{Name: "t"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: alpha.url(Path), MaxRetries: -1, DisableStandaloneSSE: true}, nil); err == nil {
		cs.Close()
		t.Error("connected without a token")
	}
	// GET (the SSE stream) is not offered: the server is stateless.
	req, _ := http.NewRequest("GET", alpha.url(Path), nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /mcp: %d", resp.StatusCode)
	}
}

// countMetric reads the call count of one tool from the server's
// collector.
func countMetric(t *testing.T, s *Server, tool, where string) uint64 {
	t.Helper()
	var total uint64
	for _, outcome := range []string{"ok", "error"} {
		h, err := s.calls.GetMetricWithLabelValues(tool, where, outcome)
		if err != nil {
			t.Fatal(err)
		}
		m := new(dto.Metric)
		if err := h.(prometheus.Metric).Write(m); err != nil {
			t.Fatal(err)
		}
		total += m.GetHistogram().GetSampleCount()
	}
	return total
}

// /status.json names the MCP tools the node serves and its uptime, so a
// peer or an operator sees what it can ask without an MCP session.
func TestStatusJSONListsToolsAndUptime(t *testing.T) {
	alpha, _ := twoNodes(t)
	resp, err := http.Get(alpha.url("/status.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		UptimeS *float64 `json:"uptime_s"`
		Tools   []string `json:"tools"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if st.UptimeS == nil || *st.UptimeS < 0 {
		t.Errorf("uptime_s %v", st.UptimeS)
	}
	want := []string{"systemd_units", "engine_stacks", "nodes", "place"}
	for _, w := range want {
		if !slices.Contains(st.Tools, w) {
			t.Errorf("tools %v lacks %s", st.Tools, w)
		}
	}
	if n := len(host.Tools(host.Config{Host: "x"})) + len(clusterToolNames()); len(st.Tools) != n {
		t.Errorf("%d tools in /status.json, want %d", len(st.Tools), n)
	}
}
