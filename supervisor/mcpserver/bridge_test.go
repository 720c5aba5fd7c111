package mcpserver

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// startBridge runs Bridge against node tn over an in-memory transport (in
// place of stdio) and returns a client of the bridge.
func startBridge(t *testing.T, tn *testNode, token string) (*mcp.ClientSession, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ct, st := mcp.NewInMemoryTransports()
	done := make(chan error, 1)
	go func() { done <- Bridge(ctx, BridgeConfig{Endpoint: tn.url(Path), Token: token, Version: "test"}, st) }()
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "desktop"}, nil).Connect(cctx, ct, nil)
	if err != nil {
		select {
		case berr := <-done:
			t.Fatalf("bridge: %v (client: %v)", berr, err)
		default:
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs, done
}

func TestBridgeForwardsListAndCall(t *testing.T) {
	alpha, _ := twoNodes(t)
	cs, _ := startBridge(t, alpha, testToken)
	ctx := context.Background()
	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Tools) != len(alpha.mcp.ToolNames()) {
		t.Fatalf("bridge lists %d tools, node has %d", len(list.Tools), len(alpha.mcp.ToolNames()))
	}
	for _, tool := range list.Tools {
		if tool.Name == "read_log" && !strings.Contains(string(mustJSON(t, tool.InputSchema)), "filter") {
			t.Errorf("read_log schema lost on the way: %s", mustJSON(t, tool.InputSchema))
		}
	}
	out := text(callTool(t, cs, "meminfo", map[string]any{"node": "bravo"}))
	if !strings.HasPrefix(out, "[host-bravo ") {
		t.Errorf("meminfo on bravo through the bridge: %.80q", out)
	}
	res := callTool(t, cs, "why_not", nil)
	if !res.IsError {
		t.Errorf("tool error did not come through: %s", text(res))
	}
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "no_such_tool"}); err == nil {
		t.Error("unknown tool: want a protocol error")
	}
}

func TestBridgeRefusesWrongToken(t *testing.T) {
	alpha := startNode(t, "alpha")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, st := mcp.NewInMemoryTransports()
	err := Bridge(ctx, BridgeConfig{Endpoint: alpha.url(Path), Token: "wrong-token-0123456789"}, st)
	if err == nil || !strings.Contains(err.Error(), alpha.url(Path)) {
		t.Fatalf("wrong token: %v", err)
	}
	t.Logf("wrong token: %v", err)
}
