package mcpserver

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/supervisor"
	"github.com/llmgw/llmgw/supervisor/supervisortest"
)

const testToken = "mcp-test-token-0123456789abcdef"

// cannedRunner answers the commands that need hardware or privileges
// (nvidia-smi, py-spy, lspci, lsusb, dmesg) with fixed text naming the
// host, and runs the rest (ps, ip, rdma) for real.
type cannedRunner struct {
	host string
	real host.ExecRunner
	mu   sync.Mutex
	runs map[string]int
}

func newCannedRunner(hostName string) *cannedRunner {
	return &cannedRunner{host: hostName, runs: map[string]int{}}
}

func (r *cannedRunner) canned(name string, args []string) (string, bool) {
	switch name {
	case "nvidia-smi":
		if len(args) > 0 && strings.HasPrefix(args[0], "--query-compute-apps") {
			return "pid, process_name, used_memory [MiB], gpu_uuid\n4242, python3, 71234 MiB, GPU-" + r.host + "-0\n", true
		}
		return "| NVIDIA-SMI 580.00 canned for " + r.host + " |\n|  0  NVIDIA H100 80GB HBM3  |\n", true
	case "py-spy":
		return "Thread 0x1 (active): \"MainThread\"\n    wait (threading.py:320)\n    step (vllm/engine.py:100)\n", true
	case "lspci":
		return "00:00.0 Host bridge [0600]: canned [8086:1237]\n", true
	case "lsusb":
		return "/:  Bus 01.Port 1: Dev 1, Class=root_hub, Driver=xhci_hcd/4p, 480M\n", true
	case "dmesg":
		return "[Mon Nov 30 00:00:01 2026] NVRM: Xid (PCI:0000:17:00): 79, pid=1, GPU has fallen off the bus.\n", true
	}
	return "", false
}

func (r *cannedRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	r.mu.Lock()
	r.runs[name]++
	r.mu.Unlock()
	if out, ok := r.canned(name, args); ok {
		return []byte(out), ctx.Err()
	}
	return r.real.Run(ctx, name, args...)
}

func (r *cannedRunner) LookPath(name string) (string, error) {
	if _, ok := r.canned(name, nil); ok {
		return "/canned/" + name, nil
	}
	return r.real.LookPath(name)
}

type testNode struct {
	name       string
	node       *supervisor.Node
	mcp        *Server
	gossipPort int
	// sent records the headers of every request this node's MCP server
	// sent to another node.
	sent *recordingTransport
}

// recordingTransport records the headers of what goes through it.
type recordingTransport struct {
	base    http.RoundTripper
	mu      sync.Mutex
	headers []http.Header
}

func (t *recordingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.mu.Lock()
	t.headers = append(t.headers, r.Header.Clone())
	t.mu.Unlock()
	return t.base.RoundTrip(r)
}

func (t *recordingTransport) all() []http.Header {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.headers)
}

func (tn *testNode) url(path string) string { return "http://" + tn.node.APIAddr() + path }

// startNode starts a real node on loopback with MCP registered through
// Config.Extra, as `llmgw node up` does. Host tools stamp "host-<name>".
func startNode(tb testing.TB, name string, join ...*testNode) *testNode {
	tb.Helper()
	logDir := tb.TempDir()
	if err := os.WriteFile(filepath.Join(logDir, "engine.log"), []byte("starting\nready on "+name+"\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	tn := &testNode{name: name, sent: &recordingTransport{base: http.DefaultTransport}}
	var joins []int
	for _, j := range join {
		joins = append(joins, j.gossipPort)
	}
	cfg := supervisortest.Config(tb, name, joins...)
	cfg.Token = testToken
	cfg.Extra = func(n *supervisor.Node, mux *http.ServeMux) {
		tn.mcp = Register(n, mux, Options{
			Host: host.Config{
				Host: "host-" + name, Runner: newCannedRunner("host-" + name), LogDir: logDir,
				Engines: func(context.Context) ([]host.EngineProcess, error) {
					return []host.EngineProcess{{Name: "llama-0", PID: os.Getpid()}}, nil
				},
				Sleep:    func(context.Context, time.Duration) error { return nil },
				StackGap: time.Millisecond,
			},
			Version:    "test",
			HTTPClient: &http.Client{Transport: tn.sent},
		})
	}
	tn.node = supervisortest.Start(tb, cfg)
	tn.gossipPort = supervisortest.GossipPort(tb, tn.node)
	return tn
}

// waitAlive waits until every node sees every other alive with an API
// address.
func waitAlive(tb testing.TB, nodes ...*testNode) {
	tb.Helper()
	testwait.Until(tb, 15*time.Second, "every node sees every other alive", func() (bool, string) {
		for _, a := range nodes {
			seen := map[string]bool{}
			for _, m := range a.node.Status().Members() {
				if m.State == gossip.StateAlive && m.API != "" {
					seen[m.Name] = true
				}
			}
			for _, b := range nodes {
				if !seen[b.name] {
					return false, a.name + " does not see " + b.name
				}
			}
		}
		return true, ""
	})
}

// tokenClient sends the bearer token on every request.
func tokenClient(token string) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 256
	set := http.Header{}
	if token != "" {
		set.Set("Authorization", "Bearer "+token)
	}
	return &http.Client{Transport: &headerTransport{base: t, set: set}}
}

// connect opens an MCP client session to a node through the SDK's own
// streamable HTTP client.
func connect(tb testing.TB, tn *testNode, token string) *mcp.ClientSession {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := mcp.NewClient(&mcp.Implementation{Name: "mcpserver-test", Version: "test"}, nil)
	cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: tn.url(Path), HTTPClient: tokenClient(token), DisableStandaloneSSE: true}, nil)
	if err != nil {
		tb.Fatalf("connect to %s: %v", tn.name, err)
	}
	tb.Cleanup(func() { _ = cs.Close() })
	return cs
}

// callTool calls a tool and fails the test on a protocol error.
func callTool(tb testing.TB, cs *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if args == nil {
		args = map[string]any{}
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		tb.Fatalf("call %s %v: %v", name, args, err)
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			b.WriteString(t.Text)
		}
	}
	return b.String()
}

func mustJSON(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
