package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/charmbracelet/x/term"
	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/supervisor/gateway"
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
					frame := map[string]any{"cluster": snap.cluster, "deployments": snap.models, "shards": snap.shards, "gateway": snap.gateway}
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
	return s, nil
}

// renderTop writes one frame, every line cut to width columns (0: no
// limit), long reasons with an ellipsis. Load figures come from each
// engine's own /metrics as its node last scraped them, carried in the node
// records (LOAD AGE says how old); a dash means no valid reading yet (or a
// rate right after an engine restart, whose counters started over). REQ/S
// and TTFB are the asked node's gateway's own: requests that came in
// through other nodes' gateways are not in them.
func renderTop(w io.Writer, addr string, s topSnapshot, now time.Time, width int, st overview.Styles) {
	alive, ready := 0, 0
	for _, m := range s.cluster.Members {
		if m.State == gossip.StateAlive {
			alive++
		}
	}
	shards := oneRowPerShard(s.shards)
	for _, sh := range shards {
		if sh.Status == gossip.ShardReady {
			ready++
		}
	}
	line := func(text string) { fmt.Fprintln(w, overview.Cut(text, width)) }
	// The counts first: a narrow screen cuts the end of the line.
	line(fmt.Sprintf("%s  %s  nodes %d/%d alive  models %d  shards %d/%d ready  via %s (%s)",
		st.Title.Render("llmgw top"), now.Format("15:04:05"), alive, len(s.cluster.Members), len(s.models), ready, len(shards), s.cluster.Self, addr))
	line("")

	// The window the nodes count Xids in (the agents' default).
	nodes := overview.Table{Head: []string{"NODE", "STATE", "GPUS", "GPU MEMORY", "SHARDS", "XID (" + overview.Ago(host.DefaultFaultWindow) + ")", "RUNTIME", "AGE"}, Flex: 2}
	for _, m := range s.cluster.Members {
		age := "-"
		if !m.StartedAt.IsZero() {
			age = shortDuration(now.Sub(m.StartedAt))
		}
		faults := overview.C("-")
		if m.Probes.DriverFaultsRecent > 0 {
			faults = overview.S(fmt.Sprint(m.Probes.DriverFaultsRecent), st.Bad)
		}
		nodes.Rows = append(nodes.Rows, []overview.Cell{overview.C(m.Name), stateCell(string(m.State), st), overview.C(gpuSummary(m.GPUs)), overview.C(gpuMemory(m.GPUs)),
			overview.C(fmt.Sprint(len(m.Shards))), faults, overview.C(dash(m.Runtime)), overview.C(age)})
	}
	fmt.Fprint(w, nodes.Render(width, "", st))
	line("")

	// Per model: the sum over its shards with a load reading (engines
	// are scraped only while ready); KV cache is their mean.
	type sum struct {
		running, waiting, kv, prompt, gen float64
		kvN                               int
		rates                             bool
	}
	per := map[string]*sum{}
	for _, sh := range shards {
		m := per[sh.Deployment]
		if m == nil {
			m = &sum{}
			per[sh.Deployment] = m
		}
		l := sh.Load // the API gives load only for holders with a valid lease
		if l.ScrapedAt.IsZero() || l.Error != "" {
			continue
		}
		m.running += l.Running
		m.waiting += l.Waiting
		m.kv += l.KVCacheUsage
		m.kvN++
		if l.RatesValid {
			m.prompt += l.PromptTPS
			m.gen += l.GenerationTPS
			m.rates = true
		}
	}
	traffic := map[string]gateway.ModelStats{}
	if s.gateway != nil {
		for _, ms := range s.gateway.Models {
			traffic[ms.Model] = ms
		}
		text := fmt.Sprintf("REQ/S, P50 and P99 time to first byte: last %s, as seen by %s's gateway", windowText(s.gateway.Window), s.gateway.Node)
		if s.gateway.URL != "" {
			text += fmt.Sprintf(" (%s)", s.gateway.URL)
		}
		line(text)
	} else {
		line(fmt.Sprintf("REQ/S and TTFB blank: %v", s.gatewayErr))
	}
	models := overview.Table{Head: []string{"MODEL", "READY", "REQ/S", "P50", "P99", "RUN", "WAIT", "KV", "PROMPT/S", "GEN/S", "WHY"}, Flex: -1, MinFlex: 12}
	for _, d := range s.models {
		m := per[d.Name]
		if m == nil {
			m = &sum{}
		}
		rate, p50, p99 := "-", "-", "-"
		if s.gateway != nil {
			t := traffic[d.Name] // none in the window: a zero rate
			rate, p50, p99 = fmt.Sprintf("%.2f", t.Rate), ttfbText(t.TTFBP50), ttfbText(t.TTFBP99)
		}
		kv, prompt, gen := "-", "-", "-"
		if m.kvN > 0 {
			kv = fmt.Sprintf("%.0f%%", 100*m.kv/float64(m.kvN))
		}
		if m.rates {
			prompt, gen = fmt.Sprintf("%.0f", m.prompt), fmt.Sprintf("%.0f", m.gen)
		}
		run, wait := "-", "-"
		if m.kvN > 0 {
			run, wait = fmt.Sprintf("%.0f", m.running), fmt.Sprintf("%.0f", m.waiting)
		}
		readyCell := overview.S(fmt.Sprintf("%d/%d", d.Ready, d.Replicas), st.OK)
		switch {
		case d.Ready == 0 && d.Replicas > 0:
			readyCell.Style = &st.Bad
		case d.Ready < d.Replicas:
			readyCell.Style = &st.Warn
		}
		models.Rows = append(models.Rows, []overview.Cell{overview.C(d.Name), readyCell, overview.C(rate), overview.C(p50), overview.C(p99), overview.C(run), overview.C(wait),
			overview.C(kv), overview.C(prompt), overview.C(gen), overview.C(dash(strings.Join(d.Why, "; ")))})
	}
	fmt.Fprint(w, models.Render(width, "", st))
	line("")

	table := overview.Table{Head: []string{"SHARD", "NODE", "GPUS", "STATUS", "LEASE", "RUN", "WAIT", "KV", "GEN/S", "LOAD AGE", "RESTARTS"}, Flex: 1, MinFlex: 8}
	for _, sh := range shards {
		l := sh.Load
		run, wait, kv, gen, age := "-", "-", "-", "-", "-"
		if !l.ScrapedAt.IsZero() && l.Error == "" {
			run, wait, kv = fmt.Sprintf("%.0f", l.Running), fmt.Sprintf("%.0f", l.Waiting), fmt.Sprintf("%.0f%%", 100*l.KVCacheUsage)
			if l.RatesValid {
				gen = fmt.Sprintf("%.0f", l.GenerationTPS)
			}
			age = overview.Ago(now.Sub(l.ScrapedAt))
		}
		status := stateCell(string(sh.Status), st)
		if sh.Draining {
			status.Text += " (draining)"
		}
		table.Rows = append(table.Rows, []overview.Cell{overview.C(sh.ShardID), overview.C(dash(sh.Node)), overview.C(ints(sh.GPUs)), status, stateCell(string(sh.Lease), st),
			overview.C(run), overview.C(wait), overview.C(kv), overview.C(gen), overview.C(age), overview.C(fmt.Sprint(sh.Restarts))})
	}
	fmt.Fprint(w, table.Render(width, "", st))
}

