package scenarios

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
)

// dashboardFile is the Grafana dashboard the repository ships.
const dashboardFile = "../deploy/grafana/llmgw.json"

// mayBeEmpty are the dashboard's expressions that a healthy cluster under
// steady traffic leaves without data, each with why. Every other one must
// return data.
var mayBeEmpty = map[string]string{
	`code!~"2.."`:         "errors: none in a healthy cluster",
	`lease="lapsed"`:      "lapsed leases: none in a healthy cluster",
	`llmgw_gpu_faulted`:   "no faulted GPU on simulated ones",
	`llmgw_driver_faults`: "driver faults: none on simulated GPUs",
}

// A real Prometheus (the system's package), pointed at one node's
// discovery endpoint, scrapes a two-node cluster serving one deployment
// under steady traffic, plain and streamed; then every PromQL expression
// of the dashboard, its Grafana variables substituted ($__rate_interval:
// 1m, the others: .+), must parse, name only metrics the scrape has, and,
// but for the few listed in mayBeEmpty, return data.
func TestDashboardAgainstARealPrometheus(t *testing.T) {
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("no prometheus on PATH (Debian's prometheus package; CI installs it)")
	}
	exprs := dashboardExprs(t, dashboardFile)
	bin, err := filepath.Abs(binary(t))
	if err != nil {
		t.Fatal(err)
	}
	if why := unmetRequirement(bin, []string{"process-runtime"}); why != "" {
		t.Skip(why)
	}
	res := Result{Name: "prometheus"}
	r, cleanup, err := newRunner(t.Context(), Options{Binary: bin, Out: logWriter{t}}, commandTable(), &res)
	t.Cleanup(cleanup)
	if err != nil {
		t.Fatal(err)
	}
	r.mustDo(t, "cluster nodes=2 runtime=process", "2 nodes up (n1..n2) on 127.0.0.1, 4xH100-80GB each, profile local, lease-ttl 3s, runtime process")
	r.mustDo(t, "place chat model=demo/tiny-chat engine=fake replicas=2 args=(--token-delay,5ms)", "ok")
	r.mustDo(t, "wait-until replicas chat ready=2 within 30s", "ok")

	// Traffic through both gateways until the test ends: plain and
	// streamed chats, so the latency histograms fill.
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	t.Cleanup(func() { stop(); <-done })
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			n := r.nodes[i%len(r.nodes)]
			body := fmt.Sprintf(`{"model":"chat","stream":%t,"max_tokens":8,"messages":[{"role":"user","content":"hello number %d"}]}`, i%2 == 0, i)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.gateway()+"/v1/chat/completions", strings.NewReader(body))
			if err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}()

	api := startPrometheus(t, prom, r.nodes[0].api()+"/v1/prometheus/targets")
	// Two nodes and two engines, each scraped a few times, and the
	// traffic counted by the gateways.
	testwait.Until(t, 60*time.Second, "prometheus scrapes 4 targets, up, with traffic", func() (bool, string) {
		up, err := promQuery(api, `sum(up)`)
		if err != nil || len(up) != 1 || up[0] != "4" {
			return false, fmt.Sprint("up: ", up, err)
		}
		rate, err := promQuery(api, `sum(rate(llmgw_gateway_requests_total[1m])) > 0`)
		return err == nil && len(rate) == 1, fmt.Sprint("requests rate: ", rate, err)
	})
	// Engine load reaches a node's /metrics at its next scrape of the
	// engine, and rates want two samples in their 1m window: poll until
	// every expression names only scraped metrics and has data, or fail
	// with what is still missing. A parse error fails at once.
	testwait.Until(t, 90*time.Second, "every dashboard expression names scraped metrics and has data", func() (bool, string) {
		names := promNames(t, api)
		var faults []string
		for _, e := range exprs {
			for _, m := range metricNames(e) {
				if !names[m] {
					faults = append(faults, "metric "+m+" is not in the scrape: "+e)
				}
			}
			vals, err := promQuery(api, e)
			if err != nil {
				t.Fatalf("dashboard expression %s: %v", e, err)
			}
			if len(vals) == 0 && !allowedEmpty(e) {
				faults = append(faults, "no data: "+e)
			}
		}
		return len(faults) == 0, strings.Join(faults, "\n")
	})
}

