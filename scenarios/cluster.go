package scenarios

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clusterCfg is what the cluster command fixed for every node it starts.
type clusterCfg struct {
	gpus     string
	profile  string
	leaseTTL time.Duration
	runtime  string
	logLevel string
	// nodeFlags are the readiness and gateway flags given to the cluster
	// command, passed to every node (engines.go).
	nodeFlags []string
}

func (r *runner) needCluster(d *directive) error {
	if !r.clusterStarted {
		return usagef("%s: no cluster yet (start one with: cluster nodes=3)", d.cmd)
	}
	return nil
}

// resolveNodes turns node references into nodes: a name, an alias set with
// as=, "@SHARD" (the node the plan gives that shard), or "all".
func (r *runner) resolveNodes(ctx context.Context, refs []string) ([]*node, []string, error) {
	var out []*node
	var labels []string
	for _, ref := range refs {
		switch {
		case ref == "all":
			for _, n := range r.nodes {
				out = append(out, n)
				labels = append(labels, n.name)
			}
		case strings.HasPrefix(ref, "@"):
			shard := ref[1:]
			name, err := r.plannedNode(ctx, shard)
			if err != nil {
				return nil, nil, err
			}
			out = append(out, r.byName[name])
			labels = append(labels, "the node planned for "+shard)
		default:
			name := ref
			label := ref
			if a, ok := r.aliases[ref]; ok {
				name = a
			}
			n, ok := r.byName[name]
			if !ok {
				return nil, nil, usagef("no node or alias %q", ref)
			}
			out = append(out, n)
			labels = append(labels, label)
		}
	}
	var uniq []*node
	var ulabels []string
	for i, n := range out {
		if !slices.Contains(uniq, n) {
			uniq = append(uniq, n)
			ulabels = append(ulabels, labels[i])
		}
	}
	return uniq, ulabels, nil
}

// targetNodes resolves the positional node references of d.
func (r *runner) targetNodes(d *directive) ([]*node, []string, error) {
	if err := r.needCluster(d); err != nil {
		return nil, nil, err
	}
	refs := d.positional()
	if len(refs) == 0 {
		return nil, nil, usagef("%s: name a node", d.cmd)
	}
	var all []string
	for _, ref := range refs {
		all = append(all, strings.Split(ref, ",")...)
	}
	ns, labels, err := r.resolveNodes(r.ctx, all)
	if err != nil {
		return nil, nil, err
	}
	if _, ok := d.kvRaw("as"); ok && len(ns) != 1 {
		return nil, nil, usagef("%s: as= names one node", d.cmd)
	}
	if len(ns) == 1 {
		if err := r.alias(d, ns[0].name); err != nil {
			return nil, nil, err
		}
	}
	return ns, labels, nil
}

// alias reads as=ALIAS, when d gives it, and makes ALIAS name the node
// called name in later commands.
func (r *runner) alias(d *directive, name string) error {
	as, ok := d.kvRaw("as")
	if !ok {
		return nil
	}
	if _, clash := r.byName[as]; clash {
		return usagef("%s: alias %q is a node name", d.cmd, as)
	}
	r.aliases[as] = name
	return nil
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

// plannedNode is the node the first answering node's plan gives the shard
// (the current spec version's assignment when there are several). It is
// the plan's word, not the holder's: single-holder checks what nodes hold.
func (r *runner) plannedNode(ctx context.Context, shard string) (string, error) {
	obs := r.observers(nil)
	if len(obs) == 0 {
		return "", errors.New("no node is up to ask")
	}
	var p planInfo
	if err := r.get(ctx, obs[0], "/v1/plan", &p); err != nil {
		return "", err
	}
	name := ""
	for _, a := range p.Plan.Assignments {
		if a.ShardID == shard && (name == "" || !a.Draining) {
			name = a.Node
		}
	}
	if name == "" {
		return "", fmt.Errorf("no node is planned for shard %s", shard)
	}
	if _, ok := r.byName[name]; !ok {
		return "", fmt.Errorf("shard %s is planned on %s, a node this scenario did not start", shard, name)
	}
	return name, nil
}

// observers are the nodes that answer (running, not frozen), in creation
// order, limited to only when it is non-nil.
func (r *runner) observers(only []*node) []*node {
	var out []*node
	for _, n := range r.nodes {
		if only != nil && !slices.Contains(only, n) {
			continue
		}
		if n.up() {
			out = append(out, n)
		}
	}
	return out
}

// engineProcs lists the engine processes started from the run's binaries
// (argv[1] == "engine"), whoever started them. Engines outlive their agent,
// so this is how orphans are found and how the teardown finds everything.
func engineProcs(binaries ...string) map[int][]string {
	out := map[int][]string{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || !slices.Contains(binaries, strings.TrimSuffix(exe, " (deleted)")) {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(argv) > 1 && argv[1] == "engine" && !zombie(pid) {
			out[pid] = argv
		}
	}
	return out
}

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z' || b[i+2] == 'X'
}

// teardown kills every agent and every engine of this run.
func (r *runner) teardown() {
	for _, l := range r.loops {
		l.stop()
	}
	for _, n := range r.nodes {
		if p := n.pid(); p != 0 && n.running() {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
	for _, n := range r.nodes {
		n.waitExit(5 * time.Second)
	}
	for range 3 {
		procs := engineProcs(r.binaryPaths()...)
		if len(procs) == 0 {
			return
		}
		for pid := range procs {
			if pg, err := syscall.Getpgid(pid); err == nil && pg == pid {
				_ = syscall.Kill(-pid, syscall.SIGKILL)
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// teardownNet removes the namespaces and bridges of net=netns.
func (r *runner) teardownNet() {
	if r.namespaces != nil {
		r.namespaces.teardown(r.nodes)
	}
}
