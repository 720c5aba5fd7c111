package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/supervisor/gateway"
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
			draw := func(snap topSnapshot) error {
				if c.Bool("json") {
					// One object per frame (JSON lines when refreshed).
					frame := map[string]any{"cluster": snap.cluster, "deployments": snap.models, "shards": snap.shards, "gateway": snap.gateway}
					if snap.gatewayErr != nil {
						frame["gateway_error"] = snap.gatewayErr.Error()
					}
					return printJSON(w, frame)
				}
				renderTop(w, cl.base, snap, time.Now())
				return nil
			}
			if c.Bool("once") {
				snap, err := fetchTop(ctx, cl)
				if err != nil {
					return err
				}
				return draw(snap)
			}
			// On a terminal each frame replaces the last; into a pipe or
			// a file, frames follow one another.
			clear := isTerminal(w) && !c.Bool("json")
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				snap, err := fetchTop(ctx, cl)
				if ctx.Err() != nil {
					return nil
				}
				if clear {
					fmt.Fprint(w, "\x1b[H\x1b[2J")
				} else if !c.Bool("json") {
					fmt.Fprintln(w)
				}
				if err != nil {
					// The node may be restarting: say so and keep asking.
					fmt.Fprintf(c.Root().ErrWriter, "llmgw top: %v (retrying every %s)\n", err, interval)
				} else if err := draw(snap); err != nil {
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

// renderTop writes one frame. Load figures come from each engine's own
// /metrics as its node last scraped them, carried in the node records; a
// dash means no valid reading yet (or a rate right after an engine
// restart, whose counters started over). REQ/S and TTFB are the asked
// node's gateway's own: requests that came in through other nodes'
// gateways are not in them.
func renderTop(w io.Writer, addr string, s topSnapshot, now time.Time) {
	alive, ready := 0, 0
	for _, m := range s.cluster.Members {
		if m.State == gossip.StateAlive {
			alive++
		}
	}
	for _, sh := range s.shards {
		if sh.Status == gossip.ShardReady {
			ready++
		}
	}
	fmt.Fprintf(w, "llmgw top  %s  via %s (%s)  nodes %d/%d alive  models %d  shards %d/%d ready\n\n",
		now.Format("15:04:05"), s.cluster.Self, addr, alive, len(s.cluster.Members), len(s.models), ready, len(s.shards))

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tGPUS\tGPU MEMORY\tSHARDS\tFAULTS\tLINK TX/RX MB/S\tRUNTIME\tAGE")
	for _, m := range s.cluster.Members {
		age := "-"
		if !m.StartedAt.IsZero() {
			age = shortDuration(now.Sub(m.StartedAt))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", m.Name, m.State, gpuSummary(m.GPUs), gpuMemory(m.GPUs), len(m.Shards),
			topFaults(m.Probes), topLinks(m.Telemetry.Links), dash(m.Runtime), age)
	}
	tw.Flush()
	fmt.Fprintln(w)

	// Per model: the sum over its shards with a load reading (engines
	// are scraped only while ready); KV cache is their mean.
	type sum struct {
		running, waiting, kv, prompt, gen float64
		kvN                               int
		rates                             bool
		// hits and lookups are prefix-cache tokens per second: the
		// model's hit rate is their ratio, each engine weighted by its
		// lookups.
		hits, lookups float64
	}
	per := map[string]*sum{}
	for _, sh := range s.shards {
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
		m.hits += l.PrefixHitRate * l.PrefixQueriesPS
		m.lookups += l.PrefixQueriesPS
	}
	traffic := map[string]gateway.ModelStats{}
	if s.gateway != nil {
		for _, ms := range s.gateway.Models {
			traffic[ms.Model] = ms
		}
		fmt.Fprintf(w, "REQ/S and P50/P99 TTFB (time to first byte): last %s, as seen by %s's gateway", windowText(s.gateway.Window), s.gateway.Node)
		if s.gateway.URL != "" {
			fmt.Fprintf(w, " (%s)", s.gateway.URL)
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintf(w, "REQ/S and TTFB blank: %v\n", s.gatewayErr)
	}
	fmt.Fprintln(tw, "MODEL\tREADY\tREQ/S\tP50 TTFB\tP99 TTFB\tRUNNING\tWAITING\tKV CACHE\tCACHE HIT\tPROMPT TOK/S\tGEN TOK/S\tWHY")
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
		kv, hit, prompt, gen := "-", "-", "-", "-"
		if m.lookups > 0 {
			hit = fmt.Sprintf("%.0f%%", 100*m.hits/m.lookups)
		}
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
		fmt.Fprintf(tw, "%s\t%d/%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, d.Ready, d.Replicas, rate, p50, p99, run, wait, kv, hit, prompt, gen, dash(strings.Join(d.Why, "; ")))
	}
	tw.Flush()
	fmt.Fprintln(w)

	shards := append([]status.ShardInfo(nil), s.shards...)
	sort.SliceStable(shards, func(i, j int) bool { return shards[i].ShardID < shards[j].ShardID })
	fmt.Fprintln(tw, "SHARD\tNODE\tGPUS\tSTATUS\tLEASE\tRUNNING\tWAITING\tKV CACHE\tGEN TOK/S\tRESTARTS")
	for _, sh := range shards {
		l := sh.Load
		run, wait, kv, gen := "-", "-", "-", "-"
		if !l.ScrapedAt.IsZero() && l.Error == "" {
			run, wait, kv = fmt.Sprintf("%.0f", l.Running), fmt.Sprintf("%.0f", l.Waiting), fmt.Sprintf("%.0f%%", 100*l.KVCacheUsage)
			if l.RatesValid {
				gen = fmt.Sprintf("%.0f", l.GenerationTPS)
			}
		}
		status := string(sh.Status)
		if sh.Draining {
			status += " (draining)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", sh.ShardID, dash(sh.Node), ints(sh.GPUs), dash(status), sh.Lease, run, wait, kv, gen, sh.Restarts)
	}
	tw.Flush()
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
