// Package mcpserver serves a node's tools over MCP (streamable HTTP at
// /mcp): the host tools of probes/host, each of which can run on any node
// the cluster knows by gossip, and cluster tools that answer from this
// node's view (nodes, deployments, shards, why_not, load) or change the
// desired state (place, unplace).
//
// There is no router. Any node takes a call for any other: a host tool
// whose node argument names another node is forwarded to that node's /mcp,
// found through gossip, with the caller's token. The answer comes back as
// the other node wrote it, stamped with its host.
//
// The whole endpoint needs the cluster token. The server is stateless
// (no Mcp-Session-Id): one shared *mcp.Server answers every request, a
// client that never says goodbye leaves nothing behind, and a call can go
// to any node without a session to carry over.
package mcpserver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/supervisor/status"
)

// Path is where Register serves MCP.
const Path = "/mcp"

// forwardedHeader marks a call one node forwarded to another. A node that
// receives a forwarded call for a third node refuses it instead of
// forwarding again: two nodes with different views of an address must not
// bounce a call between them.
const forwardedHeader = "Llmgw-Forwarded-By"

// DefaultForwardTimeout bounds a forwarded call. It is long because
// engine_stacks sleeps between rounds and each py-spy dump may take its own
// command timeout.
const DefaultForwardTimeout = 2 * time.Minute

// Options configure Register. Zero fields get defaults.
type Options struct {
	// Host configures the host tools. Host.Host defaults to the node's
	// name, so that an answer's stamp names the node a caller asked for.
	// Host.Engines defaults to this node's shards that have a PID (from
	// its own gossip record) and Host.GPU to the node's last GPU reading.
	Host host.Config
	// HTTPClient forwards calls to other nodes. Its Timeout, if any, must
	// leave room for engine_stacks; ForwardTimeout bounds each call
	// anyway. Default: a client of its own with keep-alive connections.
	HTTPClient *http.Client
	// ForwardTimeout bounds one forwarded call (DefaultForwardTimeout).
	ForwardTimeout time.Duration
	// Logger logs place/unplace and forwarding failures (default: discard).
	Logger *slog.Logger
	// Version is reported as the MCP server's version.
	Version string
}

// Reader is the node's read model and clock.
type Reader interface {
	Status() *status.Snapshot
	Now() time.Time
}

// Placer changes what the cluster runs, through the same validated path
// as the node's HTTP API.
type Placer interface {
	Place(ctx context.Context, spec placement.Deployment) (status.DeploymentInfo, error)
	Unplace(name string) error
}

// Node is what the MCP server needs of its node (*supervisor.Node): the
// read model, place and unplace, the last GPU reading for the gpu tool, and
// the token check that guards /mcp.
type Node interface {
	Reader
	Placer
	GPUSnapshot() gpu.Snapshot
	// RequireTokenOrHop guards /mcp: the cluster token, or a call another
	// node forwarded and signed.
	RequireTokenOrHop(h http.Handler) http.Handler
	// SignHop signs a request to another node's /mcp in place of the
	// caller's token, which never leaves this node.
	SignHop(out *http.Request, caller string, body []byte)
}

// Server is the MCP endpoint of one node. It is also a
// prometheus.Collector of its tool calls (see metrics.go).
type Server struct {
	node    Node
	opts    Options
	log     *slog.Logger
	srv     *mcp.Server
	handler http.Handler
	client  *mcp.Client
	hc      *http.Client
	names   []string // every tool name, in registration order
	calls   *prometheus.HistogramVec
}

// Register adds /mcp to mux, guarded by the cluster token, and returns the
// server so its call metrics can be registered (nodemetrics.Options).
func Register(n Node, mux *http.ServeMux, opts Options) *Server {
	s := New(n, opts)
	mux.Handle(Path, s.Handler())
	if t, ok := n.(toolTeller); ok {
		t.SetMCPTools(s.ToolNames())
	}
	return s
}

// toolTeller is a node that lists the MCP tools it serves in its own
// status (supervisor.Node's /status.json).
type toolTeller interface{ SetMCPTools(names []string) }

// New builds the server without registering it.
func New(n Node, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.ForwardTimeout <= 0 {
		opts.ForwardTimeout = DefaultForwardTimeout
	}
	if opts.HTTPClient == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 16
		opts.HTTPClient = &http.Client{Transport: t}
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	hc := opts.Host
	if hc.Host == "" {
		hc.Host = n.Status().Self()
	}
	if hc.Engines == nil {
		hc.Engines = func(context.Context) ([]host.EngineProcess, error) { return localEngines(n), nil }
	}
	if hc.GPU == nil {
		hc.GPU = func(context.Context) (gpu.Snapshot, error) { return n.GPUSnapshot(), nil }
	}
	s := &Server{
		node: n, opts: opts, log: opts.Logger.With("component", "mcp"),
		hc: opts.HTTPClient, calls: newCallHistogram(),
	}
	s.srv = mcp.NewServer(&mcp.Implementation{Name: "llmgw", Title: "llmgw node " + n.Status().Self(), Version: opts.Version}, &mcp.ServerOptions{
		Instructions: "llmgw cluster tools. Host tools (meminfo, gpu, processes, ...) run on this node, or on the node " +
			"named by their optional `node` argument (see `nodes`). Cluster tools answer from this node's gossip " +
			"view, which every node shares: nodes, deployments, shards, why_not, load; place and unplace change " +
			"what the cluster should run.",
	})
	s.client = mcp.NewClient(&mcp.Implementation{Name: "llmgw-forward", Version: opts.Version}, nil)
	s.addHostTools(host.Tools(hc))
	s.addClusterTools()
	s.handler = n.RequireTokenOrHop(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.srv }, &mcp.StreamableHTTPOptions{
		Stateless:    true,
		JSONResponse: true,
		// Every request carries the cluster token, which a DNS-rebinding
		// page cannot attach; the SDK's Host check would only refuse
		// legitimate callers that reach a node through a tunnel or by a
		// name that resolves to loopback.
		DisableLocalhostProtection:   true,
		PropagateRequestCancellation: true,
		MaxRequestBodyBytes:          1 << 20,
		Logger:                       s.log,
	}))
	return s
}

