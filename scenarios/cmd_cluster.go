package scenarios

import (
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/llmgw/llmgw/probes/sockets"
)

func (r *runner) cmdCluster(d *directive) (string, time.Time, error) {
	if r.clusterStarted {
		return "", time.Time{}, usagef("cluster: one cluster per scenario")
	}
	count, err := d.integer("nodes", 0)
	if err != nil {
		return "", time.Time{}, err
	}
	if count < 1 {
		return "", time.Time{}, usagef("cluster: nodes= must be at least 1")
	}
	if r.cfg.gpus, err = d.str("gpus", "4xH100-80GB"); err != nil {
		return "", time.Time{}, err
	}
	if r.cfg.profile, err = d.str("profile", "local"); err != nil {
		return "", time.Time{}, err
	}
	if r.cfg.leaseTTL, err = d.duration("lease-ttl", 3*time.Second); err != nil {
		return "", time.Time{}, err
	}
	if r.cfg.runtime, err = d.str("runtime", "none"); err != nil {
		return "", time.Time{}, err
	}
	if r.cfg.logLevel, err = d.str("log-level", "info"); err != nil {
		return "", time.Time{}, err
	}
	if r.cfg.nodeFlags, err = readNodeFlags(d); err != nil {
		return "", time.Time{}, err
	}
	labels, _ := d.list("labels")
	binary, err := r.binaryKey(d)
	if err != nil {
		return "", time.Time{}, err
	}
	within, err := d.duration("within", 30*time.Second+time.Duration(count)*time.Second)
	if err != nil {
		return "", time.Time{}, err
	}
	network, err := d.str("net", "loopback")
	if err != nil {
		return "", time.Time{}, err
	}
	switch network {
	case "loopback":
	case "netns":
		if r.namespaces, err = newNetns(); err != nil {
			return "", time.Time{}, err
		}
	default:
		return "", time.Time{}, usagef("cluster: net=%s: want loopback or netns", network)
	}
	r.clusterStarted = true
	at := time.Now()
	// Polling every node costs CPU the nodes need: slower for big clusters.
	switch {
	case count >= 20:
		r.pollEvery = 250 * time.Millisecond
	case count >= 10:
		r.pollEvery = 100 * time.Millisecond
	}
	var nodes []*node
	for i := 1; i <= count; i++ {
		n, err := r.newNode(fmt.Sprintf("n%d", i), r.cfg.gpus, labels)
		if err != nil {
			return "", time.Time{}, err
		}
		n.setBinary(binary)
		nodes = append(nodes, n)
	}
	// The first node first, so the others find someone at once.
	if err := r.start(nodes[0]); err != nil {
		return "", time.Time{}, err
	}
	if err := r.waitHealthy(r.ctx, nodes[0], 15*time.Second); err != nil {
		return "", time.Time{}, err
	}
	for _, n := range nodes[1:] {
		if err := r.start(n); err != nil {
			return "", time.Time{}, err
		}
	}
	for _, n := range nodes[1:] {
		if err := r.waitHealthy(r.ctx, n, 15*time.Second); err != nil {
			return "", time.Time{}, err
		}
	}
	if ok, last := r.poll(within, func() (bool, string) { return r.condMembersAlive(nodes, count) }); !ok {
		return "", time.Time{}, fmt.Errorf("cluster did not form within %v: %s", within, last)
	}
	names := nodes[0].name
	if count > 1 {
		names += ".." + nodes[count-1].name
	}
	where := "on 127.0.0.1"
	if r.namespaces != nil {
		where = "each in its own network namespace"
	}
	if binary != currentBinary {
		where += ", binary " + binary
	}
	return fmt.Sprintf("%d nodes up (%s) %s, %s each, profile %s, lease-ttl %v, runtime %s%s", count, names, where, r.cfg.gpus, r.cfg.profile, r.cfg.leaseTTL, r.cfg.runtime,
		describeNodeFlags(r.cfg.nodeFlags)), at, nil
}

