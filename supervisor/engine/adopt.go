package engine

import (
	"context"
	"fmt"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/runtime"
	"github.com/llmgw/llmgw/supervisor/shardstate"
)

// adopt takes over what an earlier agent left: every engine the runtime
// still runs for this node is watched again, untouched, and state files
// whose engine is gone are removed.
func (r *Runner) adopt(ctx context.Context) error {
	shards := r.cfg.DataDir.ShardsDir()
	states, bad := shardstate.Load(shards)
	for _, b := range bad {
		r.log.Error("shard state file unusable", "err", b.Error()) // says whether it was moved aside
	}
	running, err := r.cfg.Runtime.List(ctx, r.cfg.Node)
	if err != nil {
		return fmt.Errorf("runner: list %s engines: %w", r.cfg.Runtime.Name(), err)
	}
	live := map[string]runtime.Engine{}
	for _, e := range running {
		live[e.ID] = e
	}
	for _, st := range states {
		id := st.Spec.EngineID
		e, ok := live[id]
		// Unknown (a shim not answering, containerd restarting) is not
		// gone: adopt it and let the watcher look again.
		if !ok || e.State == runtime.StateExited {
			r.log.Info("engine of a shard state file is gone; removing the file", "shard", st.ShardID, "engine", id)
			if ok {
				_ = r.cfg.Runtime.Stop(ctx, id, 0)
			}
			_ = shardstate.Remove(shards, shardstate.FileID(st))
			continue
		}
		delete(live, id)
		r.track(id, st, e.PID, false)
		r.log.Info("adopted running engine", "shard", st.ShardID, "engine", id, "pid", e.PID)
	}
	for id, e := range live {
		// Ours by label but without a state file: the agent died between
		// starting it and writing the file, or the file was corrupt. It is
		// stopped once the node settles unless the plan wants it.
		st := shardstate.State{ShardID: e.Labels[runtime.LabelShard], PID: e.PID, StartedAt: e.StartedAt,
			Spec: shardstate.Spec{EngineID: id, SpecVersion: e.Labels[runtime.LabelSpec], Runtime: r.cfg.Runtime.Name(), ContainerID: e.ContainerID}}
		if e.State == runtime.StateExited || st.ShardID == "" {
			r.log.Info("removing an exited or unlabelled engine of ours", "engine", id)
			_ = r.cfg.Runtime.Stop(ctx, id, 0)
			continue
		}
		r.track(id, st, e.PID, true)
		r.log.Warn("found a running engine without a state file; it is stopped once the node has settled", "engine", id)
	}
	return nil
}

// track registers an adopted engine and starts watching it.
func (r *Runner) track(id string, st shardstate.State, pid int, orphan bool) {
	ctx, cancel := context.WithCancel(context.Background())
	// Until the plan says more, the state file is the spec: enough to
	// probe readiness and, after a crash, to start the engine again.
	spec := placement.Deployment{Name: st.Spec.ServedModelName, Model: st.Spec.Model, Engine: st.Spec.Engine, Image: st.Spec.Image}
	e := &managed{id: id, state: st, status: gossip.ShardStarting, stop: cancel, orphan: orphan,
		desired: Desired{Assignment: placement.Assignment{ShardID: st.ShardID, ReplicaID: st.ReplicaID, Deployment: st.Spec.Deployment,
			SpecVersion: st.Spec.SpecVersion, GPUs: st.Spec.GPUIndices, MemoryPerGPU: st.Spec.MemoryPerGPU}, Spec: spec}}
	e.state.PID = pid
	r.mu.Lock()
	r.engines[id] = e
	if st.Spec.HTTPPort > 0 {
		r.ports[st.Spec.HTTPPort] = id
	}
	r.mu.Unlock()
	r.wg.Add(1)
	go r.watch(ctx, e, true)
}
