package scenarios

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

func (r *runner) cmdExpect(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	what, err := d.nextPos("what to expect")
	if err != nil {
		return "", time.Time{}, err
	}
	if what == "request-loop" {
		// The loop's own record: no node need answer.
		name, err := d.nextPos("request loop name")
		if err != nil {
			return "", time.Time{}, err
		}
		out, err := r.loopVerdict(d, name)
		return out, time.Time{}, err
	}
	if what == "log" {
		// The node's log file: it need not answer.
		out, err := r.expectLog(d)
		return out, time.Time{}, err
	}
	only, err := r.onNodes(d)
	if err != nil {
		return "", time.Time{}, err
	}
	obs := r.observers(only)
	if len(obs) == 0 {
		return "", time.Time{}, errors.New("no node is up to ask")
	}
	switch what {
	case "models":
		out, err := perNode(obs, func(n *node) (string, error) { return r.modelsTable(n) })
		return out, time.Time{}, err
	case "shards":
		cols := []string{"shard", "deployment", "lease", "status", "draining"}
		if c, ok := d.list("columns"); ok {
			for _, col := range c {
				if !slices.Contains(strings.Split(shardColumns, ","), col) {
					return "", time.Time{}, usagef("expect shards: unknown column %q (have %s)", col, shardColumns)
				}
			}
			cols = c
		}
		out, err := perNode(obs, func(n *node) (string, error) { return r.shardsTable(n, cols) })
		return out, time.Time{}, err
	case "pd-legs":
		out, err := r.expectPDLegs(d, obs)
		return out, time.Time{}, err
	case "pd-outcomes":
		out, err := r.expectPDOutcomes(d, obs)
		return out, time.Time{}, err
	case "members":
		out, err := perNode(obs, r.membersTable)
		return out, time.Time{}, err
	case "plan-agrees":
		ok, detail, p := r.plansAgree(obs)
		if !ok {
			return detail, time.Time{}, nil
		}
		return fmt.Sprintf("%d nodes agree on the plan: %d assignments, %d unplaced", len(obs), len(p.Plan.Assignments), len(p.Plan.Unplaced)), time.Time{}, nil
	case "single-holder":
		ok, detail, n := r.singleHolder()
		if !ok {
			return detail, time.Time{}, nil
		}
		return fmt.Sprintf("every planned shard is held by exactly one node, the planned one (%d shards)", n), time.Time{}, nil
	case "no-orphans":
		ok, detail, n := r.noOrphans()
		if !ok {
			return detail, time.Time{}, nil
		}
		return fmt.Sprintf("no orphan engines (%d engine processes, all held)", n), time.Time{}, nil
	case "pids-unchanged":
		s, err := r.sinceSnapshot(d)
		if err != nil {
			return "", time.Time{}, err
		}
		out, err := r.pidsUnchanged(obs[0], s)
		return out, time.Time{}, err
	case "plan-diff":
		s, err := r.sinceSnapshot(d)
		if err != nil {
			return "", time.Time{}, err
		}
		var p planInfo
		if err := r.get(r.ctx, obs[0], "/v1/plan", &p); err != nil {
			return "", time.Time{}, err
		}
		lines := diffAssignments(s.plan, p.Plan.Assignments)
		if len(lines) == 0 {
			return "no change", time.Time{}, nil
		}
		return strings.Join(lines, "\n"), time.Time{}, nil
	}
	return "", time.Time{}, usagef("expect: unknown %q (have models, shards, members, plan-agrees, single-holder, no-orphans, pids-unchanged, plan-diff, request-loop, log)", what)
}

// perNode renders f for every node; when all agree it prints the output
// once, else once per node under its name.
func perNode(obs []*node, f func(n *node) (string, error)) (string, error) {
	outs := make([]string, len(obs))
	same := true
	for i, n := range obs {
		o, err := f(n)
		if err != nil {
			o = "error: " + err.Error()
		}
		outs[i] = o
		same = same && o == outs[0]
	}
	if same {
		return outs[0], nil
	}
	var b strings.Builder
	for i, n := range obs {
		fmt.Fprintf(&b, "as seen by %s:\n%s\n", n.name, outs[i])
	}
	return b.String(), nil
}

func table(header []string, rows [][]string) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, row := range rows {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	tw.Flush()
	return b.String()
}

func (r *runner) modelsTable(n *node) (string, error) {
	var deps []deploymentInfo
	if err := r.get(r.ctx, n, "/v1/deployments", &deps); err != nil {
		return "", err
	}
	if len(deps) == 0 {
		return "no deployments", nil
	}
	sort.Slice(deps, func(i, j int) bool { return deps[i].Name < deps[j].Name })
	var rows [][]string
	var why []string
	for _, dp := range deps {
		rows = append(rows, []string{dp.Name, dp.Model, dp.Engine, strconv.Itoa(dp.Replicas), strconv.Itoa(dp.TensorParallel),
			strconv.Itoa(dp.PipelineParallel), strconv.Itoa(dp.Placed), strconv.Itoa(dp.Ready)})
		for _, w := range dp.Why {
			why = append(why, "why "+dp.Name+": "+w)
		}
	}
	out := table([]string{"NAME", "MODEL", "ENGINE", "REPLICAS", "TP", "PP", "PLACED", "READY"}, rows)
	if len(why) > 0 {
		out += strings.Join(why, "\n")
	}
	return out, nil
}

