package supervisor

import (
	"fmt"
	"strings"
)

// noLogWhy says in one line why a shard has no log to show: it is placed
// nowhere (with placement's reason), planned on a node that has not started
// it yet, or unknown. Asked where no live node holds the shard.
func (n *Node) noLogWhy(shard string) string {
	rows := n.Status().Shards(n.clock.Now())
	for _, s := range rows {
		if s.ShardID != shard {
			continue
		}
		switch {
		case s.Node == "" && s.Reason != "":
			return fmt.Sprintf("shard %q never started: placement put it on no node: %s", shard, s.Reason)
		case s.Node == "":
			return fmt.Sprintf("shard %q never started: placement put it on no node", shard)
		case s.Node == n.cfg.Name:
			return fmt.Sprintf("shard %q has no engine log on %s: no engine of it has started here (runtime %s)", shard, s.Node, n.runtimeName())
		default:
			return fmt.Sprintf("shard %q has not started yet: it is planned on %s, which does not hold it (status %s)", shard, s.Node, s.Status)
		}
	}
	var known []string
	for _, s := range rows {
		known = append(known, s.ShardID)
	}
	if len(known) > 8 {
		known = append(known[:8], "...")
	}
	if len(known) == 0 {
		return fmt.Sprintf("no shard %q: no deployment has shards (see llmgw models)", shard)
	}
	return fmt.Sprintf("no shard %q (shards: %s)", shard, strings.Join(known, ", "))
}

// noFileWhy says in one line why a shard this node holds has no log file:
// its engine never started (with the start error, when there is one).
func (n *Node) noFileWhy(shard string) string {
	for _, s := range n.runner.Shards() {
		if s.ShardID != shard {
			continue
		}
		why := fmt.Sprintf("shard %q has no log on %s: its engine never started (status %s", shard, n.cfg.Name, s.Status)
		if s.Error != "" {
			why += ", start error: " + s.Error
		}
		return why + ")"
	}
	return fmt.Sprintf("shard %q has no log on %s: its engine never started", shard, n.cfg.Name)
}

func (n *Node) runtimeName() string {
	if n.cfg.RuntimeName == "" {
		return "none"
	}
	return n.cfg.RuntimeName
}
