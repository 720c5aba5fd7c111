package page

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// Cut lengths: a reason or a fault line longer than this is cut in its
// cell, and the whole text is on hover.
const (
	maxReason    = 140
	maxFaultText = 72
)

func build(snap *status.Snapshot, now time.Time, traffic []Traffic, hasGateway bool) data {
	d := data{Self: snap.Self(), Now: now.UTC().Format("2006-01-02 15:04:05Z"), Refresh: RefreshSeconds}
	members := snap.Members()
	down := map[string]bool{}
	for _, m := range members {
		row := nodeRow{Name: m.Name, State: string(m.State), StateClass: toneClass(status.MemberTone(m.State)), Self: m.Name == snap.Self(),
			Agent: m.AgentVersion, Runtime: m.Runtime, Shards: len(m.Shards), Simulated: m.Probes.GPUsSimulated}
		if m.Protocol.Max > 0 {
			row.Protocol = fmt.Sprintf("protocol %d-%d", m.Protocol.Min, m.Protocol.Max)
		}
		if m.State != gossip.StateAlive && m.State != gossip.StateSuspect {
			down[m.Name] = true
		}
		if m.API != "" {
			row.Link = "http://" + m.API + "/"
		}
		if u := m.GatewayURL(); u != "" {
			row.Gateway, row.GatewayLink = u, u+"/v1/models"
		}
		if !m.StartedAt.IsZero() && !down[m.Name] {
			row.Uptime = duration(now.Sub(m.StartedAt))
		}
		for k, v := range m.Labels {
			row.Labels = append(row.Labels, k+"="+v)
		}
		for _, c := range m.CachedModels {
			row.Weights = append(row.Weights, fmt.Sprintf("%s (%s)", c.Model, diskSize(c.Bytes)))
		}
		slices.Sort(row.Labels)
		row.Faults, row.FaultsClass = faultCell(m.Probes, now)
		for _, l := range m.Telemetry.Links {
			lr := linkRow{Name: fmt.Sprintf("%s/%d", l.Device, l.Port), Up: l.Up, Text: "no link"}
			if l.Up {
				lr.Text = fmt.Sprintf("↑ %s ↓ %s MB/s", mbps(l.TxMBps), mbps(l.RxMBps))
			}
			row.Links = append(row.Links, lr)
		}
		held := map[int][]string{}
		for _, s := range m.Shards {
			for _, g := range s.GPUs {
				held[g] = append(held[g], s.ShardID)
			}
		}
		activity := map[int]string{}
		for _, t := range m.Telemetry.GPUs {
			activity[t.Index] = activityText(t)
		}
		for _, g := range m.GPUs {
			cell := gpuCell(g)
			cell.Shards = strings.Join(held[g.Index], ", ")
			cell.Activity = activity[g.Index]
			if n := len(row.GPUs); n == 0 || row.GPUs[n-1].Name != g.Name {
				cell.ShowName = g.Name
			}
			row.GPUs = append(row.GPUs, cell)
			d.Summary.GPUs++
			if m.State == gossip.StateAlive && len(held[g.Index]) == 0 && !g.Faulted {
				d.Summary.GPUsIdle++
			}
		}
		d.Nodes = append(d.Nodes, row)
		d.Summary.Nodes++
		if m.State == gossip.StateAlive {
			d.Summary.NodesAlive++
		}
		if row.Self {
			d.Version = m.AgentVersion
		}
	}

	if since := snap.VersionsMixedSince(); !since.IsZero() && now.Sub(since) > VersionsMixedWarnAfter {
		d.VersionsWarning = fmt.Sprintf("Nodes have announced different protocol versions for %s: the cluster runs version %d, the highest they all speak, until every node runs the newer release. Finish the upgrade (each node's protocol is under its name).",
			duration(now.Sub(since)), snap.ActiveVersion())
	}

	gws := status.Gateways(members)
	d.Gateway.Count = len(gws)
	for i, g := range gws {
		if i == 0 || g.Node == d.Self {
			d.Gateway.URL, d.Gateway.Link, d.Gateway.Node, d.Gateway.Self = g.URL+"/v1", g.URL+"/v1/models", g.Node, g.Node == d.Self
		}
	}

	shards := snap.Shards(now)
	loads := status.LoadTotals(shards)
	byDep := map[string]Traffic{}
	var window time.Duration
	for _, t := range traffic {
		byDep[t.Deployment] = t
		window = max(window, t.Window)
	}
	switch {
	case !hasGateway:
		d.TrafficNote = "this node runs no gateway, so it has no request rates of its own (ask a node that runs one)"
	case window > 0:
		d.TrafficNote = fmt.Sprintf("requests: the last %s through this node's gateway only", duration(window))
	default:
		d.TrafficNote = "requests: through this node's gateway only"
	}
	for _, dep := range snap.Deployments(now) {
		r := depRow{Name: dep.Name, Model: dep.Model, Engine: dep.Engine, Wanted: dep.Replicas, Placed: dep.Placed, Ready: dep.Ready,
			Nodes: strings.Join(dep.Nodes, ", "), Load: totalText(loads[dep.Name])}
		for _, w := range dep.Why {
			r.Why = append(r.Why, clip(w, maxReason))
		}
		if hasGateway {
			r.Traffic = trafficText(byDep[dep.Name])
		}
		r.Shape = fmt.Sprintf("%d GPU", dep.TensorParallel)
		if dep.TensorParallel != 1 {
			r.Shape += "s"
		}
		if dep.PipelineParallel > 1 {
			r.Shape += fmt.Sprintf(" × %d nodes", dep.PipelineParallel)
		}
		if dep.GPUMemory > 0 {
			r.Shape += ", " + dep.GPUMemory.String() + " each"
		}
		if dep.Fit != nil {
			r.Shape += fmt.Sprintf(" (auto: %s; %d × %d tokens)", dep.Fit, max(dep.MaxNumSeqs, 1), dep.MaxModelLen)
		}
		if a, sc := dep.Autoscale, dep.Scale; a != nil && sc != nil {
			// The count is the decider's: say the range and why.
			r.Scale = fmt.Sprintf("auto %d-%d", a.Min, a.Max)
			switch {
			case dep.Replicas == 0:
				r.Scale += ": scaled to zero, wakes on request"
			case sc.Reason != "":
				r.Scale += ": " + sc.Reason
			}
			r.Scale = clip(r.Scale, maxReason).Text
		}
		// LoRA adapters: where each is registered, and why not elsewhere.
		for _, a := range dep.AdapterStatus {
			text := fmt.Sprintf("%s (%s) on %d of %d ready", a.Name, a.Source, len(a.Replicas), dep.Ready)
			if len(a.Errors) > 0 {
				text += ": " + a.Errors[0]
			}
			r.Adapters = append(r.Adapters, clip(text, maxReason).Text)
		}
		switch {
		case dep.Ready == dep.Replicas:
			r.Class = "ok"
			d.Summary.DepsReady++
		case len(dep.Why) > 0:
			r.Class = "bad"
		default:
			r.Class = "warn"
		}
		d.Deployments = append(d.Deployments, r)
		d.Summary.Deployments++
	}

	for _, s := range shards {
		r := shardRow{ID: s.ShardID, Deployment: s.Deployment, Node: s.Node, NodeDown: down[s.Node], Status: string(s.Status),
			Lease: string(s.Lease), Restarts: s.Restarts, Reason: clip(s.Reason, maxReason), Load: loadText(s.Load, s.Status), URL: s.URL}
		if !s.Load.ScrapedAt.IsZero() {
			r.LoadAge = "read " + duration(now.Sub(s.Load.ScrapedAt)) + " ago"
		}
		if len(s.GPUs) > 0 {
			r.GPUs = strings.Trim(fmt.Sprint(s.GPUs), "[]")
		}
		if g := s.Gang; g != nil {
			r.Rank = fmt.Sprintf("%d/%d", g.Rank, g.Size)
			if g.Note != "" && s.Lease != placement.LeaseValid {
				r.Reason = clip(strings.TrimSpace(s.Reason+" "+fmt.Sprintf("rank %d on %s: %s", g.Rank, s.Node, g.Note)), maxReason)
			}
		}
		r.StatusClass = toneClass(status.ShardTone(s.Status))
		r.LeaseClass = toneClass(status.LeaseTone(s.Lease))
		d.Shards = append(d.Shards, r)
		d.Summary.ShardCount++
		if s.Lease == placement.LeaseValid {
			d.Summary.ShardsValid++
		}
		if s.Status == gossip.ShardUnplaced {
			d.Summary.Unplaced++
		}
	}
	return d
}

