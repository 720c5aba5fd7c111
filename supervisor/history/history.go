// Package history keeps a node's last hour of the few numbers an operator
// looks at to answer "since when?": per deployment, the requests this
// node's gateway sent and their time to first byte, and the engines'
// running and waiting requests and KV cache usage as their records say;
// per node, its GPUs' memory and utilisation. The page draws them as
// charts and `llmgw top` as sparklines, both from GET /v1/history.
//
// Per deployment it also keeps its replicas ready and wanted, so an
// autoscaled deployment's moves show beside the load that made them.
//
// Every node keeps its own, in rings of fixed size sampled every Step, so
// a node's memory for it does not grow with time, and with the cluster
// only by two bytes per node per point (percentages are stored as bytes).
// A node that just started has nothing yet and says so ("collecting").
// Nothing is gossiped: a chart is what this node saw, which for the
// gateway's figures is all it could show anyway.
package history

import (
	"cmp"
	"context"
	"encoding/json"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/supervisor/status"
)

// Defaults: a point every 10 s (the page's refresh), an hour of them.
const (
	DefaultStep   = 10 * time.Second
	DefaultPoints = 360
)

// MinPoints is how many samples a chart needs before it draws a line;
// until then it says "collecting".
const MinPoints = 2

// DefaultBusiest is how many nodes besides this one GET /v1/history
// returns (the busiest by recent GPU utilisation), and MaxBusiest the
// most a caller may ask for: a page with 500 nodes' charts is not a page.
const (
	DefaultBusiest = 4
	MaxBusiest     = 32
)

// Traffic is one deployment's requests through this node's gateway over
// the last step (the gateway's Stats over a window, which this package
// may not import).
type Traffic struct {
	Deployment       string
	Rate             float64
	TTFBP50, TTFBP99 time.Duration
}

// Config is what a Recorder samples.
type Config struct {
	// Self is this node's name.
	Self  string
	Clock clock.Clock
	// Step and Points: DefaultStep and DefaultPoints when zero.
	Step   time.Duration
	Points int
	// Status reads the node's read model (*supervisor.Node's Status).
	Status func() Reading
	// Traffic reads this node's gateway over the window; nil when the
	// node runs no gateway (the request charts are then absent).
	Traffic func(window time.Duration) []Traffic
}

// Reading is what a sample reads of the node's read model
// (*status.Snapshot).
type Reading interface {
	Deployments(now time.Time) []status.DeploymentInfo
	Shards(now time.Time) []status.ShardInfo
	Members() []status.MemberInfo
}

// Recorder samples a node's view every step into fixed rings.
type Recorder struct {
	cfg     Config
	started time.Time

	mu sync.Mutex
	// n is how many samples were taken; the newest is at (n-1)%points.
	n    int
	last time.Time
	deps map[string]*depRing
	// nodes are every node seen alive within the window: two bytes a
	// point each, so 500 nodes' hour is 360 KB.
	nodes map[string]*nodeRing
}

// missingPct marks a point without a reading in a percentage ring.
const missingPct = math.MaxUint8

type depRing struct {
	rate, p50, p99, running, waiting, kv []float32
	// ready and wanted are the replicas serving and asked for (an
	// autoscaled deployment's target): autoscaling over the hour.
	ready, wanted []float32
}

type nodeRing struct {
	mem, util []uint8
}

// New returns a recorder that has taken no sample yet.
func New(cfg Config) *Recorder {
	if cfg.Step <= 0 {
		cfg.Step = DefaultStep
	}
	if cfg.Points <= 0 {
		cfg.Points = DefaultPoints
	}
	return &Recorder{cfg: cfg, started: cfg.Clock.Now(), deps: map[string]*depRing{}, nodes: map[string]*nodeRing{}}
}

// Run samples every step until ctx ends, the first at once.
func (r *Recorder) Run(ctx context.Context) {
	t := r.cfg.Clock.NewTicker(r.cfg.Step)
	defer t.Stop()
	r.Sample()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
			r.Sample()
		}
	}
}

