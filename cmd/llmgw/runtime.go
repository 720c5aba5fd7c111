package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/supervisor"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/runtime"
	"github.com/llmgw/llmgw/supervisor/runtime/containerd"
	"github.com/llmgw/llmgw/supervisor/runtime/process"
)

// openRuntime returns the runtime --runtime names, or nil for none. auto
// takes containerd when its socket answers within two seconds, else the
// process runtime, and says which in the log.
func openRuntime(ctx context.Context, c *cli.Command, cfg supervisor.Config, log *slog.Logger) (runtime.Runtime, error) {
	choice := c.String("runtime")
	switch choice {
	case "none":
		log.Warn("--runtime none: shards are claimed but no engine runs")
		return nil, nil
	case "containerd", "auto":
		rt, err := openContainerd(ctx, c, log)
		if err == nil {
			log.Info("engines run in containerd", "socket", c.String("containerd-socket"), "namespace", c.String("containerd-namespace"))
			return rt, nil
		}
		if choice == "containerd" {
			return nil, fmt.Errorf("--runtime containerd: %w", err)
		}
		log.Info("containerd not available; engines run as host processes", "socket", c.String("containerd-socket"), "why", err)
	}
	rt, err := process.New(datadir.New(cfg.DataDir).RuntimeDir())
	if err != nil {
		return nil, fmt.Errorf("--runtime process: %w", err)
	}
	return rt, nil
}

func openContainerd(ctx context.Context, c *cli.Command, log *slog.Logger) (*containerd.Runtime, error) {
	sock := c.String("containerd-socket")
	if _, err := os.Stat(sock); err != nil {
		return nil, fmt.Errorf("--containerd-socket %s: %w", sock, err)
	}
	rt, err := containerd.New(containerd.WithSocket(sock), containerd.WithNamespace(c.String("containerd-namespace")), containerd.WithLogger(log))
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := rt.Ping(pctx); err != nil {
		rt.Close()
		return nil, fmt.Errorf("--containerd-socket %s does not answer: %w", sock, err)
	}
	return rt, nil
}

func imageCommand() *cli.Command {
	return &cli.Command{
		Name:  "image",
		Usage: "manage engine images in this machine's containerd",
		Commands: []*cli.Command{{
			Name:      "import",
			Usage:     "import an image tar (docker save or OCI layout) for sites without a registry",
			ArgsUsage: "FILE.tar",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "containerd-socket", Value: "/run/containerd/containerd.sock", Sources: cli.EnvVars("LLMGW_CONTAINERD_SOCKET")},
				&cli.StringFlag{Name: "containerd-namespace", Value: "llmgw", Sources: cli.EnvVars("LLMGW_CONTAINERD_NAMESPACE")},
			},
			Action: func(ctx context.Context, c *cli.Command) error {
				if c.Args().Len() != 1 {
					return usageError("FILE.tar: want exactly one image tar")
				}
				f, err := os.Open(c.Args().First())
				if err != nil {
					return usageError(err.Error())
				}
				defer f.Close()
				rt, err := openContainerd(ctx, c, slog.New(slog.NewTextHandler(c.Root().ErrWriter, nil)))
				if err != nil {
					return failure(err.Error())
				}
				defer rt.Close()
				names, err := rt.ImportImage(ctx, f)
				if err != nil {
					return failure(err.Error())
				}
				for _, n := range names {
					fmt.Fprintf(c.Root().Writer, "imported %s\n", n)
				}
				return nil
			},
		}},
	}
}