// faultCell says what the node's driver reported: recent faults loudly,
// with the newest line (cut) and its age; older ones dimly, since the
// kernel never clears them.
func faultCell(p gossip.ProbeSummary, now time.Time) (clipped, string) {
	switch {
	case p.DriverFaultsRecent > 0:
		s := fmt.Sprintf("%d recent", p.DriverFaultsRecent)
		if p.XidRecent > 0 {
			s += fmt.Sprintf(" (%d Xid)", p.XidRecent)
		}
		if !p.LastDriverFaultAt.IsZero() {
			s += ", newest " + duration(now.Sub(p.LastDriverFaultAt)) + " ago"
		}
		if p.LastDriverFault != "" {
			c := clip(p.LastDriverFault, maxFaultText)
			c.Text = s + ": " + c.Text
			if c.Full != "" {
				c.Full = s + ": " + c.Full
			}
			return c, "bad"
		}
		return clipped{Text: s}, "bad"
	case p.DriverFaultsBoot > 0:
		return clipped{Text: fmt.Sprintf("%d since boot", p.DriverFaultsBoot), Full: p.LastDriverFault}, "dim"
	}
	return clipped{Text: "none"}, "dim"
}

// clip cuts s to at most n characters, keeping the whole in Full.
func clip(s string, n int) clipped {
	if utf8.RuneCountInString(s) <= n {
		return clipped{Text: s}
	}
	r := []rune(s)
	return clipped{Text: strings.TrimSpace(string(r[:n-1])) + "…", Full: s}
}

