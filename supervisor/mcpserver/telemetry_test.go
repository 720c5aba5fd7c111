package mcpserver

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/supervisor"
	"github.com/llmgw/llmgw/supervisor/supervisortest"
)

// MCP nodes carries each node's telemetry as its record publishes it:
// here an RDMA port's rates, rounded to 0.1 MB/s.
func TestNodesCarriesTelemetry(t *testing.T) {
	cfg := supervisortest.Config(t, "tele")
	cfg.Token, cfg.GPUInterval = testToken, 50*time.Millisecond
	cfg.Interconnect = func(context.Context) (host.Interconnect, error) {
		return host.Interconnect{Links: []host.LinkRate{{Device: "mlx5_0", Port: 1, Up: true, TxMBps: 12.46, RxMBps: 0.31}}}, nil
	}
	tn := &testNode{name: "tele", sent: &recordingTransport{base: http.DefaultTransport}}
	cfg.Extra = func(n *supervisor.Node, mux *http.ServeMux) {
		tn.mcp = Register(n, mux, Options{Host: host.Config{Host: "host-tele"}, Version: "test"})
	}
	tn.node = supervisortest.Start(t, cfg)
	tn.gossipPort = supervisortest.GossipPort(t, tn.node)
	cs := connect(t, tn, testToken)
	var nodes nodesOut
	waitFor(t, "tele's telemetry in MCP nodes", func() bool {
		decode(t, callTool(t, cs, "nodes", nil), &nodes)
		return len(nodes.Nodes) == 1 && len(nodes.Nodes[0].Telemetry.Links) == 1
	})
	l := nodes.Nodes[0].Telemetry.Links[0]
	if l.Device != "mlx5_0" || l.Port != 1 || !l.Up || l.TxMBps != 12.5 || l.RxMBps != 0.3 || nodes.Nodes[0].Telemetry.ReadAt.IsZero() {
		t.Errorf("telemetry = %+v", nodes.Nodes[0].Telemetry)
	}
}
