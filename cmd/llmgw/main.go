// Command llmgw turns a handful of GPU machines into one inference cluster
// with no central leader. See README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
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
	os.Exit(exitStatus(err))
}

// exitStatus is what the process exits with after err: 0 when nil, 2 for a
// usage error, 1 when the operation failed (README, "Exit status").
//
// Our commands say which with codedError; urfave/cli's parse errors become
// usage errors in OnUsageError (see configure). Two of its errors pass no
// hook: a help topic that does not exist ("llmgw help bogus", its own
// ExitCoder, which would exit 3) and a flag's value from the environment
// that does not parse (returned before any hook runs).
func exitStatus(err error) int {
	var ce codedError
	var ec cli.ExitCoder
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ce):
		return ce.code
	case errors.As(err, &ec), strings.HasPrefix(err.Error(), "could not parse "):
		return 2
	}
	return 1
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
			adapterCommand(),
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
	// urfave/cli must not exit the process itself (cli.HandleExitCoder):
	// main decides the status, and tests run the tree in-process.
	app.ExitErrHandler = func(context.Context, *cli.Command, error) {}
	configure(app)
	return app
}

// configure sets what every command shares, down the whole tree
// (urfave/cli reads these settings from the command a flag belongs to):
//   - a repeated flag is one value per use: "--arg --x=a,b" is one engine
//     argument. Flags that take lists split them themselves (splitList), so
//     "--join a,b" still works;
//   - urfave/cli's own parse errors (an unknown flag, a value that does not
//     parse, a required flag missing) are usage errors, exit status 2, and
//     say where the command's help is;
//   - a command that only groups others refuses a name that is none of
//     them as the root does (bareAction), instead of looking for a help
//     topic.
func configure(c *cli.Command) {
	c.DisableSliceFlagSeparator = true
	c.OnUsageError = func(_ context.Context, c *cli.Command, err error, _ bool) error {
		return usageError(fmt.Sprintf("%v (see %s --help)", err, c.FullName()))
	}
	if len(c.Commands) > 0 && c.Action == nil {
		c.Action = groupAction
	}
	for _, sub := range c.Commands {
		configure(sub)
	}
}

// groupAction runs a command that only groups others (llmgw node, demo,
// ...): its help, or a usage error for a name that is not one of them.
func groupAction(_ context.Context, c *cli.Command) error {
	if c.Args().Present() {
		return noSuchCommand(c)
	}
	return cli.ShowSubcommandHelp(c)
}

// noSuchCommand is the usage error for c's first argument, which names
// none of c's commands.
func noSuchCommand(c *cli.Command) error {
	return usageError(fmt.Sprintf("no command %q in %s: see %s --help", c.Args().First(), c.FullName(), c.FullName()))
}
