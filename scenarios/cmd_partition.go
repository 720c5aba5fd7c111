package scenarios

import (
	"strings"
	"time"
)

func (r *runner) cmdPartition(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	spec := strings.Join(d.positional(), " ")
	var sides [][]*node
	seen := map[*node]bool{}
	for _, side := range strings.Split(spec, "|") {
		refs := strings.FieldsFunc(side, func(r rune) bool { return r == ',' || r == ' ' })
		if len(refs) == 0 {
			return "", time.Time{}, usagef("partition: empty side in %q (want: partition n1,n2 | n3)", spec)
		}
		ns, _, err := r.resolveNodes(r.ctx, refs)
		if err != nil {
			return "", time.Time{}, err
		}
		for _, n := range ns {
			if seen[n] {
				return "", time.Time{}, usagef("partition: %s is on two sides", n.name)
			}
			seen[n] = true
		}
		sides = append(sides, ns)
	}
	if len(sides) < 2 {
		return "", time.Time{}, usagef("partition: want at least two sides separated by '|'")
	}
	for _, n := range r.nodes {
		if !seen[n] {
			return "", time.Time{}, usagef("partition: %s is on no side; name every node", n.name)
		}
	}
	at := time.Now()
	var errs []string
	var desc []string
	if r.namespaces != nil {
		for _, side := range sides {
			var names []string
			for _, n := range side {
				names = append(names, n.name)
			}
			desc = append(desc, strings.Join(names, ","))
		}
		if err := r.namespaces.split(sides); err != nil {
			return "", at, err
		}
		return "partitioned " + strings.Join(desc, " | ") + " (network namespaces: each side on a bridge of its own; the API stays reachable)", at, nil
	}
	for i, side := range sides {
		var names []string
		for _, n := range side {
			names = append(names, n.name)
		}
		desc = append(desc, strings.Join(names, ","))
		var drop []string
		for j, other := range sides {
			if j != i {
				for _, o := range other {
					drop = append(drop, o.name)
				}
			}
		}
		for _, n := range side {
			n.partitionRule = drop
			if !n.up() {
				continue // installed when it restarts
			}
			if err := r.installPartitionRule(n, drop); err != nil {
				errs = append(errs, "error: "+n.name+": "+err.Error())
			}
		}
	}
	out := "partitioned " + strings.Join(desc, " | ") + " (gossip-drop test hook on every node; no network namespaces)"
	return strings.Join(append([]string{out}, errs...), "\n"), at, nil
}

func (r *runner) cmdHeal(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	at := time.Now()
	if r.namespaces != nil {
		if err := r.namespaces.heal(r.nodes); err != nil {
			return "", at, err
		}
		return "healed: every node back on one bridge", at, nil
	}
	out := []string{"healed: every node accepts gossip from every node again"}
	for _, n := range r.nodes {
		n.partitionRule = nil
		if !n.up() {
			continue
		}
		if err := r.installPartitionRule(n, nil); err != nil {
			out = append(out, "error: "+n.name+": "+err.Error())
		}
	}
	return strings.Join(out, "\n"), at, nil
}

// installPartitionRule tells n, through the gossip-drop test hook, to drop
// gossip to and from the nodes named in drop (none when drop is nil).
func (r *runner) installPartitionRule(n *node, drop []string) error {
	if drop == nil {
		drop = []string{}
	}
	return r.call(r.ctx, "POST", n.api()+"/v1/test/partition", map[string]any{"drop": drop}, true, nil)
}
