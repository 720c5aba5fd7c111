package history

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 12, 4, 1, 0, 0, 0, time.UTC)

// world is a read model a test changes between samples.
type world struct {
	mu      sync.Mutex
	deps    []status.DeploymentInfo
	shards  []status.ShardInfo
	members []status.MemberInfo
}

func (w *world) Deployments(time.Time) []status.DeploymentInfo {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deps
}

func (w *world) Shards(time.Time) []status.ShardInfo {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.shards
}

func (w *world) Members() []status.MemberInfo {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.members
}

func gpuNode(name string, usedGiB uint64, utils ...int) status.MemberInfo {
	m := status.MemberInfo{Name: name, State: gossip.StateAlive}
	for i, u := range utils {
		m.GPUs = append(m.GPUs, placement.GPU{Index: i, MemoryTotal: 80 << 30, MemoryUsed: usedGiB << 30})
		m.Telemetry.GPUs = append(m.Telemetry.GPUs, gossip.GPUTelemetry{Index: i, UtilPct: u})
	}
	return m
}

func loaded(dep string, running, waiting, kv float64) status.ShardInfo {
	return status.ShardInfo{ShardID: dep + "-0", Deployment: dep, Load: gossip.ShardLoad{Running: running, Waiting: waiting, KVCacheUsage: kv, ScrapedAt: t0}}
}

func same(a, b Series) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] && !(math.IsNaN(a[i]) && math.IsNaN(b[i])) {
			return false
		}
	}
	return true
}

var x = math.NaN()