// oneRowPerShard keeps, of the copies of one engine (a shard at one spec
// version), the one that matters: a shard that moved is still listed by
// its old holder until that node stops it, and two rows for it read as
// two replicas. The copy that serves wins (valid, then starting), then the
// one the plan counts on. Copies at other spec versions (a rolling update)
// are other engines and keep their rows.
func oneRowPerShard(in []status.ShardInfo) []status.ShardInfo {
	rank := func(s status.ShardInfo) int {
		r := 0
		switch s.Lease {
		case placement.LeaseValid:
			r = 4
		case placement.LeaseStarting:
			r = 2
		}
		if s.Reason == "" {
			r++
		}
		return r
	}
	best := map[string]int{}
	var out []status.ShardInfo
	for _, s := range in {
		k := s.ShardID + "\x00" + s.SpecVersion
		if i, ok := best[k]; ok {
			if rank(s) > rank(out[i]) {
				out[i] = s
			}
			continue
		}
		best[k] = len(out)
		out = append(out, s)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].ShardID < out[j].ShardID })
	return out
}

// stateCell colours a node, shard or lease state by what it means.
func stateCell(state string, st overview.Styles) overview.Cell {
	switch state {
	case "alive", "ready", "valid":
		return overview.S(state, st.OK)
	case "suspect", "starting", "pending", "stopping", "backoff":
		return overview.S(state, st.Warn)
	case "dead", "left", "crashed", "lapsed", "unplaced":
		return overview.S(state, st.Bad)
	case "":
		return overview.C("-")
	}
	return overview.C(state)
}

// terminalWidth is w's width when it is a terminal, else 0 (no limit).
func terminalWidth(w io.Writer) int {
	f, ok := w.(*os.File)
	if !ok || !isTerminal(w) {
		return 0
	}
	width, _, err := term.GetSize(f.Fd())
	if err != nil {
		return 0
	}
	return width
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
