package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/supervisor/mcpserver"
)

// mcpCommand is a stdio bridge for desktop assistants, which start MCP
// servers as local processes: it speaks MCP on stdin/stdout and forwards
// every tools/list and tools/call to a node's /mcp with the cluster token.
// Logs go to stderr; stdout carries only the protocol.
func mcpCommand() *cli.Command {
	return &cli.Command{
		Name:  "mcp",
		Usage: "serve a node's MCP tools on stdio (for desktop assistants)",
		Description: "Configure a desktop assistant to start: llmgw mcp --addr http://node:7070 --token-file /path/to/token\n" +
			"Every tool of the cluster is then available; host tools take a node argument to run on any node.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "addr", Value: "http://127.0.0.1:7070", Usage: "any node's API address", Sources: cli.EnvVars("LLMGW_ADDR")},
			&cli.StringFlag{Name: "token", Usage: "cluster token (prefer --token-file: arguments are visible to other users)", Sources: cli.EnvVars("LLMGW_TOKEN")},
			&cli.StringFlag{Name: "token-file", Usage: "file holding the cluster token", Sources: cli.EnvVars("LLMGW_TOKEN_FILE")},
			&cli.StringFlag{Name: "log-level", Value: "warn", Usage: "debug, info, warn or error (logs go to stderr)", Sources: cli.EnvVars("LLMGW_LOG_LEVEL")},
		},
		Action: func(ctx context.Context, c *cli.Command) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
				return usageError(fmt.Sprintf("--log-level %q: want debug, info, warn or error", c.String("log-level")))
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			if cl.token == "" {
				return usageError("the node's /mcp needs the cluster token: give --token, --token-file, LLMGW_TOKEN or LLMGW_TOKEN_FILE")
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			err = mcpserver.Bridge(ctx, mcpserver.BridgeConfig{
				Endpoint: cl.base + mcpserver.Path,
				Token:    cl.token,
				Logger:   log,
				Version:  version,
			}, &mcp.StdioTransport{})
			if err != nil {
				return failure(err.Error())
			}
			return nil
		},
	}
}
