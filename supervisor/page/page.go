// Package page draws the cluster page at GET /: nodes with their GPUs,
// deployments with what is placed and why the rest is not, and shards with
// their leases and load, and at the top where clients send requests: the
// nodes' gateways, each row linking to its own. Any node draws it from its own gossip view, so there
// is no page that only one node can serve, and each node name links to that
// node's own page.
//
// The page is one self-contained HTML document (inline CSS, no scripts, no
// external assets) that reloads itself every RefreshSeconds. Every value
// goes through html/template.
package page

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// RefreshSeconds is how often the page reloads itself.
const RefreshSeconds = 10

//go:embed page.html.tmpl
var pageHTML string

var tmpl = template.Must(template.New("page").Parse(pageHTML))

// Source is what the page is drawn from: a node's read model and its
// clock (*supervisor.Node).
type Source interface {
	Status() *status.Snapshot
	Now() time.Time
}

// Register adds GET / (exactly; other paths stay 404) to mux.
func Register(src Source, mux *http.ServeMux) {
	mux.Handle("GET /{$}", Handler(src))
}

// Handler draws the page from src.
func Handler(src Source) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, build(src.Status(), src.Now())); err != nil {
			http.Error(w, "draw the cluster page: "+err.Error(), http.StatusInternalServerError)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		// Nothing is loaded from anywhere; inline styles are the only
		// thing the page needs.
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		_, _ = w.Write(buf.Bytes())
	})
}

type data struct {
	Self, Version, Now string
	Refresh            int
	Summary            summary
	Gateway            gatewayHint
	Nodes              []nodeRow
	Deployments        []depRow
	Shards             []shardRow
}

type summary struct {
	NodesAlive, Nodes       int
	GPUs, GPUsIdle          int
	DepsReady, Deployments  int
	ShardsValid, ShardCount int
	Unplaced                int
}

// gatewayHint is the line at the top: one gateway to send requests to
// (this node's when it runs one and is alive), and how many there are.
type gatewayHint struct {
	URL, Link string
	Node      string
	Self      bool
	Count     int
}

type nodeRow struct {
	Name, State, StateClass string
	Link                    string
	// Gateway is where clients reach the node's gateway (empty: none),
	// GatewayLink its model list.
	Gateway, GatewayLink string
	Self                 bool
	Labels               []string
	Agent, Runtime       string
	GPUs                 []gpuRow
	Shards               int
	Faults, FaultsClass  string
	Simulated            bool
}

type gpuRow struct {
	Index              int
	Name               string
	OwnPct, ForeignPct int
	Text               string
	Shards             string // shards holding the GPU, from the node's record
	Faulted            bool
	MIG                bool
}

type depRow struct {
	Name, Model, Engine   string
	Wanted, Placed, Ready int
	Shape                 string
	Nodes                 string
	Class                 string
	Why                   []string
}

type shardRow struct {
	ID, Deployment, Node, GPUs string
	Status, StatusClass        string
	Lease, LeaseClass          string
	Load                       string
	Restarts                   int
	Reason                     string
	// Rank is a gang member's "rank/size" ("" for a replica of one
	// shard); Reason then also says what holds the gang back.
	Rank string
}

