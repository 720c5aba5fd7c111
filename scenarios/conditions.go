package scenarios

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/probes/sockets"
)

// cond is one check over the observers: true when it holds everywhere,
// else a description of what was seen instead.
type cond func(obs []*node) (bool, string)

// poll evaluates cond until it holds or within passes. The time returned is
// when the successful round finished: an upper bound on when it came true.
func (r *runner) poll(within time.Duration, c func() (bool, string)) (bool, string) {
	deadline := time.Now().Add(within)
	last := ""
	for {
		ok, detail := c()
		if ok {
			return true, ""
		}
		if detail != "" {
			last = detail
		}
		if time.Now().After(deadline) || r.ctx.Err() != nil {
			return false, last
		}
		clock.Sleep(r.ctx, r.pollEvery)
	}
}

func (r *runner) cmdWaitUntil(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	pos := d.positional()
	var within time.Duration
	if d.has("within") {
		var err error
		if within, err = d.duration("within", 0); err != nil {
			return "", time.Time{}, err
		}
	}
	if i := slices.Index(pos, "within"); i >= 0 {
		if within != 0 || i+1 >= len(pos) {
			return "", time.Time{}, usagef("wait-until: give the time once: within 10s")
		}
		v, err := time.ParseDuration(pos[i+1])
		if err != nil || v <= 0 {
			return "", time.Time{}, usagef("wait-until: within %q: want a duration such as 10s", pos[i+1])
		}
		within = v
		pos = slices.Delete(pos, i, i+2)
	}
	if within == 0 {
		return "", time.Time{}, usagef("wait-until: say how long: ... within 10s")
	}
	if len(pos) == 0 {
		return "", time.Time{}, usagef("wait-until: name a condition")
	}
	c, err := r.condition(d, pos[0], pos[1:])
	if err != nil {
		return "", time.Time{}, err
	}
	only, err := r.onNodes(d)
	if err != nil {
		return "", time.Time{}, err
	}
	hold, err := d.duration("for", 0)
	if err != nil {
		return "", time.Time{}, err
	}
	if hold >= within {
		return "", time.Time{}, usagef("wait-until: for=%v must be shorter than within %v", hold, within)
	}
	var since, first time.Time
	ok, last := r.poll(within, func() (bool, string) {
		obs := r.observers(only)
		if len(obs) == 0 {
			return false, "no node is up to ask"
		}
		start := time.Now()
		ok, detail := c(obs)
		switch {
		case !ok && !since.IsZero():
			detail = fmt.Sprintf("held for %.1fs, then: %s", time.Since(since).Seconds(), detail)
			since = time.Time{}
			return false, detail
		case !ok:
			return false, detail
		case since.IsZero():
			since, first = start, time.Now()
		}
		if time.Since(since) < hold {
			return false, ""
		}
		return true, ""
	})
	if !ok {
		if hold > 0 && !since.IsZero() {
			last = fmt.Sprintf("held only %.1fs of %v", time.Since(since).Seconds(), hold)
		}
		d.noEvent = true
		return fmt.Sprintf("timed out after %v: %s", within, last), time.Time{}, nil
	}
	// The event is when it came true, not when it had held long enough.
	return "ok", first, nil
}

// onNodes reads on=(...): nil means every observer.
func (r *runner) onNodes(d *directive) ([]*node, error) {
	refs, ok := d.list("on")
	if !ok {
		return nil, nil
	}
	ns, _, err := r.resolveNodes(r.ctx, refs)
	return ns, err
}

