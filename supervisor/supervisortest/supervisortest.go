// Package supervisortest starts real llmgw nodes in-process on loopback for
// the tests of packages built on the supervisor (MCP, metrics, the page):
// real memberlist sockets, simulated GPUs, the local gossip profile.
package supervisortest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/freeport"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/supervisor"
)

// Token is the cluster token of every node Config makes.
const Token = "supervisortest-token-0123456789abcdef"

// FreePort finds a loopback port free for both TCP and UDP (memberlist
// binds both), so a node can be restarted at the same gossip address.
func FreePort(tb testing.TB) int {
	tb.Helper()
	port, err := freeport.Loopback()
	if err != nil {
		tb.Fatal(err)
	}
	return port
}

// Config is a node named name with 4 simulated H100s, the local profile, a
// 3 s lease TTL, a fresh data dir, its own gossip port and an API on a free
// port, joining the given gossip ports. Callers adjust it before Start.
func Config(tb testing.TB, name string, joinPorts ...int) supervisor.Config {
	tb.Helper()
	sim, err := gpu.NewSimulated("4xH100-80GB", name)
	if err != nil {
		tb.Fatal(err)
	}
	prof, err := gossip.ProfileByName("local")
	if err != nil {
		tb.Fatal(err)
	}
	var joins []string
	for _, p := range joinPorts {
		joins = append(joins, fmt.Sprintf("127.0.0.1:%d", p))
	}
	return supervisor.Config{
		Name: name, DataDir: tb.TempDir(), BindAddr: "127.0.0.1", BindPort: FreePort(tb), APIAddr: "127.0.0.1:0",
		Join: joins, Token: Token, Profile: prof, GPUs: sim, GPUsSimulated: true, LeaseTTL: 3 * time.Second,
		Version: "test", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// Start starts a node from cfg and kills it when the test ends. Another
// test process may take the gossip port between Config's pick and this
// bind; Start then takes another, so read the node's address back from it
// (GossipPort), not from cfg.
func Start(tb testing.TB, cfg supervisor.Config) *supervisor.Node {
	tb.Helper()
	n, err := supervisor.Start(context.Background(), cfg)
	for try := 0; err != nil && try < 3 && strings.Contains(err.Error(), "address already in use"); try++ {
		cfg.BindPort = FreePort(tb)
		n, err = supervisor.Start(context.Background(), cfg)
	}
	if err != nil {
		tb.Fatalf("start %s: %v", cfg.Name, err)
	}
	tb.Cleanup(func() { _ = n.Kill() })
	return n
}

// GossipPort is the port n gossips on.
func GossipPort(tb testing.TB, n *supervisor.Node) int {
	tb.Helper()
	_, p, err := net.SplitHostPort(n.GossipAddr())
	port, perr := strconv.Atoi(p)
	if err != nil || perr != nil {
		tb.Fatalf("gossip address %q: %v %v", n.GossipAddr(), err, perr)
	}
	return port
}