// Sample takes one point of every series now.
func (r *Recorder) Sample() {
	now := r.cfg.Clock.Now()
	snap := r.cfg.Status()
	var traffic map[string]Traffic
	if r.cfg.Traffic != nil {
		traffic = map[string]Traffic{}
		for _, t := range r.cfg.Traffic(r.cfg.Step) {
			traffic[t.Deployment] = t
		}
	}
	loads := status.LoadTotals(snap.Shards(now))
	r.mu.Lock()
	defer r.mu.Unlock()
	i := r.n % r.cfg.Points
	r.n++
	r.last = now
	seen := map[string]bool{}
	for _, d := range snap.Deployments(now) {
		seen[d.Name] = true
		ring := r.deps[d.Name]
		if ring == nil {
			ring = r.newDepRing()
			r.deps[d.Name] = ring
		}
		rate, p50, p99 := nan, nan, nan
		if traffic != nil {
			t := traffic[d.Name] // none: a zero rate, no TTFB
			rate = float32(t.Rate)
			if t.TTFBP50 > 0 {
				p50, p99 = float32(t.TTFBP50.Seconds()), float32(t.TTFBP99.Seconds())
			}
		}
		run, wait, kv := nan, nan, nan
		if l, ok := loads[d.Name]; ok {
			run, wait = float32(l.Running), float32(l.Waiting)
			if l.KVKnown() {
				kv = float32(l.KVCacheUsage())
			}
		}
		ring.rate[i], ring.p50[i], ring.p99[i], ring.running[i], ring.waiting[i], ring.kv[i] = rate, p50, p99, run, wait, kv
		ring.ready[i], ring.wanted[i] = float32(d.Ready), float32(d.Replicas)
	}
	// A deployment removed keeps its ring until a whole window passed
	// without it: its last hour is still worth a look.
	for name, ring := range r.deps {
		if !seen[name] {
			ring.rate[i], ring.p50[i], ring.p99[i], ring.running[i], ring.waiting[i], ring.kv[i] = nan, nan, nan, nan, nan, nan
			ring.ready[i], ring.wanted[i] = nan, nan
			if allNaN(ring.rate) && allNaN(ring.running) && allNaN(ring.kv) {
				delete(r.deps, name)
			}
		}
	}
	seen = map[string]bool{}
	for _, m := range snap.Members() {
		if m.State != gossip.StateAlive && m.State != gossip.StateSuspect {
			continue
		}
		mem, util := nodePct(m)
		if mem == missingPct && util == missingPct && r.nodes[m.Name] == nil {
			continue // no GPUs: nothing to chart
		}
		seen[m.Name] = true
		ring := r.nodes[m.Name]
		if ring == nil {
			ring = &nodeRing{mem: filled(r.cfg.Points, uint8(missingPct)), util: filled(r.cfg.Points, uint8(missingPct))}
			r.nodes[m.Name] = ring
		}
		ring.mem[i], ring.util[i] = mem, util
	}
	for name, ring := range r.nodes {
		if !seen[name] {
			ring.mem[i], ring.util[i] = missingPct, missingPct
			if !slices.ContainsFunc(ring.mem, func(v uint8) bool { return v != missingPct }) {
				delete(r.nodes, name)
			}
		}
	}
}

var nan = float32(math.NaN())

func (r *Recorder) newDepRing() *depRing {
	p := r.cfg.Points
	return &depRing{rate: filled(p, nan), p50: filled(p, nan), p99: filled(p, nan), running: filled(p, nan), waiting: filled(p, nan), kv: filled(p, nan),
		ready: filled(p, nan), wanted: filled(p, nan)}
}

func filled[T any](n int, v T) []T {
	s := make([]T, n)
	for i := range s {
		s[i] = v
	}
	return s
}

func allNaN(s []float32) bool {
	for _, v := range s {
		if v == v {
			return false
		}
	}
	return true
}

// nodePct is a node's GPU memory in use (all its GPUs' used over their
// total) and mean utilisation, in percent; missingPct for a reading it
// does not have.
func nodePct(m status.MemberInfo) (mem, util uint8) {
	mem, util = missingPct, missingPct
	var used, total uint64
	for _, g := range m.GPUs {
		used += g.MemoryUsed
		total += g.MemoryTotal
	}
	if total > 0 {
		mem = uint8(math.Round(100 * float64(min(used, total)) / float64(total)))
	}
	sum, n := 0, 0
	for _, t := range m.Telemetry.GPUs {
		if !t.NoUtil {
			sum += min(max(t.UtilPct, 0), 100)
			n++
		}
	}
	if n > 0 {
		util = uint8((sum + n/2) / n)
	}
	return mem, util
}

// View is the body of GET /v1/history: every series oldest point first,
// one point per step ending at End, null where there was no reading.
type View struct {
	Node        string  `json:"node"`
	StepSeconds float64 `json:"step_seconds"`
	// Points is how many points the rings hold (an hour's); a series has
	// fewer until the node has run that long.
	Points int `json:"points"`
	// End is when the newest point was taken (absent before the first).
	End time.Time `json:"end,omitzero"`
	// Since is when this node started collecting; Collecting is set
	// until it has MinPoints points, and charts say so instead of drawing.
	Since       time.Time           `json:"since"`
	Collecting  bool                `json:"collecting"`
	Deployments []DeploymentHistory `json:"deployments"`
	// Nodes are this node (first, when it has GPUs) and the busiest
	// others by GPU utilisation over the last minute.
	Nodes []NodeHistory `json:"nodes"`
}

