package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/supervisor/history"
	"github.com/llmgw/llmgw/supervisor/overview"
	"github.com/llmgw/llmgw/supervisor/status"
)

func topCommand() *cli.Command {
	return &cli.Command{
		Name:  "top",
		Usage: "a live overview of the whole cluster from any node: nodes, models and shards with their load, and each model's requests through that node's gateway",
		Flags: append(jsonClientFlags(),
			&cli.DurationFlag{Name: "interval", Value: 2 * time.Second, Usage: "time between refreshes"},
			&cli.BoolFlag{Name: "once", Usage: "print one frame and exit"},
		),
		Action: func(ctx context.Context, c *cli.Command) error {
			interval := c.Duration("interval")
			if interval < 200*time.Millisecond {
				return usageError(fmt.Sprintf("--interval %s: want at least 200ms", interval))
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			w := c.Root().Writer
			draw := func(snap topSnapshot, width int, st overview.Styles) error {
				if c.Bool("json") {
					// One object per frame (JSON lines when refreshed).
					frame := map[string]any{"cluster": snap.cluster, "deployments": snap.models, "shards": snap.shards, "gateway": snap.gateway, "history": snap.history}
					if snap.gatewayErr != nil {
						frame["gateway_error"] = snap.gatewayErr.Error()
					}
					return printJSON(w, frame)
				}
				renderTop(w, cl.base, snap, time.Now(), width, st)
				return nil
			}
			if c.Bool("once") {
				snap, err := fetchTop(ctx, cl)
				if err != nil {
					return err
				}
				return draw(snap, terminalWidth(w), overview.Plain())
			}
			// On a terminal, a full screen redrawn in place (q quits);
			// into a pipe or a file, frames follow one another.
			if isTerminal(w) && !c.Bool("json") {
				st := overview.Colored(w)
				return runScreen(ctx, w, screenModel{
					read: func(ctx context.Context) any {
						snap, err := fetchTop(ctx, cl)
						return topRead{snap, err}
					},
					draw: func(v any, width int) string {
						r := v.(topRead)
						var b strings.Builder
						if r.err != nil {
							// The node may be restarting: say so and keep asking.
							fmt.Fprintf(&b, "llmgw top: %v (retrying every %s)\n", r.err, interval)
						} else {
							renderTop(&b, cl.base, r.snap, time.Now(), width, st)
						}
						return b.String()
					},
					dim: st.Dim, every: interval, what: "llmgw top: asking " + cl.base + "…",
					keys: "q quit · ↑↓ PgUp PgDn scroll · every " + interval.String(),
				})
			}
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				snap, err := fetchTop(ctx, cl)
				if ctx.Err() != nil {
					return nil
				}
				if !c.Bool("json") {
					fmt.Fprintln(w)
				}
				if err != nil {
					fmt.Fprintf(c.Root().ErrWriter, "llmgw top: %v (retrying every %s)\n", err, interval)
				} else if err := draw(snap, 0, overview.Plain()); err != nil {
					return err
				}
				select {
				case <-ctx.Done():
					return nil
				case <-tick.C:
				}
			}
		},
	}
}

// topRead is one read of the cluster for the full screen.
type topRead struct {
	snap topSnapshot
	err  error
}

// topSnapshot is what one frame shows: the cluster as the asked node sees
// it, and the traffic through that node's gateway (nil, with gatewayErr
// saying why, when it has none or did not say).
type topSnapshot struct {
	cluster    status.ClusterInfo
	models     []status.DeploymentInfo
	shards     []status.ShardInfo
	gateway    *gatewayStats
	gatewayErr error
	// history is the asked node's last hour (nil from a node that keeps
	// none: an older agent), drawn as sparklines.
	history *history.View
}

func fetchTop(ctx context.Context, cl *client) (topSnapshot, error) {
	var s topSnapshot
	if err := cl.do(ctx, "GET", "/v1/cluster", nil, "", &s.cluster); err != nil {
		return s, err
	}
	if err := cl.do(ctx, "GET", "/v1/deployments", nil, "", &s.models); err != nil {
		return s, err
	}
	if err := cl.do(ctx, "GET", "/v1/shards", nil, "", &s.shards); err != nil {
		return s, err
	}
	// A node without a gateway (404) or an older one leaves the gateway
	// columns blank; the frame says why.
	var gs gatewayStats
	if err := cl.do(ctx, "GET", gatewayStatsPath, nil, "", &gs); err != nil {
		s.gatewayErr = err
	} else {
		s.gateway = &gs
	}
	// More nodes than the page draws: top has a row per node anyway. An
	// older node (404) leaves the sparklines out.
	var h history.View
	// A cell per sparkline cell, the node's reduction: twelve numbers a
	// series instead of an hour of them, every refresh.
	if err := cl.do(ctx, "GET", fmt.Sprintf("/v1/history?busiest=%d&cells=%d", history.MaxBusiest, sparkWidth), nil, "", &h); err == nil {
		s.history = &h
	}
	return s, nil
}

// ttfbText writes a time to first byte as "0.4ms", "35ms" or "1.25s"; a
// dash for none (no answered request in the window).
func ttfbText(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// windowText writes a stats window as "1m" or "90s".
func windowText(d time.Duration) string {
	if d >= time.Minute && d%time.Minute == 0 {
		return fmt.Sprintf("%dm", int(d.Minutes()))
	}
	return d.Round(time.Second).String()
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// topFaults is a node's recent driver faults (Xids and NVRM errors, in
// the node's fault window); a dash when none.
func topFaults(p gossip.ProbeSummary) string {
	if p.DriverFaultsRecent == 0 {
		return "-"
	}
	if p.XidRecent > 0 {
		return fmt.Sprintf("%d (%d Xid)", p.DriverFaultsRecent, p.XidRecent)
	}
	return fmt.Sprint(p.DriverFaultsRecent)
}

// topLinks sums a node's RDMA ports with a link: "812/3.2" MB/s sent and
// received; "no link" when it has ports but none is up, a dash when none.
func topLinks(ls []gossip.LinkRate) string {
	var tx, rx float64
	up := 0
	for _, l := range ls {
		if l.Up {
			tx, rx, up = tx+l.TxMBps, rx+l.RxMBps, up+1
		}
	}
	switch {
	case len(ls) == 0:
		return "-"
	case up == 0:
		return "no link"
	}
	return fmt.Sprintf("%.0f/%.0f", tx, rx)
}
