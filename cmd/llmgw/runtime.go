package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/supervisor"
	"github.com/llmgw/llmgw/supervisor/runtime"
	"github.com/llmgw/llmgw/supervisor/runtime/process"
)

// openRuntime returns the runtime --runtime names, or nil for none.
func openRuntime(ctx context.Context, c *cli.Command, cfg supervisor.Config, log *slog.Logger) (runtime.Runtime, error) {
	switch c.String("runtime") {
	case "none":
		log.Warn("--runtime none: shards are claimed but no engine runs")
		return nil, nil
	case "process", "auto":
		rt, err := process.New(filepath.Join(cfg.DataDir, "runtime"))
		if err != nil {
			return nil, fmt.Errorf("--runtime process: %w", err)
		}
		return rt, nil
	default:
		return nil, fmt.Errorf("--runtime %q: not available in this build", c.String("runtime"))
	}
}
