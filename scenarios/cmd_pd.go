package scenarios

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Prefill/decode disaggregation, as the engines and the gateways count it.
//
//	expect pd-legs DEPLOYMENT
//
// reads the engines' own counters (the fake engine's: prefill legs it
// served, KV it loaded from a prefill, prompts it computed itself for want
// of parameters) and the gateways' llmgw_gateway_pd_requests_total, and
// says whether every disaggregated request had one prefill leg and one KV
// load, and that no decode computed a prompt of its own.
//
//	expect pd-outcomes DEPLOYMENT
//
// lists the outcomes other than disaggregated the alive gateways counted
// ("none", or their names); the counts go to the summary's notes.

// The fake engine's P/D counters (supervisor/fakeengine's Metric names).
const (
	metricPrefillLegs = "fakeengine_kv_prefill_requests_total"
	metricKVLoads     = "fakeengine_kv_transfers_total"
	metricRecomputed  = "fakeengine_kv_recomputed_requests_total"
	metricPDRequests  = "llmgw_gateway_pd_requests_total"
)

func (r *runner) expectPDLegs(d *directive, obs []*node) (string, error) {
	dep, err := d.nextPos("deployment")
	if err != nil {
		return "", err
	}
	var rows []shardRow
	if err := r.get(r.ctx, obs[0], "/v1/shards", &rows); err != nil {
		return "", err
	}
	var legs, loads, recomputed float64
	engines := 0
	for _, row := range rows {
		if row.Deployment != dep || row.URL == "" || row.Draining {
			continue
		}
		fams, err := r.scrape(row.URL + "/metrics")
		if err != nil {
			return "", fmt.Errorf("%s's engine: %w", row.ShardID, err)
		}
		engines++
		switch row.Role {
		case "prefill":
			legs += sum(fams[metricPrefillLegs])
		case "decode":
			loads += sum(fams[metricKVLoads])
			recomputed += sum(fams[metricRecomputed])
		}
	}
	outcomes, err := r.pdOutcomes(obs, dep)
	if err != nil {
		return "", err
	}
	done := outcomes["disaggregated"]
	r.res.Notes = append(r.res.Notes, fmt.Sprintf("pd-legs %s: %d engines; gateways counted %v disaggregated; prefill legs %v, decode KV loads %v, decode prompts computed alone %v",
		dep, engines, done, legs, loads, recomputed))
	var out []string
	if done == 0 {
		out = append(out, "no request was disaggregated")
	}
	if legs == done {
		out = append(out, "prefill legs: one per disaggregated request")
	} else {
		out = append(out, fmt.Sprintf("prefill legs: %v for %v disaggregated requests", legs, done))
	}
	if loads == done {
		out = append(out, "decode KV loads from a prefill: one per disaggregated request")
	} else {
		out = append(out, fmt.Sprintf("decode KV loads from a prefill: %v for %v disaggregated requests", loads, done))
	}
	if recomputed == 0 {
		out = append(out, "decode prompts computed alone: none")
	} else {
		out = append(out, fmt.Sprintf("decode prompts computed alone: %v", recomputed))
	}
	return strings.Join(out, "\n"), nil
}

func (r *runner) expectPDOutcomes(d *directive, obs []*node) (string, error) {
	dep, err := d.nextPos("deployment")
	if err != nil {
		return "", err
	}
	outcomes, err := r.pdOutcomes(obs, dep)
	if err != nil {
		return "", err
	}
	var names, counts []string
	for _, o := range slices.Sorted(maps.Keys(outcomes)) {
		counts = append(counts, fmt.Sprintf("%s %v", o, outcomes[o]))
		if o != "disaggregated" && outcomes[o] > 0 {
			names = append(names, o)
		}
	}
	r.res.Notes = append(r.res.Notes, fmt.Sprintf("pd-outcomes %s at the alive gateways: %s", dep, strings.Join(counts, ", ")))
	if len(names) == 0 {
		return "other outcomes: none", nil
	}
	return "other outcomes: " + strings.Join(names, ", "), nil
}

// pdOutcomes sums the gateways' outcomes of a deployment's requests.
func (r *runner) pdOutcomes(obs []*node, dep string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, n := range obs {
		fams, err := r.scrape(n.api() + "/metrics")
		if err != nil {
			return nil, fmt.Errorf("%s's metrics: %w", n.name, err)
		}
		for _, m := range fams[metricPDRequests].GetMetric() {
			if label(m, "deployment") == dep {
				out[label(m, "outcome")] += m.GetCounter().GetValue()
			}
		}
	}
	return out, nil
}

// scrape reads a /metrics page into its families, by name.
func (r *runner) scrape(url string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := r.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	fams := map[string]*dto.MetricFamily{}
	dec := expfmt.NewDecoder(resp.Body, expfmt.ResponseFormat(resp.Header))
	for {
		mf := &dto.MetricFamily{}
		if err := dec.Decode(mf); errors.Is(err, io.EOF) {
			return fams, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", url, err)
		}
		fams[mf.GetName()] = mf
	}
}

// sum adds up every series of a counter family.
func sum(mf *dto.MetricFamily) float64 {
	total := 0.0
	for _, m := range mf.GetMetric() {
		total += m.GetCounter().GetValue()
	}
	return total
}

// label is a series' value of one label ("" without it).
func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