func activityText(t gossip.GPUTelemetry) string {
	var parts []string
	if !t.NoUtil {
		parts = append(parts, fmt.Sprintf("%d%%", t.UtilPct))
	}
	if !t.NoTemp {
		parts = append(parts, fmt.Sprintf("%d °C", t.TempC))
	}
	if !t.NoPower {
		parts = append(parts, fmt.Sprintf("%d W", t.PowerW))
	}
	return strings.Join(parts, " · ")
}

func totalText(t status.LoadTotal) string {
	if t.Engines == 0 {
		return ""
	}
	kv := "KV ?" // no engine of it exports its KV usage
	if t.KVKnown() {
		kv = fmt.Sprintf("KV %.0f%%", t.KVCacheUsage()*100)
	}
	s := fmt.Sprintf("%g run · %g wait · %s", t.Running, t.Waiting, kv)
	if t.Rates {
		s += fmt.Sprintf(" · %.0f in / %.0f out tok/s", t.PromptTPS, t.GenerationTPS)
	}
	return s
}

func trafficText(t Traffic) string {
	if t.Requests == 0 {
		return "no requests"
	}
	// Two significant digits below 10 req/s (0.7, 1.5), whole numbers
	// above (%g would write 120 as 1.2e+02).
	s := fmt.Sprintf("%.2g req/s", t.Rate)
	if t.Rate >= 10 {
		s = fmt.Sprintf("%.0f req/s", t.Rate)
	}
	if t.TTFBP50 > 0 {
		s += fmt.Sprintf(" · TTFB p50 %s p99 %s", ms(t.TTFBP50), ms(t.TTFBP99))
	}
	if t.Errors > 0 {
		s += fmt.Sprintf(" · %d 5xx", t.Errors)
	}
	return s
}

func ms(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

func mbps(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

// duration writes d for people: 42s, 5m, 3h12m, 4d6h.
func duration(d time.Duration) string {
	switch d = max(d, 0); {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

func gpuCell(g placement.GPU) gpuRow {
	r := gpuRow{Index: g.Index, Name: g.Name, Faulted: g.Faulted, MIG: g.MIG}
	if g.MemoryTotal > 0 {
		foreign := min(g.MemoryForeign, g.MemoryTotal)
		own := min(g.MemoryUsed-min(g.MemoryUsed, foreign), g.MemoryTotal-foreign)
		r.ForeignPct = int(foreign * 100 / g.MemoryTotal)
		r.OwnPct = int(own * 100 / g.MemoryTotal)
	}
	r.Text = fmt.Sprintf("%s / %s", gib(g.MemoryUsed), gib(g.MemoryTotal))
	if g.MemoryForeign > 0 {
		r.Text += fmt.Sprintf(" (%s not ours)", gib(g.MemoryForeign))
	}
	return r
}

func gib(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

func loadText(l gossip.ShardLoad, status gossip.ShardStatus) string {
	switch {
	case l.Error != "":
		return "scrape failed: " + l.Error
	case l.ScrapedAt.IsZero():
		if status == gossip.ShardReady {
			return "not scraped yet"
		}
		return ""
	}
	kv := "KV ?" // the engine does not export its KV usage
	if l.Knows(gossip.ReadingKVCache) {
		kv = fmt.Sprintf("KV %.0f%%", l.KVCacheUsage*100)
	}
	s := fmt.Sprintf("%g run · %g wait · %s", l.Running, l.Waiting, kv)
	if l.RatesValid {
		s += fmt.Sprintf(" · %.0f in / %.0f out tok/s", l.PromptTPS, l.GenerationTPS)
		if l.PrefixQueriesPS > 0 {
			s += fmt.Sprintf(" · prefix cache %.0f%% hit", 100*l.PrefixHitRate)
		}
	} else {
		s += " · rates after the next scrape"
	}
	return s
}

// toneClass is the CSS class (page.html.tmpl's palette) of a state's tone.
func toneClass(t status.Tone) string {
	switch t {
	case status.ToneOK:
		return "ok"
	case status.ToneWarn:
		return "warn"
	case status.ToneBad:
		return "bad"
	case status.ToneIdle:
		return "dim"
	}
	return ""
}
