package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// BridgeConfig configures Bridge.
type BridgeConfig struct {
	// Endpoint is a node's MCP URL, e.g. http://node:7070/mcp.
	Endpoint string
	// Token is the cluster token, sent as a bearer token.
	Token string
	// HTTPClient reaches the node (default: http.DefaultClient's transport).
	HTTPClient *http.Client
	// Logger must not write to the transport's stream (stdout for stdio).
	Logger  *slog.Logger
	Version string
}

// Bridge serves MCP on t (stdio, for a desktop assistant that only starts
// local processes) and forwards every tools/list and tools/call to the node
// at cfg.Endpoint, so the tool list is always the node's current one. It
// checks the node and the token before serving, and returns when t closes
// or ctx ends.
func Bridge(ctx context.Context, cfg BridgeConfig, t mcp.Transport) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	b := &bridge{cfg: cfg, client: mcp.NewClient(&mcp.Implementation{Name: "llmgw-bridge", Version: cfg.Version}, nil)}
	// Fail at start, with the reason, rather than on the assistant's first
	// call: a wrong address or token is the usual mistake.
	if _, err := b.listTools(ctx, &mcp.ListToolsParams{}); err != nil {
		hint := ""
		if msg := err.Error(); strings.Contains(msg, "Unauthorized") || strings.Contains(msg, "Forbidden") {
			hint = " (the node refused the cluster token: pass the cluster's token with --token, --token-file, LLMGW_TOKEN or LLMGW_TOKEN_FILE)"
		}
		return fmt.Errorf("node MCP endpoint %s: %w%s", cfg.Endpoint, err, hint)
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "llmgw-bridge", Title: "llmgw via " + cfg.Endpoint, Version: cfg.Version},
		&mcp.ServerOptions{Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}}})
	srv.AddReceivingMiddleware(b.middleware)
	err := srv.Run(ctx, t)
	b.close()
	if ctx.Err() != nil || errors.Is(err, mcp.ErrConnectionClosed) {
		return nil
	}
	return err
}

type bridge struct {
	cfg    BridgeConfig
	client *mcp.Client

	mu sync.Mutex
	cs *mcp.ClientSession
}

func (b *bridge) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch r := req.(type) {
		case *mcp.ListToolsRequest:
			res, err := b.listTools(ctx, r.Params)
			if err != nil {
				return nil, err
			}
			// A fresh result: the node's answer carries fields of the
			// protocol version it spoke with the bridge (_meta, cache
			// hints), not the one the assistant negotiated here.
			return &mcp.ListToolsResult{Tools: res.Tools, NextCursor: res.NextCursor}, nil
		case *mcp.CallToolRequest:
			params := &mcp.CallToolParams{Name: r.Params.Name, Arguments: r.Params.Arguments, Meta: r.Params.Meta}
			res, err := b.callTool(ctx, params)
			if err != nil && !isProtocolError(err) {
				// The node could not be reached: tell the assistant in
				// the answer, where it reads it, not as a protocol error.
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{
					Text: fmt.Sprintf("llmgw bridge: %s at %s: %v", params.Name, b.cfg.Endpoint, err)}}}, nil
			}
			if err != nil {
				return nil, err
			}
			return &mcp.CallToolResult{Content: res.Content, StructuredContent: res.StructuredContent, IsError: res.IsError}, nil
		}
		return next(ctx, method, req)
	}
}

// isProtocolError: the node answered with a JSON-RPC error (unknown tool,
// bad params), which goes back to the caller as it is.
func isProtocolError(err error) bool {
	var we *jsonrpc.Error
	return errors.As(err, &we)
}

func isConnError(err error) bool {
	return errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, mcp.ErrSessionMissing)
}

// session returns the open session to the node, connecting if none is.
func (b *bridge) session(ctx context.Context) (*mcp.ClientSession, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cs != nil {
		return b.cs, nil
	}
	hc := b.cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	set := http.Header{}
	if b.cfg.Token != "" {
		set.Set("Authorization", "Bearer "+b.cfg.Token)
	}
	withToken := &http.Client{Transport: &headerTransport{base: base, set: set}, Timeout: hc.Timeout}
	cs, err := b.client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: b.cfg.Endpoint, HTTPClient: withToken, MaxRetries: -1, DisableStandaloneSSE: true}, nil)
	if err != nil {
		return nil, err
	}
	b.cs = cs
	return cs, nil
}

// drop forgets a session that failed, so the next call reconnects (the
// node may have restarted).
func (b *bridge) drop(cs *mcp.ClientSession) {
	b.mu.Lock()
	if b.cs == cs {
		b.cs = nil
	}
	b.mu.Unlock()
	_ = cs.Close()
}

func (b *bridge) close() {
	b.mu.Lock()
	cs := b.cs
	b.cs = nil
	b.mu.Unlock()
	if cs != nil {
		_ = cs.Close()
	}
}

// do runs f on a session, reconnecting and trying once more when the
// session turned out to be closed (a node restart between two calls).
func do[T any](ctx context.Context, b *bridge, f func(*mcp.ClientSession) (T, error)) (T, error) {
	var zero T
	for attempt := 0; ; attempt++ {
		cs, err := b.session(ctx)
		if err != nil {
			return zero, err
		}
		res, err := f(cs)
		if err == nil {
			return res, nil
		}
		if !isConnError(err) {
			return zero, err
		}
		b.cfg.Logger.Warn("connection to the node lost; reconnecting", "endpoint", b.cfg.Endpoint, "err", err)
		b.drop(cs)
		if attempt > 0 {
			return zero, err
		}
	}
}

func (b *bridge) listTools(ctx context.Context, p *mcp.ListToolsParams) (*mcp.ListToolsResult, error) {
	if p == nil {
		p = &mcp.ListToolsParams{}
	}
	return do(ctx, b, func(cs *mcp.ClientSession) (*mcp.ListToolsResult, error) { return cs.ListTools(ctx, p) })
}

func (b *bridge) callTool(ctx context.Context, p *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	return do(ctx, b, func(cs *mcp.ClientSession) (*mcp.CallToolResult, error) { return cs.CallTool(ctx, p) })
}
