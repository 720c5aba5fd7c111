package supervisor

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// adapterRetries bounds how often ChangeAdapter applies itself again on a
// spec another write replaced.
const adapterRetries = 5

// ChangeAdapter adds one LoRA adapter to a deployment (or gives an
// existing one a new source), or, with add nil, removes the adapter
// named remove, and changes nothing else of its spec.
//
// A deployment record is written whole (the newest write wins on every
// node), so two changes made at once through two nodes would each write
// a list without the other's adapter. So a change, once written, waits
// as long as the cluster takes to spread a write (the gossip profile's
// spread bound for its size), reads the spec every node converges to
// again, and, if that spec no longer holds the change, applies the change
// to it and writes again, at most adapterRetries times. Changes to
// different adapters made at once therefore all land, each in a few
// spread bounds; two changes to one adapter end as the later write says.
func (n *Node) ChangeAdapter(ctx context.Context, deployment string, add *placement.Adapter, remove string) (status.DeploymentInfo, error) {
	holds := func(list []placement.Adapter) bool {
		if add != nil {
			return slices.Contains(list, *add)
		}
		return !slices.ContainsFunc(list, func(a placement.Adapter) bool { return a.Name == remove })
	}
	for range adapterRetries {
		rec, ok := n.cluster.Deployment(deployment)
		if !ok || rec.Deleted || rec.Spec == nil {
			return status.DeploymentInfo{}, fmt.Errorf("%w: %q", ErrNoDeployment, deployment)
		}
		spec := *rec.Spec
		list := slices.Clone(spec.Adapters)
		if add != nil {
			if i := slices.IndexFunc(list, func(a placement.Adapter) bool { return a.Name == add.Name }); i >= 0 {
				list[i] = *add
			} else {
				list = append(list, *add)
			}
		} else {
			list = slices.DeleteFunc(list, func(a placement.Adapter) bool { return a.Name == remove })
		}
		var info status.DeploymentInfo
		var err error
		if slices.Equal(list, spec.Adapters) {
			// Nothing to write, nor to wait for: what this node holds
			// already says it.
			return status.DeploymentInfo{Deployment: spec, SpecVersion: spec.SpecVersion(), Stamp: rec.Stamp, Change: status.ChangeUnchanged}, nil
		}
		spec.Adapters = list
		if info, err = n.Place(ctx, spec); err != nil {
			return info, err
		}
		t := n.clock.NewTimer(max(time.Second, n.cfg.Profile.SpreadBound(len(n.cluster.Members()))))
		select {
		case <-t.Chan():
		case <-ctx.Done():
			t.Stop()
			return info, ctx.Err()
		}
		if again, ok := n.cluster.Deployment(deployment); ok && !again.Deleted && again.Spec != nil && holds(again.Spec.Adapters) {
			return info, nil
		}
		n.log.Info("adapter change overwritten by a concurrent write; applying it again", "deployment", deployment)
	}
	return status.DeploymentInfo{}, fmt.Errorf("deployment %s: the adapter change was overwritten by other writes %d times; try again", deployment, adapterRetries)
}
