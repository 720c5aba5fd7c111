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
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "llmgw:", err)
	var ce codedError
	if errors.As(err, &ce) {
		os.Exit(ce.code)
	}
	os.Exit(1)
}

// codedError carries the process exit code to main. (urfave/cli's own
// cli.Exit calls os.Exit from inside Run, which tests cannot survive.)
type codedError struct {
	msg  string
	code int
}

func (e codedError) Error() string { return e.msg }

// usageError is a bad flag or argument: exit status 2.
func usageError(msg string) error { return codedError{msg: msg, code: 2} }

// failure is a failure to do what was asked: exit status 1.
func failure(msg string) error { return codedError{msg: msg, code: 1} }

// newApp builds a fresh command tree. Flags keep parse state, so tests
// build one per run.
func newApp() *cli.Command {
	app := &cli.Command{
		Name:    "llmgw",
		Usage:   "a leaderless GPU-cluster supervisor for LLM inference",
		Version: version,
		// Bare `llmgw` on a node opens its overview; elsewhere, the help.
		Action: bareAction,
		Commands: []*cli.Command{
			overviewCommand(),
			nodeCommand(),
			placeCommand(),
			fitCommand(),
			unplaceCommand(),
			nodesCommand(),
			modelsCommand(),
			shardsCommand(),
			topCommand(),
			logsCommand(),
			chatCommand(),
			benchCommand(),
			versionCommand(),
			demoCommand(),
			engineCommand(),
			imageCommand(),
			mcpCommand(),
			scenarioCommand(),
		},
	}
	noSliceSeparator(app)
	return app
}

// noSliceSeparator makes a repeated flag one value per use on every
// command (urfave/cli reads the setting from the command a flag belongs
// to): "--arg --x=a,b" is one engine argument. Flags that take lists split
// them themselves (splitList), so "--join a,b" still works.
func noSliceSeparator(c *cli.Command) {
	c.DisableSliceFlagSeparator = true
	for _, sub := range c.Commands {
		noSliceSeparator(sub)
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