// condition builds the named condition from its arguments.
func (r *runner) condition(d *directive, name string, args []string) (cond, error) {
	wantArgs := func(n int, what string) error {
		if len(args) != n {
			return usagef("wait-until %s: want %s", name, what)
		}
		return nil
	}
	switch name {
	case "all-placed":
		return r.condAllPlaced, wantArgs(0, "no positional arguments")
	case "all-ready":
		return r.condAllReady, wantArgs(0, "no positional arguments")
	case "replicas":
		if err := wantArgs(1, "a deployment name: replicas NAME ready=N"); err != nil {
			return nil, err
		}
		if !d.has("ready") {
			return nil, usagef("wait-until replicas: want ready=N")
		}
		n, err := d.integer("ready", 0)
		if err != nil {
			return nil, err
		}
		return func(obs []*node) (bool, string) { return r.condReplicas(obs, args[0], n) }, nil
	case "members":
		want := map[string]int{}
		for _, k := range []string{"alive", "suspect", "dead", "left"} {
			if d.has(k) {
				v, err := d.integer(k, 0)
				if err != nil {
					return nil, err
				}
				want[k] = v
			}
		}
		if len(want) == 0 {
			return nil, usagef("wait-until members: want alive=N (or suspect=, dead=, left=)")
		}
		return func(obs []*node) (bool, string) { return r.condMembers(obs, want) }, wantArgs(0, "only key=value arguments")
	case "converged":
		return func(obs []*node) (bool, string) {
			ok, detail, _ := r.plansAgree(obs)
			return ok, detail
		}, wantArgs(0, "no positional arguments")
	case "single-holder":
		return func([]*node) (bool, string) {
			ok, detail, _ := r.singleHolder()
			return ok, detail
		}, wantArgs(0, "no positional arguments")
	case "serving":
		if err := wantArgs(1, "a deployment name: serving NAME"); err != nil {
			return nil, err
		}
		return func(obs []*node) (bool, string) { return r.condServing(obs[0], args[0]) }, nil
	case "restarts":
		if err := wantArgs(1, "SHARD>=N"); err != nil {
			return nil, err
		}
		shard, ns, ok := strings.Cut(args[0], ">=")
		n, err := strconv.Atoi(ns)
		if !ok || err != nil || shard == "" {
			return nil, usagef("wait-until restarts: want SHARD>=N, got %q", args[0])
		}
		return func(obs []*node) (bool, string) { return r.condRestarts(obs[0], shard, n) }, nil
	case "shard":
		if err := wantArgs(1, "a shard: shard SHARD status=S lease=L engine=running|gone"); err != nil {
			return nil, err
		}
		want := map[string]string{}
		for _, k := range []string{"status", "lease", "engine"} {
			if v, ok := d.kvRaw(k); ok {
				want[k] = v
			}
		}
		if e := want["engine"]; e != "" && e != "running" && e != "gone" {
			return nil, usagef("wait-until shard: engine=%s: want running or gone", e)
		}
		if len(want) == 0 {
			return nil, usagef("wait-until shard: say what to wait for: status=, lease= or engine=")
		}
		return func(obs []*node) (bool, string) { return r.condShard(obs[0], args[0], want) }, nil
	case "engines":
		if !d.has("running") {
			return nil, usagef("wait-until engines: want running=N")
		}
		n, err := d.integer("running", 0)
		if err != nil {
			return nil, err
		}
		return func([]*node) (bool, string) {
			if got := len(engineProcs(r.opts.Binary)); got != n {
				return false, fmt.Sprintf("%d engine processes run, want %d", got, n)
			}
			return true, ""
		}, wantArgs(0, "only running=N")
	case "shards-agree":
		return r.condShardsAgree, wantArgs(0, "no positional arguments")
	case "no-orphans":
		return func([]*node) (bool, string) {
			ok, detail, _ := r.noOrphans()
			return ok, detail
		}, wantArgs(0, "no positional arguments")
	}
	return nil, usagef("wait-until: unknown condition %q (have all-placed, all-ready, replicas, members, converged, single-holder, serving, restarts, shard, shards-agree, engines, no-orphans)", name)
}

func (r *runner) condAllPlaced(obs []*node) (bool, string) {
	deps, errs := fetchAll[[]deploymentInfo](r.ctx, r, obs, "/v1/deployments")
	if err := firstErr(obs, errs); err != nil {
		return false, err.Error()
	}
	for i, ds := range deps {
		for _, dep := range ds {
			if dep.Placed != dep.Replicas || len(dep.Why) > 0 {
				return false, fmt.Sprintf("%s: %s placed %d/%d %s", obs[i].name, dep.Name, dep.Placed, dep.Replicas, strings.Join(dep.Why, "; "))
			}
		}
	}
	return true, ""
}

func (r *runner) condAllReady(obs []*node) (bool, string) {
	deps, errs := fetchAll[[]deploymentInfo](r.ctx, r, obs, "/v1/deployments")
	if err := firstErr(obs, errs); err != nil {
		return false, err.Error()
	}
	for i, ds := range deps {
		for _, dep := range ds {
			if dep.Ready != dep.Replicas {
				return false, fmt.Sprintf("%s: %s ready %d/%d", obs[i].name, dep.Name, dep.Ready, dep.Replicas)
			}
		}
	}
	return true, ""
}

// condReplicas counts, on every observer, the replicas of name's current
// spec whose every shard has a valid lease on a node that really runs (the
// runner knows which it killed, stopped or froze: an observer that has not
// noticed yet does not count).
func (r *runner) condReplicas(obs []*node, name string, want int) (bool, string) {
	deps, errs := fetchAll[[]deploymentInfo](r.ctx, r, obs, "/v1/deployments")
	if err := firstErr(obs, errs); err != nil {
		return false, err.Error()
	}
	rows, errs := fetchAll[[]shardRow](r.ctx, r, obs, "/v1/shards")
	if err := firstErr(obs, errs); err != nil {
		return false, err.Error()
	}
	for i := range obs {
		var dep *deploymentInfo
		for j := range deps[i] {
			if deps[i][j].Name == name {
				dep = &deps[i][j]
			}
		}
		if dep == nil {
			if want == 0 {
				continue
			}
			return false, fmt.Sprintf("%s does not know %s", obs[i].name, name)
		}
		got := r.readyReplicas(*dep, rows[i])
		if got != want {
			return false, fmt.Sprintf("%s sees %d ready replicas of %s on running nodes, want %d", obs[i].name, got, name, want)
		}
	}
	return true, ""
}