// shardColumns are the columns expect shards can print, comma-separated.
const shardColumns = "shard,replica,deployment,node,gpus,lease,status,restarts,draining,engine,reason,role"

func (r *runner) shardsTable(n *node, cols []string) (string, error) {
	var rows []shardRow
	if err := r.get(r.ctx, n, "/v1/shards", &rows); err != nil {
		return "", err
	}
	if len(rows) == 0 {
		return "no shards", nil
	}
	var out [][]string
	for _, row := range rows {
		var line []string
		for _, c := range cols {
			v := ""
			switch c {
			case "shard":
				v = row.ShardID
			case "replica":
				v = row.ReplicaID
			case "deployment":
				v = row.Deployment
			case "node":
				v = row.Node
			case "gpus":
				v = gpuList(row.GPUs)
			case "lease":
				v = row.Lease
			case "status":
				v = row.Status
			case "restarts":
				v = strconv.Itoa(row.Restarts)
			case "draining":
				v = "-"
				if row.Draining {
					v = "draining"
				}
			case "engine":
				v = r.engineState(row)
			case "reason":
				v = row.Reason
			case "role":
				v = row.Role
			}
			if v == "" {
				v = "-"
			}
			line = append(line, v)
		}
		out = append(out, line)
	}
	header := make([]string, len(cols))
	for i, c := range cols {
		header[i] = strings.ToUpper(c)
	}
	return table(header, out), nil
}

func (r *runner) membersTable(n *node) (string, error) {
	var ci clusterInfo
	if err := r.get(r.ctx, n, "/v1/cluster", &ci); err != nil {
		return "", err
	}
	var rows [][]string
	for _, m := range ci.Members {
		rows = append(rows, []string{m.Name, m.State, strconv.Itoa(len(m.GPUs))})
	}
	return table([]string{"NAME", "STATE", "GPUS"}, rows), nil
}

// snapshot is what `snapshot NAME` remembers.
type snapshot struct {
	plan []assignment
	pids map[string]int // shard@spec -> engine pid
}

func (r *runner) cmdSnapshot(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	name, err := d.nextPos("snapshot name")
	if err != nil {
		return "", time.Time{}, err
	}
	obs := r.observers(nil)
	if len(obs) == 0 {
		return "", time.Time{}, errors.New("no node is up to ask")
	}
	var p planInfo
	if err := r.get(r.ctx, obs[0], "/v1/plan", &p); err != nil {
		return "", time.Time{}, err
	}
	var rows []shardRow
	if err := r.get(r.ctx, obs[0], "/v1/shards", &rows); err != nil {
		return "", time.Time{}, err
	}
	s := &snapshot{plan: p.Plan.Assignments, pids: map[string]int{}}
	for _, row := range rows {
		if row.PID > 0 {
			s.pids[row.ShardID+"@"+row.SpecVersion] = row.PID
		}
	}
	r.snapshots[name] = s
	return fmt.Sprintf("snapshot %s: %d assignments, %d engine pids", name, len(s.plan), len(s.pids)), time.Time{}, nil
}

func (r *runner) sinceSnapshot(d *directive) (*snapshot, error) {
	name, err := d.need("since")
	if err != nil {
		return nil, err
	}
	s, ok := r.snapshots[name]
	if !ok {
		return nil, usagef("no snapshot %q (take one with: snapshot %s)", name, name)
	}
	return s, nil
}

func (r *runner) pidsUnchanged(n *node, s *snapshot) (string, error) {
	if len(s.pids) == 0 {
		return "no engine pids in the snapshot to compare", nil
	}
	var rows []shardRow
	if err := r.get(r.ctx, n, "/v1/shards", &rows); err != nil {
		return "", err
	}
	now := map[string]shardRow{}
	for _, row := range rows {
		if row.PID > 0 {
			now[row.ShardID+"@"+row.SpecVersion] = row
		}
	}
	var changed []string
	keys := make([]string, 0, len(s.pids))
	for k := range s.pids {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		shard, _, _ := strings.Cut(k, "@")
		row, ok := now[k]
		switch {
		case !ok:
			changed = append(changed, shard+": no engine now")
		case row.PID != s.pids[k]:
			changed = append(changed, fmt.Sprintf("%s: engine replaced (restarts %d)", shard, row.Restarts))
		case r.engineState(row) != "running":
			changed = append(changed, shard+": engine no longer runs")
		}
	}
	if len(changed) > 0 {
		return strings.Join(changed, "\n"), nil
	}
	return fmt.Sprintf("all %d engines kept their pids", len(keys)), nil
}
