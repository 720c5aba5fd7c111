package scenarios

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"strings"
)

type rawPlan struct {
	Deployments map[string]string `json:"deployments"`
	Current     bool              `json:"current"`
	Plan        json.RawMessage   `json:"plan"`
}

// plansAgree compares every observer's /v1/plan; it returns the agreed plan.
// Equal plans are not enough: right after a change every node may still
// hold the same old plan. So each plan must also be current (computed from
// every deployment its node knows) and computed from the same deployments
// as the others.
func (r *runner) plansAgree(obs []*node) (bool, string, *planInfo) {
	plans, errs := fetchAll[rawPlan](r.ctx, r, obs, "/v1/plan")
	if err := firstErr(obs, errs); err != nil {
		return false, err.Error(), nil
	}
	if detail := sameInputs(obs, plans); detail != "" {
		return false, detail, nil
	}
	var first bytes.Buffer
	_ = json.Compact(&first, plans[0].Plan)
	for i := 1; i < len(plans); i++ {
		var b bytes.Buffer
		_ = json.Compact(&b, plans[i].Plan)
		if !bytes.Equal(first.Bytes(), b.Bytes()) {
			return false, fmt.Sprintf("%s and %s have different plans: %s", obs[0].name, obs[i].name, planDiffText(plans[0].Plan, plans[i].Plan)), nil
		}
	}
	var p planInfo
	_ = json.Unmarshal([]byte(`{"plan":`+first.String()+`}`), &p)
	return true, "", &p
}

// sameInputs says why the observers' plans are not comparable yet, or "":
// a plan that has not seen every deployment its node knows, or two plans
// computed from different deployments.
func sameInputs(obs []*node, plans []rawPlan) string {
	for i, p := range plans {
		if !p.Current {
			return obs[i].name + " knows deployments its last plan has not seen yet"
		}
		if i > 0 && !maps.Equal(plans[0].Deployments, p.Deployments) {
			return fmt.Sprintf("%s and %s planned from different deployments: %v vs %v", obs[0].name, obs[i].name, plans[0].Deployments, p.Deployments)
		}
	}
	return ""
}

func planDiffText(a, b json.RawMessage) string {
	var pa, pb planInfo
	_ = json.Unmarshal([]byte(`{"plan":`+string(a)+`}`), &pa)
	_ = json.Unmarshal([]byte(`{"plan":`+string(b)+`}`), &pb)
	lines := diffAssignments(pa.Plan.Assignments, pb.Plan.Assignments)
	if len(pa.Plan.Unplaced) != len(pb.Plan.Unplaced) {
		lines = append(lines, fmt.Sprintf("unplaced %d vs %d", len(pa.Plan.Unplaced), len(pb.Plan.Unplaced)))
	}
	if len(lines) == 0 {
		return "same placements, other details differ (kept/draining flags or reasons)"
	}
	if len(lines) > 5 {
		lines = append(lines[:5], fmt.Sprintf("and %d more", len(lines)-5))
	}
	return strings.Join(lines, "; ")
}

// diffAssignments lists what changed from a to b: "+ shard on node gpus",
// "- shard on node", "~ shard node -> node".
func diffAssignments(a, b []assignment) []string {
	key := func(x assignment) string { return x.ShardID + "@" + x.SpecVersion }
	am, bm := map[string]assignment{}, map[string]assignment{}
	for _, x := range a {
		am[key(x)] = x
	}
	for _, x := range b {
		bm[key(x)] = x
	}
	var out []string
	for k, x := range bm {
		old, ok := am[k]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("+ %s on %s gpus %s", x.ShardID, x.Node, gpuList(x.GPUs)))
		case old.Node != x.Node || gpuList(old.GPUs) != gpuList(x.GPUs):
			out = append(out, fmt.Sprintf("~ %s %s gpus %s -> %s gpus %s", x.ShardID, old.Node, gpuList(old.GPUs), x.Node, gpuList(x.GPUs)))
		}
	}
	for k, x := range am {
		if _, ok := bm[k]; !ok {
			out = append(out, fmt.Sprintf("- %s on %s", x.ShardID, x.Node))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		fi, fj := strings.Fields(out[i]), strings.Fields(out[j])
		if fi[1] != fj[1] {
			return fi[1] < fj[1]
		}
		return out[i] < out[j]
	})
	return out
}

func gpuList(g []int) string {
	if len(g) == 0 {
		return "-"
	}
	contiguous := true
	for i := 1; i < len(g); i++ {
		contiguous = contiguous && g[i] == g[i-1]+1
	}
	if contiguous && len(g) > 2 {
		return fmt.Sprintf("%d-%d", g[0], g[len(g)-1])
	}
	s := make([]string, len(g))
	for i, v := range g {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}