func (r *runner) readyReplicas(dep deploymentInfo, rows []shardRow) int {
	pp := max(dep.PipelineParallel, 1)
	valid := map[string]int{}
	for _, row := range rows {
		if row.Deployment != dep.Name || row.SpecVersion != dep.SpecVersion || row.Lease != "valid" || row.Draining {
			continue
		}
		if n, ok := r.byName[row.Node]; !ok || !n.up() {
			continue
		}
		valid[row.ReplicaID]++
	}
	got := 0
	for _, c := range valid {
		if c >= pp {
			got++
		}
	}
	return got
}

func (r *runner) condMembers(obs []*node, want map[string]int) (bool, string) {
	infos, errs := fetchAll[clusterInfo](r.ctx, r, obs, "/v1/cluster")
	if err := firstErr(obs, errs); err != nil {
		return false, err.Error()
	}
	for i, ci := range infos {
		got := map[string]int{}
		for _, m := range ci.Members {
			got[m.State]++
		}
		for k, v := range want {
			if got[k] != v {
				return false, fmt.Sprintf("%s sees %s", obs[i].name, memberStates(ci))
			}
		}
	}
	return true, ""
}

func memberStates(ci clusterInfo) string {
	var parts []string
	for _, m := range ci.Members {
		parts = append(parts, m.Name+" "+m.State)
	}
	return strings.Join(parts, ", ")
}

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