// condMembersAlive: every one of nodes sees want alive members with GPUs.
func (r *runner) condMembersAlive(nodes []*node, want int) (bool, string) {
	infos, errs := fetchAll[clusterInfo](r.ctx, r, nodes, "/v1/cluster")
	if err := firstErr(nodes, errs); err != nil {
		return false, err.Error()
	}
	for i, ci := range infos {
		alive := 0
		for _, m := range ci.Members {
			if m.State == "alive" && len(m.GPUs) > 0 {
				alive++
			}
		}
		if alive != want {
			return false, fmt.Sprintf("%s sees %d alive members with GPUs, want %d", nodes[i].name, alive, want)
		}
	}
	return true, ""
}

func (r *runner) cmdAddNode(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	name, err := d.nextPos("node name")
	if err != nil {
		return "", time.Time{}, err
	}
	gpus, err := d.str("gpus", r.cfg.gpus)
	if err != nil {
		return "", time.Time{}, err
	}
	labels, _ := d.list("labels")
	within, err := d.duration("within", 30*time.Second)
	if err != nil {
		return "", time.Time{}, err
	}
	binary, err := r.binaryKey(d)
	if err != nil {
		return "", time.Time{}, err
	}
	n, err := r.newNode(name, gpus, labels)
	if err != nil {
		return "", time.Time{}, err
	}
	n.setBinary(binary)
	at := time.Now()
	if err := r.start(n); err != nil {
		return "", time.Time{}, err
	}
	if err := r.waitHealthy(r.ctx, n, 15*time.Second); err != nil {
		return "", time.Time{}, err
	}
	ok, last := r.poll(within, func() (bool, string) {
		obs := r.observers(nil)
		infos, errs := fetchAll[clusterInfo](r.ctx, r, obs, "/v1/cluster")
		if err := firstErr(obs, errs); err != nil {
			return false, err.Error()
		}
		for i, ci := range infos {
			seen := false
			for _, m := range ci.Members {
				seen = seen || (m.Name == name && m.State == "alive" && len(m.GPUs) > 0)
			}
			if !seen {
				return false, obs[i].name + " does not see " + name + " alive yet"
			}
		}
		return true, ""
	})
	if !ok {
		return "", time.Time{}, fmt.Errorf("%s did not join within %v: %s", name, within, last)
	}
	desc := name + " joined (" + gpus
	if len(labels) > 0 {
		desc += ", labels " + strings.Join(labels, ",")
	}
	return desc + ")", at, nil
}

