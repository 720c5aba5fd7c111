package host

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

func engineStacksTool(c Config) Tool {
	return Tool{
		Name: "engine_stacks",
		Description: fmt.Sprintf("Python stacks of this node's engine processes and their children (py-spy dump "+
			"--pid P --subprocesses), taken %d times %s apart. One dump is a single instant and cannot tell a "+
			"hung engine from a busy one. A hung engine shows the same stack every round; a busy one moves. "+
			"CUDA launches are asynchronous, so when the GPU falls behind, the CPU blocks on whatever it "+
			"launches next: a frame that stays put across rounds is where the wait is, and a frame that moves "+
			"means the cause lies elsewhere.", c.StackRounds, c.StackGap),
		Params: []Param{{Name: "name", Description: "one engine (shard) by name; all engines if empty"}},
		Run: func(ctx context.Context, a Args) (string, error) {
			if c.Engines == nil {
				return c.stamp("engine_stacks", fmt.Sprintf("(no engine list is configured on %s)\n", c.Host)), nil
			}
			engines, err := c.Engines(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return "", ctx.Err()
				}
				return c.stamp("engine_stacks", fmt.Sprintf("(listing engines on %s failed: %v)\n", c.Host, err)), nil
			}
			if a.Name != "" {
				var names []string
				var picked []EngineProcess
				for _, e := range engines {
					names = append(names, e.Name)
					if e.Name == a.Name {
						picked = append(picked, e)
					}
				}
				if len(picked) == 0 {
					return "", fmt.Errorf("%w: no engine %q on %s; engines: %s", ErrBadArgs, a.Name, c.Host, strings.Join(names, ", "))
				}
				engines = picked
			}
			if len(engines) == 0 {
				return c.stamp("engine_stacks", fmt.Sprintf("(no engines run on %s)\n", c.Host)), nil
			}
			var b strings.Builder
			for round := 1; round <= c.StackRounds; round++ {
				if round > 1 {
					if err := c.Sleep(ctx, c.StackGap); err != nil {
						return "", err
					}
				}
				fmt.Fprintf(&b, "===== round %d of %d at %s =====\n", round, c.StackRounds, c.Clock.Now().UTC().Format(time.TimeOnly))
				for _, e := range engines {
					fmt.Fprintf(&b, "----- %s (pid %d) -----\n", e.Name, e.PID)
					out, err := c.command(ctx, "py-spy", "dump", "--pid", strconv.Itoa(e.PID), "--subprocesses")
					if err != nil {
						return "", err
					}
					b.WriteString(out)
				}
			}
			source := fmt.Sprintf("py-spy dump --pid P --subprocesses, %d rounds %s apart", c.StackRounds, c.StackGap)
			return c.stamp(source, capHead(b.String(), c.MaxOutput)), nil
		},
	}
}
