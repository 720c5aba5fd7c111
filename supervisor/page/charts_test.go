package page

import (
	"fmt"
	"image/png"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/history"
	"github.com/llmgw/llmgw/supervisor/status"
)

// chartWorld is a read model for the history recorder that a test moves
// along: two deployments (one whose engine exports no KV cache usage)
// and GPU nodes, n busy ones among them.
type chartWorld struct {
	mu   sync.Mutex
	step int
	n    int
}

func (w *chartWorld) Deployments(time.Time) []status.DeploymentInfo {
	w.mu.Lock()
	defer w.mu.Unlock()
	// chat autoscales: its target steps between 1 and 3, and its
	// replicas follow a step later.
	wanted := 1 + (w.step/30)%3
	ready := 1 + (max(w.step-1, 0)/30)%3
	return []status.DeploymentInfo{{Deployment: placement.Deployment{Name: "chat", Replicas: wanted}, Ready: ready},
		{Deployment: placement.Deployment{Name: "tiny-cpp", Replicas: 1}, Ready: 1}}
}

func (w *chartWorld) Shards(now time.Time) []status.ShardInfo {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := float64(w.step)
	return []status.ShardInfo{
		{ShardID: "chat-0", Deployment: "chat", Load: gossip.ShardLoad{Running: 2 + k, Waiting: k / 2, KVCacheUsage: 0.1 * float64(w.step%10), ScrapedAt: now}},
		{ShardID: "tiny-cpp-0", Deployment: "tiny-cpp", Load: gossip.ShardLoad{Running: 1, ScrapedAt: now, Unknown: []string{gossip.ReadingKVCache}}},
	}
}

func (w *chartWorld) Members() []status.MemberInfo {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []status.MemberInfo
	for i := range w.n {
		name := fmt.Sprintf("gpu-%03d", i)
		if i == 0 {
			name = "self"
		}
		m := status.MemberInfo{Name: name, State: gossip.StateAlive}
		for g := range 8 {
			m.GPUs = append(m.GPUs, placement.GPU{Index: g, MemoryTotal: 141 << 30, MemoryUsed: uint64(10+(i*7+w.step*3)%120) << 30})
			m.Telemetry.GPUs = append(m.Telemetry.GPUs, gossip.GPUTelemetry{Index: g, UtilPct: (i*13 + w.step*5) % 100})
		}
		out = append(out, m)
	}
	return out
}

// chartServer serves the page with a history of samples points taken
// every 10 s of fake time, and a gateway that sent chat's requests.
func chartServer(t *testing.T, nodes int, samples int) *httptest.Server {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 12, 4, 1, 0, 0, 0, time.UTC))
	w := &chartWorld{n: nodes}
	var mu sync.Mutex
	step := 0
	rec := history.New(history.Config{Self: "self", Clock: clk, Status: func() history.Reading { return w },
		Traffic: func(time.Duration) []history.Traffic {
			mu.Lock()
			defer mu.Unlock()
			k := time.Duration(step)
			return []history.Traffic{{Deployment: "chat", Rate: 1 + math.Sin(float64(step)/3), TTFBP50: 30*time.Millisecond + k*time.Millisecond, TTFBP99: 200*time.Millisecond + 10*k*time.Millisecond}}
		}})
	for i := range samples {
		mu.Lock()
		step = i
		mu.Unlock()
		w.mu.Lock()
		w.step = i
		w.mu.Unlock()
		rec.Sample()
		clk.Advance(history.DefaultStep)
	}
	src := fixedSource{snap: status.Build(status.Input{Self: "self", Now: clk.Now()}), now: clk.Now()}
	srv := httptest.NewServer(Handler(src, Options{History: rec, Traffic: func() []Traffic { return nil }}))
	t.Cleanup(srv.Close)
	return srv
}

type fixedSource struct {
	snap *status.Snapshot
	now  time.Time
}

func (f fixedSource) Status() *status.Snapshot { return f.snap }
func (f fixedSource) Now() time.Time           { return f.now }

// seenChart is one chart as drawn: its title, the points of each line,
// and the text it shows instead of lines.
type seenChart struct {
	title  string
	points []int
	empty  string
}