// DeploymentHistory is one deployment's series. RequestsPerS and the
// TTFB quantiles are this node's gateway's (absent without a gateway; a
// TTFB point is null when no request was answered in its step); Running,
// Waiting and KVCacheUsage (0-1, the engines' mean) are what the engines'
// records said, null without a reading.
type DeploymentHistory struct {
	Name         string `json:"name"`
	RequestsPerS Series `json:"requests_per_s,omitempty"`
	TTFBP50      Series `json:"ttfb_p50_seconds,omitempty"`
	TTFBP99      Series `json:"ttfb_p99_seconds,omitempty"`
	Running      Series `json:"running"`
	Waiting      Series `json:"waiting"`
	KVCacheUsage Series `json:"kv_cache_usage"`
	// Ready and Wanted are its replicas serving and asked for (an
	// autoscaled deployment's target in force), as this node judged.
	Ready  Series `json:"replicas_ready"`
	Wanted Series `json:"replicas_wanted"`
}

// NodeHistory is one node's GPU series, in percent.
type NodeHistory struct {
	Name      string `json:"name"`
	Self      bool   `json:"self,omitempty"`
	MemoryPct Series `json:"gpu_memory_used_pct"`
	UtilPct   Series `json:"gpu_util_pct"`
}

// Series is a chart's points; NaN is a point without a reading (null in
// JSON).
type Series []float64

// MarshalJSON writes NaN as null.
func (s Series) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 2+6*len(s))
	b = append(b, '[')
	for i, v := range s {
		if i > 0 {
			b = append(b, ',')
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			b = append(b, "null"...)
			continue
		}
		b = strconv.AppendFloat(b, v, 'g', 4, 64)
	}
	return append(b, ']'), nil
}

// UnmarshalJSON reads null as NaN.
func (s *Series) UnmarshalJSON(b []byte) error {
	var raw []*float64
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	out := make(Series, len(raw))
	for i, p := range raw {
		out[i] = math.NaN()
		if p != nil {
			out[i] = *p
		}
	}
	*s = out
	return nil
}

// Last is the newest point with a reading; false when there is none.
func (s Series) Last() (float64, bool) {
	for i := len(s) - 1; i >= 0; i-- {
		if !math.IsNaN(s[i]) {
			return s[i], true
		}
	}
	return 0, false
}

// Points counts the points with a reading.
func (s Series) Points() int {
	n := 0
	for _, v := range s {
		if !math.IsNaN(v) {
			n++
		}
	}
	return n
}

// Downsample is v with every series in cells points: each the largest
// reading of its share of the Points slots (a series shorter than Points,
// on a node that has not run an hour, fills the newest slots), NaN where
// the share had none. A sparkline of twelve cells then travels as twelve
// numbers a series, not an hour of them.
func (v View) Downsample(cells int) View {
	if cells <= 0 || cells >= v.Points {
		return v
	}
	slots := v.Points
	reduce := func(s Series) Series {
		if s == nil {
			return nil
		}
		return Reduce(s, slots, cells)
	}
	out := v
	out.Points, out.StepSeconds = cells, v.StepSeconds*float64(slots)/float64(cells)
	out.Deployments = make([]DeploymentHistory, len(v.Deployments))
	for i, d := range v.Deployments {
		out.Deployments[i] = DeploymentHistory{Name: d.Name, RequestsPerS: reduce(d.RequestsPerS), TTFBP50: reduce(d.TTFBP50), TTFBP99: reduce(d.TTFBP99),
			Running: reduce(d.Running), Waiting: reduce(d.Waiting), KVCacheUsage: reduce(d.KVCacheUsage), Ready: reduce(d.Ready), Wanted: reduce(d.Wanted)}
	}
	out.Nodes = make([]NodeHistory, len(v.Nodes))
	for i, n := range v.Nodes {
		out.Nodes[i] = NodeHistory{Name: n.Name, Self: n.Self, MemoryPct: reduce(n.MemoryPct), UtilPct: reduce(n.UtilPct)}
	}
	return out
}

// Reduce is s, placed at the right of slots points (the newest last), in
// cells points: each the largest reading of its share, NaN where the
// share had none.
func Reduce(s Series, slots, cells int) Series {
	out := make(Series, cells)
	for i := range out {
		out[i] = math.NaN()
	}
	if slots <= 0 || cells <= 0 {
		return out
	}
	off := slots - len(s)
	for i, x := range s {
		if math.IsNaN(x) {
			continue
		}
		c := min(max(off+i, 0)*cells/slots, cells-1)
		if math.IsNaN(out[c]) || x > out[c] {
			out[c] = x
		}
	}
	return out
}