func allowedEmpty(expr string) bool {
	for k := range mayBeEmpty {
		if strings.Contains(expr, k) {
			return true
		}
	}
	return false
}

// dashboardExprs reads every target expression of a Grafana dashboard
// (rows' nested panels too), with Grafana's variables substituted as a
// Prometheus query needs them: $__rate_interval as 1m, every other
// variable as .+ (the dashboard only uses them in =~ matchers).
func dashboardExprs(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Panels  []json.RawMessage `json:"panels"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	}
	var walk func(raw []json.RawMessage) []string
	walk = func(raw []json.RawMessage) []string {
		var out []string
		for _, r := range raw {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			for _, tg := range p.Targets {
				out = append(out, tg.Expr)
			}
			out = append(out, walk(p.Panels)...)
		}
		return out
	}
	var d panel
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	vars := regexp.MustCompile(`\$\{?[A-Za-z_]+\}?`)
	var exprs []string
	for _, e := range walk(d.Panels) {
		e = strings.ReplaceAll(e, "$__rate_interval", "1m")
		exprs = append(exprs, vars.ReplaceAllString(e, ".+"))
	}
	if len(exprs) == 0 {
		t.Fatalf("%s: no expressions", file)
	}
	return exprs
}

// promqlWords are PromQL's keywords and aggregation modifiers: words in
// an expression that are not metric names.
var promqlWords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
	"group_right": true, "bool": true, "and": true, "or": true, "unless": true, "offset": true, "inf": true, "nan": true}

// metricNames lists the metric names an expression reads: the words that
// are not functions (followed by "("), keywords, label names (inside
// {...} or the lists of by/without), strings or numbers.
func metricNames(expr string) []string {
	s := regexp.MustCompile(`"(\\.|[^"\\])*"`).ReplaceAllString(expr, `""`)
	s = regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(s, " ")
	s = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`).ReplaceAllString(s, " ")
	s = regexp.MustCompile(`\[[^\]]*\]`).ReplaceAllString(s, " ")
	var out []string
	for _, m := range regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`).FindAllString(s, -1) {
		if strings.HasSuffix(m, "(") || promqlWords[strings.ToLower(m)] {
			continue
		}
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// startPrometheus runs prometheus on a port and data dir of its own,
// discovering its targets at sd (http_sd_configs), scraping every second.
// It returns the base URL of its HTTP API.
func startPrometheus(t *testing.T, bin, sd string) string {
	t.Helper()
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	conf := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: llmgw
    http_sd_configs:
      - url: %q
        refresh_interval: 1s
`, sd)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", log.String())
		}
	})
	api := "http://" + addr
	testwait.Until(t, 30*time.Second, "prometheus ready", func() (bool, string) {
		resp, err := http.Get(api + "/-/ready")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return api
}

// promQuery runs an instant query and returns the values of its result
// (a vector's samples, or a scalar's one), or the error Prometheus gives
// (a parse error names the expression's fault).
func promQuery(api, expr string) ([]string, error) {
	resp, err := http.Get(api + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	if out.Status != "success" {
		return nil, fmt.Errorf("%s", out.Error)
	}
	switch out.Data.ResultType {
	case "vector":
		var v []struct {
			Value [2]any `json:"value"`
		}
		if err := json.Unmarshal(out.Data.Result, &v); err != nil {
			return nil, err
		}
		var vals []string
		for _, s := range v {
			vals = append(vals, fmt.Sprint(s.Value[1]))
		}
		return vals, nil
	case "scalar":
		var s [2]any
		if err := json.Unmarshal(out.Data.Result, &s); err != nil {
			return nil, err
		}
		return []string{fmt.Sprint(s[1])}, nil
	}
	return nil, fmt.Errorf("result type %s", out.Data.ResultType)
}

// promNames is every metric name Prometheus has a series of.
func promNames(t *testing.T, api string) map[string]bool {
	t.Helper()
	resp, err := http.Get(api + "/api/v1/label/__name__/values")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Data []string `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, n := range out.Data {
		names[n] = true
	}
	return names
}