// Handler is the /mcp handler, token check included.
func (s *Server) Handler() http.Handler { return s.handler }

// MCPServer is the underlying SDK server, for in-process transports.
func (s *Server) MCPServer() *mcp.Server { return s.srv }

// ToolNames lists every tool this server offers.
func (s *Server) ToolNames() []string { return slices.Clone(s.names) }

// self is this node's name.
func (s *Server) self() string { return s.node.Status().Self() }

// localEngines lists this node's engine processes from its own record.
func localEngines(n Reader) []host.EngineProcess {
	snap := n.Status()
	self, _ := snap.Member(snap.Self())
	var out []host.EngineProcess
	for _, sh := range self.Shards {
		if sh.PID > 0 {
			out = append(out, host.EngineProcess{Name: sh.ShardID, PID: sh.PID})
		}
	}
	return out
}

// peer is another node a call can be forwarded to.
type peer struct {
	name, endpoint string
}

// lookup finds a node to forward to. It fails, naming the live nodes, when
// target is unknown, dead, left, or has no API address.
func (s *Server) lookup(target string) (peer, error) {
	members := s.node.Status().Members()
	var live []string
	var found *status.MemberInfo
	for i, m := range members {
		if reachable(m.State) && m.API != "" {
			live = append(live, m.Name)
		}
		if m.Name == target {
			found = &members[i]
		}
	}
	liveList := strings.Join(live, ", ")
	switch {
	case found == nil:
		return peer{}, fmt.Errorf("no node named %q in this node's view; live nodes: %s", target, liveList)
	case !reachable(found.State):
		return peer{}, fmt.Errorf("node %q is %s; live nodes: %s", target, found.State, liveList)
	case found.API == "":
		return peer{}, fmt.Errorf("node %q has not published an API address yet; live nodes: %s", target, liveList)
	}
	return peer{name: target, endpoint: "http://" + found.API + Path}, nil
}

// reachable: a suspect node may only be slow; the call is worth a try.
func reachable(s gossip.MemberState) bool {
	return s == gossip.StateAlive || s == gossip.StateSuspect
}

// headerTransport sets fixed headers on every request (the stdio bridge's
// token, to the node its user named).
type headerTransport struct {
	base http.RoundTripper
	set  http.Header
}

func (t *headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.set {
		r.Header[k] = v
	}
	return t.base.RoundTrip(r)
}

// signingTransport sets fixed headers on every request of a forwarded call
// and signs it for the node it goes to: the address came from gossip, so
// the caller's token must not go with it.
type signingTransport struct {
	base   http.RoundTripper
	set    http.Header
	sign   func(out *http.Request, caller string, body []byte)
	caller string
}

func (t *signingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	var body []byte
	if r.Body != nil {
		b, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("forward: read the request body: %w", err)
		}
		body = b
		r.Body = io.NopCloser(bytes.NewReader(b))
		r.ContentLength = int64(len(b))
	}
	for k, v := range t.set {
		r.Header[k] = v
	}
	t.sign(r, t.caller, body)
	return t.base.RoundTrip(r)
}

// forward calls tool name with the raw arguments on another node, signed
// as checked here (never with the caller's token). A failure to reach the
// node is a tool error; the peer's own answer, error or not, is passed
// back unchanged.
func (s *Server) forward(ctx context.Context, req *mcp.CallToolRequest, target string) (*mcp.CallToolResult, error) {
	var in http.Header
	if req.Extra != nil {
		in = req.Extra.Header
	}
	if by := in.Get(forwardedHeader); by != "" {
		return nil, fmt.Errorf("node %s forwarded a call for %q to this node (%s); not forwarding it again (the two nodes disagree about addresses; ask %s directly)", by, target, s.self(), target)
	}
	p, err := s.lookup(target)
	if err != nil {
		return nil, err
	}
	base := s.hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	set := http.Header{forwardedHeader: {s.self()}}
	hc := &http.Client{Transport: &signingTransport{base: base, set: set, sign: s.node.SignHop, caller: "mcp"}, Timeout: s.hc.Timeout}
	ctx, cancel := context.WithTimeout(ctx, s.opts.ForwardTimeout)
	defer cancel()
	cs, err := s.client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: p.endpoint, HTTPClient: hc, MaxRetries: -1, DisableStandaloneSSE: true}, nil)
	if err != nil {
		s.log.Warn("forward: connect failed", "node", target, "endpoint", p.endpoint, "err", err)
		return nil, fmt.Errorf("cannot reach node %s at %s: %v", target, p.endpoint, err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: req.Params.Name, Arguments: req.Params.Arguments})
	if err != nil {
		s.log.Warn("forward: call failed", "node", target, "tool", req.Params.Name, "err", err)
		return nil, fmt.Errorf("node %s at %s: %s: %v", target, p.endpoint, req.Params.Name, err)
	}
	return res, nil
}

// textResult is a tool answer of plain text.
func textResult(text string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}
}