func (r *runner) cmdKill(d *directive) (string, time.Time, error) {
	mode, err := d.str("engines", "keep")
	if err != nil {
		return "", time.Time{}, err
	}
	if mode != "keep" && mode != "kill" {
		return "", time.Time{}, usagef("kill: engines=%s: want keep (an agent crash) or kill (the whole node dies)", mode)
	}
	ns, labels, err := r.targetNodes(d)
	if err != nil {
		return "", time.Time{}, err
	}
	var out []string
	var at time.Time
	for i, n := range ns {
		var engines []int
		if mode == "kill" {
			engines = r.enginesOf(n)
		}
		at = time.Now()
		if err := n.signal(syscall.SIGKILL); err != nil {
			out = append(out, "error: "+err.Error())
			continue
		}
		for _, pid := range engines {
			if pg, err := syscall.Getpgid(pid); err == nil && pg == pid {
				_ = syscall.Kill(-pid, syscall.SIGKILL)
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if !n.waitExit(5 * time.Second) {
			out = append(out, "error: "+n.name+" did not die")
			continue
		}
		if mode == "kill" {
			out = append(out, "killed "+labels[i]+" and its engines (SIGKILL: the whole node is gone)")
		} else {
			out = append(out, "killed "+labels[i]+" (SIGKILL to the agent; engines keep running)")
		}
	}
	return strings.Join(out, "\n"), at, nil
}

// enginesOf lists the engine processes of a node: those its record names
// and those that are its agent's children.
func (r *runner) enginesOf(n *node) []int {
	pids := map[int]bool{}
	var st statusInfo
	if n.up() && r.get(r.ctx, n, "/status.json", &st) == nil {
		for _, s := range st.Record.Shards {
			if s.PID > 0 {
				pids[s.PID] = true
			}
		}
	}
	agent := n.pid()
	for pid := range engineProcs(r.binaryPaths()...) {
		if sockets.Host().Parent(pid) == agent {
			pids[pid] = true
		}
	}
	var out []int
	for pid := range pids {
		out = append(out, pid)
	}
	return out
}

func (r *runner) cmdStop(d *directive) (string, time.Time, error) {
	ns, labels, err := r.targetNodes(d)
	if err != nil {
		return "", time.Time{}, err
	}
	at := time.Now()
	var out []string
	for _, n := range ns {
		if err := n.signal(syscall.SIGTERM); err != nil {
			out = append(out, "error: "+err.Error())
		}
	}
	for i, n := range ns {
		if !n.waitExit(20 * time.Second) {
			out = append(out, "error: "+n.name+" did not exit within 20s of SIGTERM")
			continue
		}
		out = append(out, fmt.Sprintf("stopped %s (SIGTERM, %s)", labels[i], n.exitStatus()))
	}
	return strings.Join(out, "\n"), at, nil
}

func (r *runner) cmdRestart(d *directive) (string, time.Time, error) {
	within, err := d.duration("within", 15*time.Second)
	if err != nil {
		return "", time.Time{}, err
	}
	binary, err := r.binaryKey(d)
	if err != nil {
		return "", time.Time{}, err
	}
	ns, labels, err := r.targetNodes(d)
	if err != nil {
		return "", time.Time{}, err
	}
	var out []string
	for _, n := range ns {
		if n.running() {
			if n.isFrozen() {
				_ = n.signal(syscall.SIGCONT)
			}
			_ = n.signal(syscall.SIGTERM)
			if !n.waitExit(20 * time.Second) {
				return "", time.Time{}, fmt.Errorf("%s did not exit within 20s of SIGTERM", n.name)
			}
		}
	}
	at := time.Now()
	for _, n := range ns {
		if d.has("binary") {
			// An upgrade (or downgrade): the operator installed another
			// binary before the restart.
			n.setBinary(binary)
		}
		if err := r.start(n); err != nil {
			return "", time.Time{}, err
		}
	}
	for i, n := range ns {
		if err := r.waitHealthy(r.ctx, n, within); err != nil {
			out = append(out, "error: "+err.Error())
			continue
		}
		if len(n.partitionRule) > 0 {
			if err := r.installPartitionRule(n, n.partitionRule); err != nil {
				out = append(out, "error: re-install partition rule: "+err.Error())
			}
		}
		if d.has("binary") {
			out = append(out, "restarted "+labels[i]+" on binary "+binary)
			continue
		}
		out = append(out, "restarted "+labels[i])
	}
	return strings.Join(out, "\n"), at, nil
}

func (r *runner) cmdFreeze(d *directive) (string, time.Time, error) {
	return r.freezeOrThaw(d, syscall.SIGSTOP, "SIGSTOP", true, "froze")
}

func (r *runner) cmdThaw(d *directive) (string, time.Time, error) {
	return r.freezeOrThaw(d, syscall.SIGCONT, "SIGCONT", false, "thawed")
}

// freezeOrThaw freezes (SIGSTOP) or thaws (SIGCONT) agents and records which
// are frozen, so checks stop asking them.
func (r *runner) freezeOrThaw(d *directive, sig syscall.Signal, sigName string, frozen bool, verb string) (string, time.Time, error) {
	ns, labels, err := r.targetNodes(d)
	if err != nil {
		return "", time.Time{}, err
	}
	at := time.Now()
	var out []string
	for i, n := range ns {
		if err := n.signal(sig); err != nil {
			out = append(out, "error: "+err.Error())
			continue
		}
		n.mu.Lock()
		n.frozen = frozen
		n.mu.Unlock()
		out = append(out, fmt.Sprintf("%s %s (%s)", verb, labels[i], sigName))
	}
	return strings.Join(out, "\n"), at, nil
}
