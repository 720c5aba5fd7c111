package host

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The bounds of engine_stacks' rounds and gap_s: a call must finish well
// within a forwarded call's timeout (2 min), py-spy's own time included.
const (
	MaxStackRounds = 10
	MinStackGap    = 100 * time.Millisecond
	MaxStackGap    = 10 * time.Second
)

// stackShape is the rounds and gap of one call: the node's defaults, or
// the call's within the bounds.
func (c Config) stackShape(a Args) (int, time.Duration, error) {
	rounds, gap := c.StackRounds, c.StackGap
	if a.Rounds != 0 {
		if a.Rounds < 1 || a.Rounds > MaxStackRounds {
			return 0, 0, fmt.Errorf("%w: rounds %d: want 1 to %d (leave it out for %d)", ErrBadArgs, a.Rounds, MaxStackRounds, c.StackRounds)
		}
		rounds = a.Rounds
	}
	if a.GapS != 0 {
		g := time.Duration(a.GapS * float64(time.Second))
		if g < MinStackGap || g > MaxStackGap || a.GapS != a.GapS {
			return 0, 0, fmt.Errorf("%w: gap_s %g: want %g to %g seconds (leave it out for %g)", ErrBadArgs, a.GapS, MinStackGap.Seconds(), MaxStackGap.Seconds(), c.StackGap.Seconds())
		}
		gap = g
	}
	return rounds, gap, nil
}

func engineStacksTool(c Config) Tool {
	return Tool{
		Name: "engine_stacks",
		Description: fmt.Sprintf("Python stacks of this node's engine processes and their children (py-spy dump "+
			"--pid P --subprocesses), taken %d times %s apart. One dump is a single instant and cannot tell a "+
			"hung engine from a busy one. A hung engine shows the same stack every round; a busy one moves. "+
			"CUDA launches are asynchronous, so when the GPU falls behind, the CPU blocks on whatever it "+
			"launches next: a frame that stays put across rounds is where the wait is, and a frame that moves "+
			"means the cause lies elsewhere.", c.StackRounds, c.StackGap),
		Params: []Param{{Name: "name", Description: "one engine (shard) by name; all engines if empty"},
			{Name: "rounds", Description: fmt.Sprintf("how many dumps of each engine, 1 to %d (default %d)", MaxStackRounds, c.StackRounds)},
			{Name: "gap_s", Description: fmt.Sprintf("seconds between rounds, %g to %g (default %g)", MinStackGap.Seconds(), MaxStackGap.Seconds(), c.StackGap.Seconds())}},
		Run: func(ctx context.Context, a Args) (string, error) {
			rounds, gap, err := c.stackShape(a)
			if err != nil {
				return "", err
			}
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
			for round := 1; round <= rounds; round++ {
				if round > 1 {
					if err := c.Sleep(ctx, gap); err != nil {
						return "", err
					}
				}
				fmt.Fprintf(&b, "===== round %d of %d at %s =====\n", round, rounds, c.Clock.Now().UTC().Format(time.TimeOnly))
				for _, e := range engines {
					fmt.Fprintf(&b, "----- %s (pid %d) -----\n", e.Name, e.PID)
					out, err := c.command(ctx, "py-spy", "dump", "--pid", strconv.Itoa(e.PID), "--subprocesses")
					if err != nil {
						return "", err
					}
					b.WriteString(out)
				}
			}
			source := fmt.Sprintf("py-spy dump --pid P --subprocesses, %d rounds %s apart", rounds, gap)
			return c.stamp(source, capHead(b.String(), c.MaxOutput)), nil
		},
	}
}
