// Command llmgw turns a handful of GPU machines into one inference cluster
// with no central leader. See README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v3"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := newApp().Run(ctx, os.Args)
	var ec cli.ExitCoder
	switch {
	case err == nil:
	case errors.As(err, &ec):
		if msg := err.Error(); msg != "" {
			fmt.Fprintln(os.Stderr, "llmgw:", msg)
		}
		os.Exit(ec.ExitCode())
	default:
		fmt.Fprintln(os.Stderr, "llmgw:", err)
		os.Exit(1)
	}
}

// newApp builds a fresh command tree. Flags keep parse state, so tests
// build one per run.
func newApp() *cli.Command {
	return &cli.Command{
		Name:    "llmgw",
		Usage:   "a leaderless GPU-cluster supervisor for LLM inference",
		Version: version,
		Commands: []*cli.Command{
			nodeCommand(),
			placeCommand(),
			unplaceCommand(),
			nodesCommand(),
			modelsCommand(),
			shardsCommand(),
			versionCommand(),
			demoCommand(),
		},
	}
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print llmgw's version",
		Action: func(ctx context.Context, c *cli.Command) error {
			fmt.Fprintf(c.Root().Writer, "llmgw %s\n", version)
			return nil
		},
	}
}
