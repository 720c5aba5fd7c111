package page

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/llmgw/llmgw/supervisor/history"
)

// Chart geometry, in SVG user units (the page draws them at this size).
const (
	chartW = 180
	chartH = 38
	// chartPad keeps a line at 0 or at the top inside the box.
	chartPad = 2
)

// chart is one small inline SVG of the last hour: its lines, the scale's
// top, the newest values, or why it has none.
type chart struct {
	Title string
	// Now is the newest reading(s), Top the scale's top.
	Now, Top string
	Lines    []chartLine
	// Empty, when set, is shown instead of the lines ("collecting ...").
	Empty string
}

type chartLine struct {
	// Class picks the colour (.l0, .l1); D is the SVG path.
	Class, D string
}

type depCharts struct {
	Name   string
	Charts []chart
}

type nodeCharts struct {
	Name   string
	Self   bool
	Charts []chart
}

// charts is the page's "last hour" part.
type charts struct {
	// Note says whose view the charts are and over what.
	Note        string
	Deployments []depCharts
	Nodes       []nodeCharts
}

// minSpan is the fewest points a chart spans: a node that started a
// minute ago draws its minute over a sixth of the chart, not a 60th.
const minSpan = 60

// buildCharts draws v: every deployment, and the nodes v has (this node
// and the busiest few, never all of them). The charts span the rings'
// hour once the node has run that long, and until then what it has, at
// least minSpan points.
func buildCharts(v history.View) charts {
	taken := 0
	for _, d := range v.Deployments {
		taken = max(taken, len(d.Running))
	}
	for _, n := range v.Nodes {
		taken = max(taken, len(n.MemoryPct))
	}
	slots := min(max(taken, minSpan), max(v.Points, 2))
	step := time.Duration(v.StepSeconds * float64(time.Second))
	c := charts{Note: fmt.Sprintf("the last %s as %s saw it, a point every %s", duration(time.Duration(slots)*step), v.Node, step)}
	empty := ""
	if v.Collecting {
		empty = "collecting since " + v.Since.UTC().Format("15:04:05Z")
	}
	for _, d := range v.Deployments {
		dc := depCharts{Name: d.Name}
		if d.RequestsPerS != nil {
			dc.Charts = append(dc.Charts,
				lineChart("requests/s", empty, slots, rateText, false, d.RequestsPerS),
				lineChart("TTFB p50 · p99", or(empty, noneIf(d.TTFBP50, "no answered request")), slots, secondsText, false, d.TTFBP50, d.TTFBP99))
		}
		dc.Charts = append(dc.Charts,
			lineChart("running · waiting", or(empty, noneIf(d.Running, "no engine reading")), slots, countText, false, d.Running, d.Waiting),
			lineChart("KV cache", or(empty, noneIf(d.KVCacheUsage, "no engine exports it")), slots, fractionText, true, d.KVCacheUsage),
			lineChart("replicas ready · wanted", or(empty, noneIf(d.Wanted, "no reading")), slots, countText, false, d.Ready, d.Wanted))
		c.Deployments = append(c.Deployments, dc)
	}
	for _, n := range v.Nodes {
		c.Nodes = append(c.Nodes, nodeCharts{Name: n.Name, Self: n.Self, Charts: []chart{
			lineChart("GPU memory", or(empty, noneIf(n.MemoryPct, "no reading")), slots, fractionText, true, scaled(n.MemoryPct, 0.01)),
			lineChart("GPU utilisation", or(empty, noneIf(n.UtilPct, "no reading")), slots, fractionText, true, scaled(n.UtilPct, 0.01)),
		}})
	}
	return c
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// noneIf is why a chart has no line: its first series has no point.
func noneIf(s history.Series, why string) string {
	if s.Points() == 0 {
		return why
	}
	return ""
}

func scaled(s history.Series, f float64) history.Series {
	out := make(history.Series, len(s))
	for i, v := range s {
		out[i] = v * f
	}
	return out
}

// lineChart draws series over slots points, the newest at the right edge,
// so that a node that started ten minutes ago fills the right sixth.
// unit scales fix the top at 1 (fractions); otherwise the top is the
// largest point.
func lineChart(title, empty string, slots int, text func(float64) string, unit bool, series ...history.Series) chart {
	c := chart{Title: title, Empty: empty}
	var nows []string
	for _, s := range series {
		if v, ok := s.Last(); ok {
			nows = append(nows, text(v))
		} else {
			nows = append(nows, "-")
		}
	}
	c.Now = strings.Join(nows, " · ")
	if empty != "" {
		return c
	}
	top := 1.0
	if !unit {
		top = 0
		for _, s := range series {
			for _, v := range s {
				if !math.IsNaN(v) {
					top = max(top, v)
				}
			}
		}
		if top <= 0 {
			top = 1 // all zero: a flat line at the bottom
		}
	}
	c.Top = text(top)
	for i, s := range series {
		c.Lines = append(c.Lines, chartLine{Class: "l" + strconv.Itoa(i), D: path(s, slots, top)})
	}
	return c
}

// path is an SVG path through s's points, broken where a point has no
// reading; a point alone between gaps is a dot.
func path(s history.Series, slots int, top float64) string {
	if slots < 2 {
		slots = 2
	}
	var b strings.Builder
	off := slots - len(s)
	pen := false
	for i, v := range s {
		if math.IsNaN(v) {
			pen = false
			continue
		}
		x := float64(chartW) * float64(off+i) / float64(slots-1)
		y := chartPad + (chartH-2*chartPad)*(1-min(max(v/top, 0), 1))
		cmd := "L"
		if !pen {
			cmd = "M"
		}
		fmt.Fprintf(&b, "%s%.1f %.1f", cmd, x, y)
		if !pen && (i+1 == len(s) || math.IsNaN(s[i+1])) {
			b.WriteString("h0.1") // a lone point: round caps make it a dot
		}
		pen = true
	}
	return b.String()
}

func rateText(v float64) string {
	if v >= 10 {
		return fmt.Sprintf("%.0f/s", v)
	}
	return fmt.Sprintf("%.2g/s", v)
}

func secondsText(v float64) string {
	switch {
	case v >= 1:
		return fmt.Sprintf("%.2g s", v)
	case v >= 0.001:
		return fmt.Sprintf("%.0f ms", v*1000)
	}
	return fmt.Sprintf("%.2g ms", v*1000)
}

func countText(v float64) string { return strconv.FormatFloat(math.Round(v), 'f', 0, 64) }

func fractionText(v float64) string { return fmt.Sprintf("%.0f%%", 100*v) }