// Each sample adds one point to every series: the gateway's rate and
// TTFB per step, the engines' load as their records say, a node's GPU
// memory and mean utilisation; a point without a reading is NaN (null in
// JSON), and a deployment without requests has a zero rate, not a gap.
func TestSamplesFollowTheReadModelAndTheGateway(t *testing.T) {
	clk := clock.NewFake(t0)
	w := &world{deps: []status.DeploymentInfo{{Deployment: placement.Deployment{Name: "chat", Replicas: 2}, Ready: 1}}, members: []status.MemberInfo{gpuNode("n1", 40, 50, 70)}}
	var traffic []Traffic
	r := New(Config{Self: "n1", Clock: clk, Points: 4, Status: func() Reading { return w },
		Traffic: func(window time.Duration) []Traffic {
			if window != DefaultStep {
				t.Errorf("traffic asked over %s, want the step", window)
			}
			return traffic
		}})
	if v := r.View(4); !v.Collecting || len(v.Deployments) != 0 || !v.Since.Equal(t0) {
		t.Fatalf("before any sample: %+v", v)
	}
	r.Sample() // no engine reading, no request
	clk.Advance(DefaultStep)
	traffic = []Traffic{{Deployment: "chat", Rate: 2.5, TTFBP50: 40 * time.Millisecond, TTFBP99: 300 * time.Millisecond}}
	w.shards = []status.ShardInfo{loaded("chat", 3, 1, 0.25)}
	w.members = []status.MemberInfo{gpuNode("n1", 60, 90, 100)}
	r.Sample()
	v := r.View(4)
	if v.Collecting || !v.End.Equal(t0.Add(DefaultStep)) || v.Points != 4 || v.StepSeconds != 10 {
		t.Fatalf("after two samples: collecting %v, end %s, points %d, step %g", v.Collecting, v.End, v.Points, v.StepSeconds)
	}
	d := v.Deployments[0]
	for _, c := range []struct {
		name      string
		got, want Series
	}{
		{"requests/s", d.RequestsPerS, Series{0, 2.5}},
		{"ttfb p50", d.TTFBP50, Series{x, 0.04}},
		{"ttfb p99", d.TTFBP99, Series{x, 0.3}},
		{"running", d.Running, Series{x, 3}},
		{"waiting", d.Waiting, Series{x, 1}},
		{"kv", d.KVCacheUsage, Series{x, 0.25}},
		{"replicas ready", d.Ready, Series{1, 1}},
		{"replicas wanted", d.Wanted, Series{2, 2}},
		{"n1 memory", v.Nodes[0].MemoryPct, Series{50, 75}},
		{"n1 utilisation", v.Nodes[0].UtilPct, Series{60, 95}},
	} {
		// float32 storage: compare at its precision.
		got := make(Series, len(c.got))
		for i, g := range c.got {
			got[i] = float64(float32(g))
			if !math.IsNaN(g) {
				got[i] = math.Round(g*1e4) / 1e4
			}
		}
		if !same(got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	b, err := json.Marshal(v.Deployments[0].TTFBP50)
	if err != nil || string(b) != "[null,0.04]" {
		t.Errorf("TTFB p50 as JSON = %s, %v; want [null,0.04]", b, err)
	}
	var back Series
	if err := json.Unmarshal(b, &back); err != nil || len(back) != 2 || !math.IsNaN(back[0]) || back[1] != 0.04 {
		t.Errorf("read back %v, %v", back, err)
	}
}

// The rings keep Points points: older ones are overwritten, and the
// series come back oldest first.
func TestRingsKeepTheLastPoints(t *testing.T) {
	clk := clock.NewFake(t0)
	w := &world{deps: []status.DeploymentInfo{{Deployment: placement.Deployment{Name: "chat"}}}}
	r := New(Config{Self: "n1", Clock: clk, Points: 3, Status: func() Reading { return w }})
	for i := range 5 {
		w.shards = []status.ShardInfo{loaded("chat", float64(i), 0, 0)}
		r.Sample()
		clk.Advance(DefaultStep)
	}
	d := r.View(0).Deployments[0]
	if !same(d.Running, Series{2, 3, 4}) {
		t.Errorf("running = %v, want the last three points oldest first [2 3 4]", d.Running)
	}
	if d.RequestsPerS != nil || d.TTFBP50 != nil {
		t.Errorf("a node without a gateway has request series: %v %v", d.RequestsPerS, d.TTFBP50)
	}
	// A deployment removed keeps its last points until a whole window
	// passed without it.
	w.deps, w.shards = nil, nil
	r.Sample()
	r.Sample()
	if got := r.View(0).Deployments; len(got) != 1 || !same(got[0].Running, Series{4, x, x}) {
		t.Errorf("after chat was removed: %+v", got)
	}
	r.Sample()
	if got := r.View(0).Deployments; len(got) != 0 {
		t.Errorf("a window after chat was removed its series are still there: %+v", got)
	}
}

// The view has this node first and then the busiest others by
// utilisation over the last minute, never more than asked; nodes without
// GPUs have no series.
func TestViewHasThisNodeAndTheBusiest(t *testing.T) {
	clk := clock.NewFake(t0)
	w := &world{members: []status.MemberInfo{
		gpuNode("a", 10, 5), gpuNode("b", 10, 90), gpuNode("c", 70, 40), gpuNode("d", 10, 40), gpuNode("self", 1, 0),
		{Name: "cpu-only", State: gossip.StateAlive}, func() status.MemberInfo { m := gpuNode("gone", 80, 100); m.State = gossip.StateDead; return m }(),
	}}
	r := New(Config{Self: "self", Clock: clk, Status: func() Reading { return w }})
	for range 3 {
		r.Sample()
	}
	var names []string
	for _, n := range r.View(3).Nodes {
		names = append(names, fmt.Sprintf("%s:%v", n.Name, n.Self))
	}
	if got := strings.Join(names, " "); got != "self:true b:false c:false d:false" {
		t.Errorf("nodes = %s; want self, then b (90%%), c (40%%, more memory than d), d", got)
	}
}

// Run takes a point at once and one every step of its clock.
func TestRunSamplesEveryStep(t *testing.T) {
	clk := clock.NewFake(t0)
	w := &world{members: []status.MemberInfo{gpuNode("n1", 8, 10)}}
	r := New(Config{Self: "n1", Clock: clk, Status: func() Reading { return w }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	points := func() int {
		v := r.View(0)
		if len(v.Nodes) == 0 {
			return 0
		}
		return len(v.Nodes[0].UtilPct)
	}
	if err := clk.BlockUntilContext(ctx, 1); err != nil { // the ticker
		t.Fatal(err)
	}
	for want := 1; want <= 3; want++ {
		if want > 1 {
			clk.Advance(DefaultStep)
		}
		testwait.Until(t, 10*time.Second, fmt.Sprintf("%d points", want), func() (bool, string) {
			return points() == want, fmt.Sprint(points(), " points")
		})
	}
}

// A bad busiest is refused with the field and its bounds; a good one
// answers JSON with null for gaps.
func TestEndpoint(t *testing.T) {
	w := &world{deps: []status.DeploymentInfo{{Deployment: placement.Deployment{Name: "chat"}}}}
	r := New(Config{Self: "n1", Clock: clock.NewFake(t0), Status: func() Reading { return w }})
	r.Sample()
	for _, q := range []string{"?busiest=-1", "?busiest=33", "?busiest=x"} {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/history"+q, nil))
		if rec.Code != 400 || !strings.Contains(rec.Body.String(), "want a number of nodes from 0 to 32") {
			t.Errorf("%s: %d %s", q, rec.Code, rec.Body)
		}
	}
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/history", nil))
	if body := rec.Body.String(); rec.Code != 200 || !strings.Contains(body, `"running":[null]`) || !strings.Contains(body, `"collecting":true`) {
		t.Errorf("GET /v1/history: %d %s", rec.Code, body)
	}
}

// cells=C reduces each series to C points, each the largest reading of
// its share of the hour's slots, a young node's points in the newest
// slots; a bad C is a 400 naming the bounds.
func TestDownsample(t *testing.T) {
	nan := math.NaN()
	v := View{Points: 6, StepSeconds: 10, Deployments: []DeploymentHistory{{Name: "chat",
		Running: Series{1, 5, nan, 2, 3, 0}, Waiting: Series{4, nan}}},
		Nodes: []NodeHistory{{Name: "n1", UtilPct: Series{10, 20, 30, 40, 50, 60}}}}
	got := v.Downsample(3)
	same := func(a, b Series) bool {
		if len(a) != len(b) {
			return false
		}
		for i := range a {
			if a[i] != b[i] && !(math.IsNaN(a[i]) && math.IsNaN(b[i])) {
				return false
			}
		}
		return true
	}
	d := got.Deployments[0]
	if got.Points != 3 || got.StepSeconds != 20 || !same(d.Running, Series{5, 2, 3}) || !same(d.Waiting, Series{nan, nan, 4}) ||
		!same(got.Nodes[0].UtilPct, Series{20, 40, 60}) || d.RequestsPerS != nil {
		t.Errorf("downsampled to 3: %+v", got)
	}
	if !same(v.Deployments[0].Running, Series{1, 5, nan, 2, 3, 0}) {
		t.Error("Downsample changed its input")
	}
	r := New(Config{Self: "n1", Clock: clock.NewFake(t0), Status: func() Reading { return &world{} }})
	for _, q := range []string{"?cells=0", "?cells=361", "?cells=x"} {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/history"+q, nil))
		if rec.Code != 400 || !strings.Contains(rec.Body.String(), "want a number of points a series from 1 to 360") {
			t.Errorf("%s: %d %s", q, rec.Code, rec.Body)
		}
	}
}