// singleHolder compares the nodes' own records with the plan: every
// planned shard held by exactly one node, which is the planned one, and
// nothing else held. It asks every running node; a frozen one fails it.
func (r *runner) singleHolder() (bool, string, int) {
	var running []*node
	for _, n := range r.nodes {
		if n.isFrozen() {
			return false, n.name + " is frozen: what it holds is unknown", 0
		}
		if n.running() {
			running = append(running, n)
		}
	}
	if len(running) == 0 {
		return false, "no node is up", 0
	}
	ok, detail, plan := r.plansAgree(running)
	if !ok {
		return false, "plans differ: " + detail, 0
	}
	stats, errs := fetchAll[statusInfo](r.ctx, r, running, "/status.json")
	if err := firstErr(running, errs); err != nil {
		return false, err.Error(), 0
	}
	holders := map[string][]string{}
	for i, st := range stats {
		for _, s := range st.Record.Shards {
			k := s.ShardID + "@" + s.SpecVersion
			holders[k] = append(holders[k], running[i].name)
		}
	}
	var problems []string
	planned := map[string]bool{}
	for _, a := range plan.Plan.Assignments {
		k := a.ShardID + "@" + a.SpecVersion
		planned[k] = true
		h := holders[k]
		switch {
		case len(h) == 0:
			problems = append(problems, a.ShardID+" held by no node")
		case len(h) > 1:
			problems = append(problems, a.ShardID+" held by "+strings.Join(h, " and "))
		case h[0] != a.Node:
			problems = append(problems, a.ShardID+" held by "+h[0]+", planned on "+a.Node)
		}
	}
	for k, h := range holders {
		if !planned[k] {
			shard, _, _ := strings.Cut(k, "@")
			problems = append(problems, shard+" still held by "+strings.Join(h, " and ")+" outside the plan")
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return false, strings.Join(problems, "; "), 0
	}
	return true, "", len(plan.Plan.Assignments)
}

// condShardsAgree: every observer's /v1/shards lists the same shards on
// the same nodes with the same lease, status and draining flag.
func (r *runner) condShardsAgree(obs []*node) (bool, string) {
	// /v1/shards is drawn from each node's last plan: a plan that has not
	// seen the newest deployments would agree with an equally old one.
	plans, errs := fetchAll[rawPlan](r.ctx, r, obs, "/v1/plan")
	if err := firstErr(obs, errs); err != nil {
		return false, err.Error()
	}
	if detail := sameInputs(obs, plans); detail != "" {
		return false, detail
	}
	rows, errs := fetchAll[[]shardRow](r.ctx, r, obs, "/v1/shards")
	if err := firstErr(obs, errs); err != nil {
		return false, err.Error()
	}
	key := func(rs []shardRow) string {
		var b strings.Builder
		for _, x := range rs {
			fmt.Fprintf(&b, "%s@%s on %s: %s %s draining=%v; ", x.ShardID, x.SpecVersion, x.Node, x.Lease, x.Status, x.Draining)
		}
		return b.String()
	}
	first := key(rows[0])
	for i := 1; i < len(rows); i++ {
		if k := key(rows[i]); k != first {
			return false, fmt.Sprintf("%s sees %s; %s sees %s", obs[0].name, first, obs[i].name, k)
		}
	}
	return true, ""
}

func (r *runner) condServing(n *node, name string) (bool, string) {
	var rows []shardRow
	if err := r.get(r.ctx, n, "/v1/shards", &rows); err != nil {
		return false, n.name + ": " + err.Error()
	}
	tried := 0
	for _, row := range rows {
		if row.Deployment != name || row.Lease != "valid" {
			continue
		}
		if row.URL == "" {
			return false, row.ShardID + " has a valid lease but no engine URL (runtime " + r.cfg.runtime + " runs no engines)"
		}
		tried++
		if msg := r.wrongListener(row); msg != "" {
			return false, msg
		}
		if err := r.chat(r.ctx, row.URL); err != nil {
			return false, row.ShardID + ": chat completion failed: " + err.Error()
		}
	}
	if tried == 0 {
		return false, "no replica of " + name + " has a valid lease"
	}
	return true, ""
}

// wrongListener checks that the engine answering on a shard's URL is the
// process its record names: engines of several nodes on one host share one
// port space, and a crashed engine's port may be answered by another
// shard's engine of the same model.
func (r *runner) wrongListener(row shardRow) string {
	if row.PID == 0 {
		return ""
	}
	u, err := url.Parse(row.URL)
	if err != nil {
		return ""
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return ""
	}
	procs := engineProcs(r.opts.Binary)
	pids := make([]int, 0, len(procs))
	for pid := range procs {
		pids = append(pids, pid)
	}
	owner, _ := sockets.Host().OwnerAmong(port, pids)
	switch {
	case owner == 0:
		return fmt.Sprintf("%s: no engine of this run listens on port %d", row.ShardID, port)
	case owner != row.PID:
		return fmt.Sprintf("%s: port %d is answered by another engine, not by the one its record names", row.ShardID, port)
	}
	return ""
}

func (r *runner) shardRows(n *node, shard string) ([]shardRow, error) {
	var rows []shardRow
	if err := r.get(r.ctx, n, "/v1/shards", &rows); err != nil {
		return nil, fmt.Errorf("%s: %w", n.name, err)
	}
	var out []shardRow
	for _, row := range rows {
		if row.ShardID == shard && row.Reason != "not in the plan: being stopped" {
			out = append(out, row)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no shard " + shard + " in /v1/shards")
	}
	return out, nil
}

func (r *runner) condRestarts(n *node, shard string, want int) (bool, string) {
	rows, err := r.shardRows(n, shard)
	if err != nil {
		return false, err.Error()
	}
	got := 0
	for _, row := range rows {
		got = max(got, row.Restarts)
	}
	if got < want {
		return false, fmt.Sprintf("%s has %d restarts (status %s)", shard, got, rows[0].Status)
	}
	return true, ""
}

func (r *runner) engineState(row shardRow) string {
	if row.PID == 0 {
		return "gone"
	}
	if _, ok := engineProcs(r.opts.Binary)[row.PID]; ok {
		return "running"
	}
	return "gone"
}

func (r *runner) condShard(n *node, shard string, want map[string]string) (bool, string) {
	rows, err := r.shardRows(n, shard)
	if err != nil {
		return false, err.Error()
	}
	for _, row := range rows {
		got := map[string]string{"status": row.Status, "lease": row.Lease, "engine": r.engineState(row)}
		for k, v := range want {
			if got[k] != v {
				return false, fmt.Sprintf("%s: status %s, lease %s, engine %s", shard, row.Status, row.Lease, got["engine"])
			}
		}
	}
	return true, ""
}

// noOrphans: every engine process of this run has its pid in the record of
// a running node. It returns how many engines run.
func (r *runner) noOrphans() (bool, string, int) {
	var running []*node
	for _, n := range r.nodes {
		if n.isFrozen() {
			return false, n.name + " is frozen: what it holds is unknown", 0
		}
		if n.running() {
			running = append(running, n)
		}
	}
	stats, errs := fetchAll[statusInfo](r.ctx, r, running, "/status.json")
	if err := firstErr(running, errs); err != nil {
		return false, err.Error(), 0
	}
	held := map[int]bool{}
	for _, st := range stats {
		for _, s := range st.Record.Shards {
			if s.PID > 0 {
				held[s.PID] = true
			}
		}
	}
	procs := engineProcs(r.opts.Binary)
	orphans := 0
	for pid := range procs {
		if !held[pid] {
			orphans++
		}
	}
	if orphans > 0 {
		return false, fmt.Sprintf("%d of %d engine processes are held by no running node", orphans, len(procs)), len(procs)
	}
	return true, "", len(procs)
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