// View returns the series with this node and up to busiest others.
func (r *Recorder) View(busiest int) View {
	r.mu.Lock()
	defer r.mu.Unlock()
	v := View{Node: r.cfg.Self, StepSeconds: r.cfg.Step.Seconds(), Points: r.cfg.Points, End: r.last, Since: r.started, Collecting: r.n < MinPoints,
		Deployments: []DeploymentHistory{}, Nodes: []NodeHistory{}}
	for _, name := range slices.Sorted(maps.Keys(r.deps)) {
		ring := r.deps[name]
		d := DeploymentHistory{Name: name, Running: r.floats(ring.running), Waiting: r.floats(ring.waiting), KVCacheUsage: r.floats(ring.kv),
			Ready: r.floats(ring.ready), Wanted: r.floats(ring.wanted)}
		if r.cfg.Traffic != nil {
			d.RequestsPerS, d.TTFBP50, d.TTFBP99 = r.floats(ring.rate), r.floats(ring.p50), r.floats(ring.p99)
		}
		v.Deployments = append(v.Deployments, d)
	}
	if ring := r.nodes[r.cfg.Self]; ring != nil {
		v.Nodes = append(v.Nodes, NodeHistory{Name: r.cfg.Self, Self: true, MemoryPct: r.pcts(ring.mem), UtilPct: r.pcts(ring.util)})
	}
	for _, name := range r.busiest(busiest) {
		ring := r.nodes[name]
		v.Nodes = append(v.Nodes, NodeHistory{Name: name, MemoryPct: r.pcts(ring.mem), UtilPct: r.pcts(ring.util)})
	}
	return v
}

// recent is how many newest points rank the busiest nodes: a minute.
const recent = 6

// busiest names up to k nodes other than this one, the highest mean
// utilisation over the recent points first, then memory, then name.
func (r *Recorder) busiest(k int) []string {
	type score struct {
		name      string
		util, mem float64
	}
	var all []score
	for name, ring := range r.nodes {
		if name == r.cfg.Self {
			continue
		}
		all = append(all, score{name, r.recentMean(ring.util), r.recentMean(ring.mem)})
	}
	slices.SortFunc(all, func(a, b score) int {
		return cmp.Or(cmp.Compare(b.util, a.util), cmp.Compare(b.mem, a.mem), cmp.Compare(a.name, b.name))
	})
	out := make([]string, 0, min(k, len(all)))
	for _, s := range all[:min(k, len(all))] {
		out = append(out, s.name)
	}
	return out
}

// recentMean is the mean of a ring's recent points with a reading, -1
// without any.
func (r *Recorder) recentMean(ring []uint8) float64 {
	sum, n := 0, 0
	for k := 1; k <= min(recent, r.n); k++ {
		if v := ring[(r.n-k)%r.cfg.Points]; v != missingPct {
			sum += int(v)
			n++
		}
	}
	if n == 0 {
		return -1
	}
	return float64(sum) / float64(n)
}

// order walks the ring's taken points oldest first.
func (r *Recorder) order(yield func(int) bool) {
	count := min(r.n, r.cfg.Points)
	for k := count; k >= 1; k-- {
		if !yield((r.n - k) % r.cfg.Points) {
			return
		}
	}
}

func (r *Recorder) floats(ring []float32) Series {
	out := make(Series, 0, min(r.n, r.cfg.Points))
	for i := range r.order {
		out = append(out, float64(ring[i]))
	}
	return out
}

func (r *Recorder) pcts(ring []uint8) Series {
	out := make(Series, 0, min(r.n, r.cfg.Points))
	for i := range r.order {
		v := math.NaN()
		if ring[i] != missingPct {
			v = float64(ring[i])
		}
		out = append(out, v)
	}
	return out
}

// Pattern is the route of the history endpoint.
const Pattern = "GET /v1/history"

// ServeHTTP answers GET /v1/history[?busiest=N][&cells=C]: open like the
// page, which draws from it; cells=C gives each series in C points
// (Downsample), as top asks.
func (r *Recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	busiest := DefaultBusiest
	if q := req.URL.Query().Get("busiest"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil || n < 0 || n > MaxBusiest {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "busiest " + strconv.Quote(q) + ": want a number of nodes from 0 to " + strconv.Itoa(MaxBusiest)})
			return
		}
		busiest = n
	}
	cells := 0
	if q := req.URL.Query().Get("cells"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil || n < 1 || n > r.cfg.Points {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "cells " + strconv.Quote(q) + ": want a number of points a series from 1 to " + strconv.Itoa(r.cfg.Points)})
			return
		}
		cells = n
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(r.View(busiest).Downsample(cells))
}
