package scenarios

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/llmgw/llmgw/probes/sockets"
	"github.com/llmgw/llmgw/supervisor/status"
)

// cond is one check over the observers: true when it holds everywhere,
// else a description of what was seen instead.
type cond func(obs []*node) (bool, string)

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
		if j, ok := gangRank(row); ok && j > 0 {
			continue // a gang member above rank 0 serves no HTTP; its gang is reached through rank 0
		}
		if row.URL == "" {
			return false, row.ShardID + " has a valid lease but no engine URL (runtime " + r.cfg.runtime + " runs no engines)"
		}
		tried++
		if msg := r.wrongListener(row); msg != "" {
			return false, msg
		}
		if err := r.chat(r.ctx, row); err != nil {
			return false, row.ShardID + ": chat completion failed: " + err.Error()
		}
		// The engine's port is no door of its own: without the engine's
		// key it refuses, so only whoever derives the key (a gateway, this
		// runner) reaches it.
		var ae *apiError
		if err := r.callWith(r.ctx, "GET", strings.TrimRight(row.URL, "/")+"/v1/models", nil, "", nil); !errors.As(err, &ae) || ae.Code != http.StatusUnauthorized {
			return false, fmt.Sprintf("%s: /v1/models without the engine's key answered %v, want HTTP 401", row.ShardID, err)
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
	procs := engineProcs(r.binaryPaths()...)
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

// shardRows are n's /v1/shards rows of shard, less the copies its node is
// stopping: a condition is about the copies the plan counts on.
func (r *runner) shardRows(n *node, shard string) ([]shardRow, error) {
	var rows []shardRow
	if err := r.get(r.ctx, n, "/v1/shards", &rows); err != nil {
		return nil, fmt.Errorf("%s: %w", n.name, err)
	}
	var out []shardRow
	for _, row := range rows {
		if row.ShardID == shard && row.Reason != status.ReasonNotPlanned {
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
	if _, ok := engineProcs(r.binaryPaths()...)[row.PID]; ok {
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
	procs := engineProcs(r.binaryPaths()...)
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

// gangRank is a shard's rank in its gang ("<replica>-s<j>"); false for a
// replica of one shard.
func gangRank(row shardRow) (int, bool) {
	rest, ok := strings.CutPrefix(row.ShardID, row.ReplicaID+"-s")
	if !ok {
		return 0, false
	}
	j, err := strconv.Atoi(rest)
	return j, err == nil
}

// condAdapter: every observer sees LoRA adapter name registered on want
// ready replicas of its deployment (0: on none, or no deployment has it).
func (r *runner) condAdapter(obs []*node, name string, want int) (bool, string) {
	deps, errs := fetchAll[[]deploymentInfo](r.ctx, r, obs, "/v1/deployments")
	if err := firstErr(obs, errs); err != nil {
		return false, err.Error()
	}
	for i := range obs {
		got, why := 0, ""
		for _, d := range deps[i] {
			for _, a := range d.AdapterStatus {
				if a.Name == name {
					got = len(a.Replicas)
					if len(a.Errors) > 0 {
						why = "; " + strings.Join(a.Errors, "; ")
					}
				}
			}
		}
		if got != want {
			return false, fmt.Sprintf("%s sees adapter %s on %d ready replicas, want %d%s", obs[i].name, name, got, want, why)
		}
	}
	return true, ""
}
