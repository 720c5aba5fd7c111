package main

import (
	"context"
	"fmt"
	"os"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/internal/freeport"
	"github.com/llmgw/llmgw/scenarios"
)

// scenarioCommand runs the same runbooks `make scenarios` runs, so an
// operator can rehearse failover and partitions on a cluster shape of their
// own on one machine before trusting it with real GPUs.
func scenarioCommand() *cli.Command {
	return &cli.Command{
		Name:  "scenario",
		Usage: "rehearse cluster behaviour with declarative multi-node scenarios",
		Commands: []*cli.Command{{
			Name:      "run",
			Usage:     "run scenario files (grammar: scenarios/runner.go) against real local nodes",
			ArgsUsage: "FILE...",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "work-dir", Usage: "keep data dirs and node logs here (default: a temporary dir, removed)"},
				&cli.BoolFlag{Name: "rewrite", Usage: "rewrite the expected outputs with what happened"},
				&cli.BoolFlag{Name: "quiet", Usage: "print only the summary"},
			},
			Action: func(ctx context.Context, c *cli.Command) error {
				if c.Args().Len() == 0 {
					return usageError("FILE: name at least one scenario file")
				}
				self, err := os.Executable()
				if err != nil {
					return err
				}
				opts := scenarios.Options{Binary: self, WorkDir: c.String("work-dir"), Rewrite: c.Bool("rewrite"), Ports: freeport.New()}
				if !c.Bool("quiet") {
					opts.Out = c.Root().Writer
				}
				var results []scenarios.Result
				failed := 0
				for _, f := range c.Args().Slice() {
					res, err := scenarios.Run(ctx, opts, f)
					if err != nil {
						return usageError(fmt.Sprintf("%s: %v", f, err))
					}
					if !res.Passed && !res.Skipped {
						failed++
						fmt.Fprintf(c.Root().Writer, "%s FAILED: %s\n", f, res.Why)
					}
					results = append(results, res)
				}
				fmt.Fprint(c.Root().Writer, scenarios.Summary(results))
				if failed > 0 {
					return failure(fmt.Sprintf("%d of %d scenarios failed", failed, len(results)))
				}
				return nil
			},
		}},
	}
}
