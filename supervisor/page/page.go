// Package page draws the cluster page at GET /: nodes with their GPUs,
// deployments with what is placed and why the rest is not, and shards with
// their leases and load, and at the top where clients send requests: the
// nodes' gateways, each row linking to its own. Any node draws it from its own gossip view, so there
// is no page that only one node can serve, and each node name links to that
// node's own page.
//
// The page is one self-contained HTML document (inline CSS, no scripts, no
// external assets) that reloads itself every RefreshSeconds. Every value
// goes through html/template. Charts of the last hour are inline SVG
// drawn here from the node's history (supervisor/history): per
// deployment, and for this node and the busiest few, never for every
// node.
package page

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"net/http"
	"time"

	"github.com/llmgw/llmgw/supervisor/history"
	"github.com/llmgw/llmgw/supervisor/status"
)

// RefreshSeconds is how often the page reloads itself.
const RefreshSeconds = 10

// VersionsMixedWarnAfter is how long nodes may announce different protocol
// versions before the page warns: a rolling upgrade passes through that
// state for minutes; one left half done stays in it, with the cluster on
// the older version's rules.
const VersionsMixedWarnAfter = 10 * time.Minute

//go:embed page.html.tmpl
var pageHTML string

var tmpl = template.Must(template.New("page").Parse(pageHTML))

// Source is what the page is drawn from: a node's read model and its
// clock (*supervisor.Node).
type Source interface {
	Status() *status.Snapshot
	Now() time.Time
}

// Traffic is one deployment's requests through this node's gateway over
// its stats window (supervisor/gateway's Stats, which this package may not
// import).
type Traffic struct {
	Deployment       string
	Requests, Errors int
	Rate             float64
	Window           time.Duration
	TTFBP50, TTFBP99 time.Duration
}

// Options are what the page draws besides the read model.
type Options struct {
	// Traffic reads this node's gateway's stats; nil when the node runs
	// no gateway.
	Traffic func() []Traffic
	// History is this node's last hour, drawn as charts; nil: no charts.
	History *history.Recorder
}

// chartNodes is how many nodes besides this one get GPU charts: the
// busiest, so that the page stays small with 500 nodes.
const chartNodes = 4

// Register adds GET / (exactly; other paths stay 404) to mux.
func Register(src Source, mux *http.ServeMux, opts Options) {
	mux.Handle("GET /{$}", Handler(src, opts))
}

// Handler draws the page from src.
func Handler(src Source, opts Options) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var traffic []Traffic
		if opts.Traffic != nil {
			traffic = opts.Traffic()
		}
		d := build(src.Status(), src.Now(), traffic, opts.Traffic != nil)
		if opts.History != nil {
			v := opts.History.View(chartNodes)
			c := buildCharts(v)
			d.Charts = &c
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, d); err != nil {
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
	// TrafficNote says whose gateway the request rates are (or why there
	// are none).
	TrafficNote string
	Nodes       []nodeRow
	Deployments []depRow
	Shards      []shardRow
	// VersionsWarning says that versions have been mixed for longer than
	// VersionsMixedWarnAfter (empty: they have not).
	VersionsWarning string
	// Charts are the last hour (nil: the node keeps no history).
	Charts *charts
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

// clipped is a text cut for its cell, with the whole of it in Full (shown
// on hover) when it was cut.
type clipped struct {
	Text, Full string
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
	Uptime               string
	GPUs                 []gpuRow
	Links                []linkRow
	Shards               int
	Faults               clipped
	FaultsClass          string
	Simulated            bool
	// Weights are the models in the node's weights dir, with their size.
	Weights []string
	// Protocol is the range of protocol versions the node's build speaks
	// ("protocol 1-2"; empty when this node has not met it).
	Protocol string
}

type gpuRow struct {
	Index int
	// Name is the GPU's model; ShowName the same, only on the first of
	// a run of GPUs of one model (the rest have it on hover).
	Name, ShowName     string
	OwnPct, ForeignPct int
	Text               string
	// Activity is utilisation, temperature and power from the node's
	// last published telemetry (empty: none read).
	Activity string
	Shards   string // shards holding the GPU, from the node's record
	Faulted  bool
	MIG      bool
}

type linkRow struct {
	Name, Text string
	Up         bool
}

type depRow struct {
	Name, Model, Engine   string
	Wanted, Placed, Ready int
	// Scale is an autoscaled deployment's range and its decider's last
	// word ("" for a fixed count).
	Scale string
	// Adapters are its LoRA adapters, one line each.
	Adapters []string
	Shape    string
	Nodes    string
	Class    string
	// Load sums the engines' last readings; Traffic is this node's
	// gateway's requests for it.
	Load, Traffic string
	Why           []clipped
}

type shardRow struct {
	ID, Deployment, Node, GPUs string
	NodeDown                   bool
	Status, StatusClass        string
	Lease, LeaseClass          string
	URL                        string
	Load, LoadAge              string
	Restarts                   int
	Reason                     clipped
	// Rank is a gang member's "rank/size" ("" for a replica of one
	// shard); Reason then also says what holds the gang back.
	Rank string
}

// diskSize is a size on disk in GiB, or KiB or MiB below one GiB.
func diskSize(b uint64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
}