// chartsIn reads the charts of each row of table id, by the row's first
// cell.
func chartsIn(t *testing.T, doc *html.Node, id string) (names []string, charts map[string][]seenChart) {
	t.Helper()
	tab := findID(doc, id)
	if tab == nil {
		t.Fatalf("no table #%s", id)
	}
	charts = map[string][]seenChart{}
	each(tab, "tr", func(tr *html.Node) {
		var tds []*html.Node
		each(tr, "td", func(td *html.Node) { tds = append(tds, td) })
		if len(tds) != 2 {
			return
		}
		name := strings.TrimSuffix(textOf(tds[0]), " this node")
		names = append(names, name)
		each(tds[1], "div", func(d *html.Node) {
			if attr(d, "class") != "chart" {
				return
			}
			var c seenChart
			each(d, "span", func(s *html.Node) {
				if c.title == "" {
					c.title = textOf(s)
				}
			})
			each(d, "path", func(p *html.Node) {
				c.points = append(c.points, strings.Count(attr(p, "d"), "M")+strings.Count(attr(p, "d"), "L"))
			})
			each(d, "div", func(e *html.Node) {
				if attr(e, "class") == "empty" {
					c.empty = textOf(e)
				}
			})
			charts[name] = append(charts[name], c)
		})
	})
	return names, charts
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func fetchPage(t *testing.T, url string) *html.Node {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	doc, err := html.Parse(strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// checkCharts: after a minute, every chart of chat has lines with a point
// per sample; tiny-cpp's KV chart says why it has none; this node's GPU
// charts come first, then the four busiest of the others, never all.
func checkCharts(t *testing.T, doc *html.Node, points int) {
	t.Helper()
	_, deps := chartsIn(t, doc, "charts")
	titles := []string{"requests/s", "TTFB p50 · p99", "running · waiting", "KV cache", "replicas ready · wanted"}
	want := map[string][]string{"chat": titles, "tiny-cpp": titles}
	for dep, titles := range want {
		cs := deps[dep]
		if len(cs) != len(titles) {
			t.Fatalf("%s: %d charts (%+v), want %v", dep, len(cs), cs, titles)
		}
		for i, c := range cs {
			if c.title != titles[i] {
				t.Errorf("%s chart %d is %q, want %q", dep, i, c.title, titles[i])
			}
			if dep == "tiny-cpp" && (c.title == "KV cache" || c.title == "TTFB p50 · p99") {
				if c.empty == "" || len(c.points) != 0 {
					t.Errorf("tiny-cpp's %s chart: %+v, want a reason instead of lines", c.title, c)
				}
				continue
			}
			if c.empty != "" || len(c.points) == 0 {
				t.Errorf("%s's %s chart has no line: %+v", dep, c.title, c)
			}
			for _, n := range c.points {
				if n != points {
					t.Errorf("%s's %s chart: a line of %d points, want %d", dep, c.title, n, points)
				}
			}
		}
	}
	if c := deps["tiny-cpp"][3].empty; c != "no engine exports it" {
		t.Errorf("tiny-cpp's KV chart says %q", c)
	}
	names, nodes := chartsIn(t, doc, "gpu-charts")
	if len(names) != 1+chartNodes || names[0] != "self" {
		t.Errorf("GPU charts for %v, want self and the %d busiest", names, chartNodes)
	}
	for _, n := range names {
		for _, c := range nodes[n] {
			if len(c.points) != 1 || c.points[0] != points {
				t.Errorf("%s's %s chart: %+v, want one line of %d points", n, c.title, c, points)
			}
		}
	}
}

// A minute of points (six) with 500 nodes: charts for two deployments
// and five nodes.
func TestChartsAfterAMinute(t *testing.T) {
	checkCharts(t, fetchPage(t, chartServer(t, 500, 6).URL), 6)
}

// A node whose recorder took its first point only: the charts are there,
// saying "collecting".
func TestChartsOfANodeJustStartedSayCollecting(t *testing.T) {
	srv := chartServer(t, 3, 1)
	_, deps := chartsIn(t, fetchPage(t, srv.URL), "charts")
	_, nodes := chartsIn(t, fetchPage(t, srv.URL), "gpu-charts")
	n := 0
	for _, cs := range []map[string][]seenChart{deps, nodes} {
		for name, list := range cs {
			for _, c := range list {
				n++
				if !strings.HasPrefix(c.empty, "collecting since 01:00:00Z") || len(c.points) != 0 {
					t.Errorf("%s's %s chart: %+v, want collecting", name, c.title, c)
				}
			}
		}
	}
	if n != 2*5+3*2 {
		t.Errorf("%d charts, want 16 (two deployments, three nodes)", n)
	}
}

// The charts in a real browser: headless Chromium renders an hour-old
// node's charts and a just-started node's, with no console message.
// Screenshots go to $LLMGW_PAGE_OUT when set.
func TestChartsInChromium(t *testing.T) {
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (apt-get install -y chromium; .ci/run installs it): the charts are not checked in a browser")
	}
	out := os.Getenv("LLMGW_PAGE_OUT")
	if out == "" {
		out = t.TempDir()
	}
	srv := chartServer(t, 12, history.DefaultPoints+20) // past a full hour: the rings wrapped
	dom, _ := chromium(t, bin, srv.URL, "--window-size=1400,1000", "--dump-dom")
	doc, err := html.Parse(strings.NewReader(dom))
	if err != nil {
		t.Fatal(err)
	}
	checkCharts(t, doc, history.DefaultPoints)
	file := filepath.Join(out, "charts.png")
	chromium(t, bin, srv.URL+"#charts", "--window-size=1400,1600", "--screenshot="+file)
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if cfg, err := png.DecodeConfig(f); err != nil || cfg.Width != 1400 {
		t.Errorf("screenshot %s: %+v, %v", file, cfg, err)
	}
	fresh := chartServer(t, 3, 1)
	dom, _ = chromium(t, bin, fresh.URL, "--window-size=1400,1000", "--dump-dom")
	if !strings.Contains(dom, "collecting since") {
		t.Errorf("the just-started node's page does not say collecting:\n%s", dom)
	}
}

// A gap in a series breaks its line, and a point alone between gaps is
// drawn as a dot; the newest point is at the right edge.
func TestPathBreaksAtGaps(t *testing.T) {
	nan := math.NaN()
	got := path(history.Series{1, 2, nan, 4, nan, 2}, 7, 4)
	want := "M30.0 27.5L60.0 19.0M120.0 2.0h0.1M180.0 19.0h0.1"
	if got != want {
		t.Errorf("path = %q, want %q", got, want)
	}
}