func build(snap *status.Snapshot, now time.Time) data {
	d := data{Self: snap.Self(), Now: now.UTC().Format("2006-01-02 15:04:05Z"), Refresh: RefreshSeconds}
	for _, m := range snap.Members() {
		row := nodeRow{Name: m.Name, State: string(m.State), StateClass: stateClass(m.State), Self: m.Name == snap.Self(),
			Agent: m.AgentVersion, Runtime: m.Runtime, Shards: len(m.Shards), Simulated: m.Probes.GPUsSimulated}
		if m.API != "" {
			row.Link = "http://" + m.API + "/"
		}
		if u := m.GatewayURL(); u != "" {
			row.Gateway, row.GatewayLink = u, u+"/v1/models"
		}
		for k, v := range m.Labels {
			row.Labels = append(row.Labels, k+"="+v)
		}
		slices.Sort(row.Labels)
		switch p := m.Probes; {
		case p.DriverFaultsRecent > 0:
			row.Faults, row.FaultsClass = fmt.Sprintf("%d recent", p.DriverFaultsRecent), "bad"
			if p.LastDriverFault != "" {
				row.Faults += ": " + p.LastDriverFault
			}
		case p.DriverFaultsBoot > 0:
			row.Faults, row.FaultsClass = fmt.Sprintf("%d since boot", p.DriverFaultsBoot), "dim"
		default:
			row.Faults, row.FaultsClass = "none", "dim"
		}
		held := map[int][]string{}
		for _, s := range m.Shards {
			for _, g := range s.GPUs {
				held[g] = append(held[g], s.ShardID)
			}
		}
		for _, g := range m.GPUs {
			cell := gpuCell(g)
			cell.Shards = strings.Join(held[g.Index], ", ")
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

	gws := status.Gateways(snap.Members())
	d.Gateway.Count = len(gws)
	for i, g := range gws {
		if i == 0 || g.Node == d.Self {
			d.Gateway.URL, d.Gateway.Link, d.Gateway.Node, d.Gateway.Self = g.URL+"/v1", g.URL+"/v1/models", g.Node, g.Node == d.Self
		}
	}

	for _, dep := range snap.Deployments(now) {
		r := depRow{Name: dep.Name, Model: dep.Model, Engine: dep.Engine, Wanted: dep.Replicas, Placed: dep.Placed, Ready: dep.Ready,
			Nodes: strings.Join(dep.Nodes, ", "), Why: dep.Why}
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

	for _, s := range snap.Shards(now) {
		r := shardRow{ID: s.ShardID, Deployment: s.Deployment, Node: s.Node, Status: string(s.Status), Lease: string(s.Lease),
			Restarts: s.Restarts, Reason: s.Reason, Load: loadText(s.Load, s.Status)}
		if len(s.GPUs) > 0 {
			r.GPUs = strings.Trim(fmt.Sprint(s.GPUs), "[]")
		}
		if g := s.Gang; g != nil {
			r.Rank = fmt.Sprintf("%d/%d", g.Rank, g.Size)
			if g.Note != "" && s.Lease != placement.LeaseValid {
				r.Reason = strings.TrimSpace(r.Reason + " " + fmt.Sprintf("rank %d on %s: %s", g.Rank, s.Node, g.Note))
			}
		}
		r.StatusClass = statusClass(s.Status)
		r.LeaseClass = leaseClass(s.Lease)
		if r.Lease == "" || s.Status == gossip.ShardUnplaced {
			r.Lease, r.LeaseClass = "none", "dim"
		}
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
	s := fmt.Sprintf("%g run · %g wait · KV %.0f%%", l.Running, l.Waiting, l.KVCacheUsage*100)
	if l.RatesValid {
		s += fmt.Sprintf(" · %.0f in / %.0f out tok/s", l.PromptTPS, l.GenerationTPS)
	} else {
		s += " · rates after the next scrape"
	}
	return s
}

func stateClass(s gossip.MemberState) string {
	switch s {
	case gossip.StateAlive:
		return "ok"
	case gossip.StateSuspect:
		return "warn"
	case gossip.StateLeft:
		return "dim"
	}
	return "bad"
}

func statusClass(s gossip.ShardStatus) string {
	switch s {
	case gossip.ShardReady:
		return "ok"
	case gossip.ShardStarting, gossip.ShardPending, gossip.ShardStopping:
		return "warn"
	}
	return "bad"
}

func leaseClass(l placement.LeaseState) string {
	switch l {
	case placement.LeaseValid:
		return "ok"
	case placement.LeaseStarting:
		return "warn"
	}
	return "bad"
}
