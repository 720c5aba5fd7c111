package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/charmbracelet/x/term"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/supervisor/gateway"
	"github.com/llmgw/llmgw/supervisor/history"
	"github.com/llmgw/llmgw/supervisor/overview"
	"github.com/llmgw/llmgw/supervisor/status"
)

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

	// FAULTS counts in the agents' fault window (their default). On a
	// narrow screen the sparkline, then RUNTIME, then AGE, then the links
	// give way. The sparklines cover the last hour, a cell per sparkWidth-th of it,
	// from the asked node's history: its own GPUs and the busiest nodes'
	// (others have none), and every deployment's requests through its
	// gateway. They give way first on a narrow screen.
	util, rates := map[string]history.Series{}, map[string]history.Series{}
	slots := 0
	if h := s.history; h != nil {
		slots = h.Points
		for _, n := range h.Nodes {
			util[n.Name] = n.UtilPct
		}
		for _, d := range h.Deployments {
			rates[d.Name] = d.RequestsPerS
		}
	}
	nodes := overview.Table{Head: []string{"NODE", "STATE", "GPUS", "GPU MEM", "UTIL 1H", "SHARDS", "FAULTS/" + overview.Ago(host.DefaultFaultWindow), "LINK MB/S", "RUNTIME", "AGE"},
		Flex: 2, MinFlex: 8, Optional: []int{4, 8, 9, 7}}
	for _, m := range s.cluster.Members {
		age := "-"
		if !m.StartedAt.IsZero() {
			age = shortDuration(now.Sub(m.StartedAt))
		}
		faults := overview.C(topFaults(m.Probes))
		if m.Probes.DriverFaultsRecent > 0 {
			faults.Style = &st.Bad
		}
		nodes.Rows = append(nodes.Rows, []overview.Cell{overview.C(m.Name), stateCell(string(m.State), st), overview.C(gpuSummary(m.GPUs)), overview.C(gpuMemory(m.GPUs)),
			overview.C(sparkline(util[m.Name], slots, 100)), overview.C(fmt.Sprint(len(m.Shards))), faults, overview.C(topLinks(m.Telemetry.Links)), overview.C(dash(m.Runtime)), overview.C(age)})
	}
	fmt.Fprint(w, nodes.Render(width, "", st))
	line("")

	per := status.LoadTotals(shards)
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
	models := overview.Table{Head: []string{"MODEL", "READY", "REQ/S", "REQ/S 1H", "P50", "P99", "RUN", "WAIT", "KV", "HIT", "PROMPT/S", "GEN/S", "WHY"}, Flex: -1, MinFlex: 12,
		Optional: []int{3}}
	for _, d := range s.models {
		m := per[d.Name] // zero without readings
		rate, p50, p99 := "-", "-", "-"
		if s.gateway != nil {
			t := traffic[d.Name] // none in the window: a zero rate
			rate, p50, p99 = fmt.Sprintf("%.2f", t.Rate), ttfbText(t.TTFBP50), ttfbText(t.TTFBP99)
		}
		kv, hit, prompt, gen := "-", "-", "-", "-"
		if r, ok := m.PrefixHitRate(); ok {
			hit = fmt.Sprintf("%.0f%%", 100*r)
		}
		if m.Engines > 0 {
			kv = "?" // no engine exports it
			if m.KVKnown() {
				kv = fmt.Sprintf("%.0f%%", 100*m.KVCacheUsage())
			}
		}
		if m.Rates {
			prompt, gen = fmt.Sprintf("%.0f", m.PromptTPS), fmt.Sprintf("%.0f", m.GenerationTPS)
		}
		run, wait := "-", "-"
		if m.Engines > 0 {
			run, wait = fmt.Sprintf("%.0f", m.Running), fmt.Sprintf("%.0f", m.Waiting)
		}
		readyCell := overview.S(fmt.Sprintf("%d/%d", d.Ready, d.Replicas), st.OK)
		switch {
		case d.Ready == 0 && d.Replicas > 0:
			readyCell.Style = &st.Bad
		case d.Ready < d.Replicas:
			readyCell.Style = &st.Warn
		}
		models.Rows = append(models.Rows, []overview.Cell{overview.C(d.Name), readyCell, overview.C(rate), overview.C(sparkline(rates[d.Name], slots, 0)), overview.C(p50), overview.C(p99), overview.C(run), overview.C(wait),
			overview.C(kv), overview.C(hit), overview.C(prompt), overview.C(gen), overview.C(dash(strings.Join(d.Why, "; ")))})
	}
	fmt.Fprint(w, models.Render(width, "", st))
	line("")

	table := overview.Table{Head: []string{"SHARD", "NODE", "GPUS", "STATUS", "LEASE", "RUN", "WAIT", "KV", "GEN/S", "LOAD AGE", "RESTARTS"}, Flex: 1, MinFlex: 8,
		// The models' table has the load summed; a narrow screen drops
		// the per-engine KV cache, then the waiting requests.
		Optional: []int{7, 6}}
	for _, sh := range shards {
		l := sh.Load
		run, wait, kv, gen, age := "-", "-", "-", "-", "-"
		if !l.ScrapedAt.IsZero() && l.Error == "" {
			run, wait, kv = fmt.Sprintf("%.0f", l.Running), fmt.Sprintf("%.0f", l.Waiting), fmt.Sprintf("%.0f%%", 100*l.KVCacheUsage)
			if !l.Knows(gossip.ReadingKVCache) {
				kv = "?" // the engine does not export it
			}
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

// sparkWidth is a sparkline's cells: five minutes each over an hour.
const sparkWidth = 12

// sparkBlocks are a sparkline's eight heights.
const sparkBlocks = "▁▂▃▄▅▆▇█"

// sparkline draws s, placed at the right of slots points (the newest at
// the right edge), in sparkWidth cells, each the largest point of its
// share; a blank cell has no reading. top is the scale's top (0: the
// largest point). A dash when the series has no reading at all.
func sparkline(s history.Series, slots int, top float64) string {
	if s.Points() == 0 || slots <= 0 {
		return "-"
	}
	cells := history.Reduce(s, slots, sparkWidth)
	for _, v := range cells {
		if !math.IsNaN(v) && (top == 0 || v > top) {
			top = max(top, v)
		}
	}
	blocks := []rune(sparkBlocks)
	var b strings.Builder
	for _, v := range cells {
		switch {
		case math.IsNaN(v):
			b.WriteByte(' ')
		case top <= 0:
			b.WriteRune(blocks[0])
		default:
			b.WriteRune(blocks[min(int(v/top*float64(len(blocks)-1)+0.5), len(blocks)-1)])
		}
	}
	return b.String()
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

// stateCell colours a node, shard or lease state by what it means
// (status.StateTone, as the page and the overview do); "-" when empty.
func stateCell(state string, st overview.Styles) overview.Cell {
	if state == "" {
		return overview.C("-")
	}
	return st.State(state)
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
