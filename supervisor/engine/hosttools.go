package engine

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/supervisor/runtime"
)

// DescribeEngines lists what the runtime runs for this node, one line per
// engine, for the `containers` host tool.
func (r *Runner) DescribeEngines(ctx context.Context) (string, error) {
	engines, err := r.cfg.Runtime.List(ctx, r.cfg.Node)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s runtime, node %s: %d engine(s)\n", r.cfg.Runtime.Name(), r.cfg.Node, len(engines))
	for _, e := range engines {
		fmt.Fprintf(&b, "%s\tstate=%s\tpid=%d\tshard=%s\tspec=%s\tstarted=%s", e.ID, e.State, e.PID,
			e.Labels[runtime.LabelShard], e.Labels[runtime.LabelSpec], e.StartedAt.UTC().Format(time.RFC3339))
		if e.State == runtime.StateExited {
			fmt.Fprintf(&b, "\texit=%d", e.ExitCode)
		}
		b.WriteByte('\n')
	}
	return b.String(), nil
}

// HostEngines lists engine processes for the `engine_stacks` host tool.
func (r *Runner) HostEngines(ctx context.Context) ([]host.EngineProcess, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []host.EngineProcess
	for _, e := range r.engines {
		if e.state.PID > 0 {
			out = append(out, host.EngineProcess{Name: e.state.ShardID, PID: e.state.PID})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
