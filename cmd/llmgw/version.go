package main

import (
	"context"
	"fmt"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/internal/protocol"
)

// versionCommand prints the build and the protocol versions it speaks, and
// with --addr the cluster version the node there runs at. Its first line
// is "llmgw <build>", which `llmgw node upgrade` reads from a binary.
func versionCommand() *cli.Command {
	// --addr without LLMGW_ADDR or a default: a bare `llmgw version` (as
	// node upgrade runs it on a new binary) never dials anything.
	flags := []cli.Flag{&cli.StringFlag{Name: "addr", Usage: "any node's API address: also print the cluster version it runs at"}}
	for _, f := range clientFlags() {
		if f.Names()[0] != "addr" {
			flags = append(flags, f)
		}
	}
	return &cli.Command{
		Name:  "version",
		Usage: "print llmgw's version and the protocol versions it speaks; with --addr, the cluster's active version",
		Flags: flags,
		Action: func(ctx context.Context, c *cli.Command) error {
			w, build := c.Root().Writer, protocol.Build()
			fmt.Fprintf(w, "llmgw %s\n", version)
			fmt.Fprintf(w, "protocol versions %d-%d\n", build.Min, build.Max)
			if c.String("addr") == "" {
				return nil
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			info, err := cl.cluster(ctx)
			if err != nil {
				return err
			}
			active := info.ActiveVersion
			if active == 0 {
				fmt.Fprintf(w, "cluster version %d (%s runs an llmgw from before cluster versions, which speaks version %d only)\n", protocol.V1, info.Self, protocol.V1)
				active = protocol.V1
			} else {
				fmt.Fprintf(w, "cluster version %d (as %s sees it)\n", active, info.Self)
			}
			if !info.VersionsMixedSince.IsZero() {
				fmt.Fprintf(w, "nodes have announced different protocol versions for %s (llmgw nodes shows each node's)\n",
					shortDuration(time.Since(info.VersionsMixedSince)))
			}
			if !build.Speaks(active) {
				fmt.Fprintf(w, "this build cannot speak cluster version %d: the cluster would refuse a node running it\n", active)
			}
			return nil
		},
	}
}
