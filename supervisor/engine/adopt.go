package engine

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

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
	var adopted, orphans []adoptedEngine
	for _, st := range states {
		id := st.Spec.EngineID
		e, ok := live[id]
		// Unknown (a shim not answering, containerd restarting) is not
		// gone: adopt it and let the watcher look again.
		if !ok || e.State == runtime.StateExited {
			if ok {
				_ = r.cfg.Runtime.Stop(ctx, id, 0)
			} else if err := stopStray(ctx, r.cfg.Runtime, st, r.cfg.Grace, r.log); err != nil {
				// Still running, untracked: keep the file for the next try
				// rather than start a second engine beside it.
				return fmt.Errorf("runner: %w", err)
			}
			r.log.Info("engine of a shard state file is gone; removing the file", "shard", st.ShardID, "engine", id)
			_ = shardstate.Remove(shards, shardstate.FileID(st))
			continue
		}
		delete(live, id)
		adopted = append(adopted, track(id, st, e.PID, false))
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
		orphans = append(orphans, track(id, st, e.PID, true))
		r.log.Warn("found a running engine without a state file; it is stopped once the node has settled", "engine", id)
	}
	all := slices.Concat(adopted, orphans)
	r.mu.Lock()
	for _, a := range all {
		a.e.mu, a.e.changes = &r.mu, r.changes
		r.engines[a.e.id] = a.e
		if port := a.e.state.Spec.HTTPPort; port > 0 {
			r.ports.hold(port, a.e.id)
		}
		if g := a.e.state.Gang; g != nil && g.Rank == 0 && g.MasterPort > 0 {
			r.ports.hold(g.MasterPort, a.e.id) // rank 0's rendezvous
		}
		if kv := a.e.state.Spec.KVPort; kv > 0 {
			r.ports.hold(kv, a.e.id) // its KV transfer's
		}
	}
	r.mu.Unlock()
	probeAdopted(ctx, r.probe, r.policy, adopted)
	for _, a := range all {
		r.wg.Add(1)
		go r.watch(a.ctx, a.e, true)
	}
	return nil
}

// stopStray stops the engine a state file names when the runtime does not
// list it (its record was lost or corrupt) but it still runs, found by the
// file's pid and command: left running it would hold its GPUs and port
// under no claim while the plan starts the shard again beside it.
func stopStray(ctx context.Context, rt runtime.Runtime, st shardstate.State, grace time.Duration, log *slog.Logger) error {
	ss, ok := rt.(runtime.StrayStopper)
	if !ok || st.PID <= 0 {
		return nil
	}
	found, err := ss.StopStray(ctx, runtime.Stray{ID: st.Spec.EngineID, PID: st.PID, Command: st.Spec.Command}, grace)
	if found {
		log.Warn("stopped an engine the runtime no longer listed (its record was lost); the plan starts it afresh", "shard", st.ShardID, "engine", st.Spec.EngineID, "pid", st.PID, "err", err)
	}
	if err != nil {
		return fmt.Errorf("engine %s of shard %s runs untracked: %w", st.Spec.EngineID, st.ShardID, err)
	}
	return nil
}

// adoptProbeTimeout bounds how long the first readiness probe of the
// adopted engines may hold up the agent's start.
const adoptProbeTimeout = 5 * time.Second

// probeAdopted judges every adopted engine's readiness before the runner
// is handed to the node. The node's first record, and so its first plan,
// then shows a serving engine as ready: judged "not ready" until its first
// probe, a serving old-version copy would lose its place in a rolling
// update (only a valid lease keeps it), and its node would stop it before
// the new copy could serve.
func probeAdopted(ctx context.Context, probe *prober, policy restartPolicy, adopted []adoptedEngine) {
	ctx, cancel := context.WithTimeout(ctx, adoptProbeTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, a := range adopted {
		wg.Go(func() {
			a.e.mu.Lock()
			pid := a.e.state.PID
			a.e.mu.Unlock()
			// A gang member above rank 0 has no HTTP: found running, it
			// served in its gang before the agent restarted, and stays
			// ready until the first plan shows its gang (memberReady).
			// Taken for "starting", it could lose its shard to a
			// replacement, and the whole gang would restart for it.
			if a.e.isMember() {
				policy.setReady(a.e, true, pid)
				return
			}
			ok, _ := probe.ready(ctx, a.e)
			policy.setReady(a.e, ok && probe.ownsPort(a.e, pid), pid)
		})
	}
	wg.Wait()
}

// adoptedEngine is an adopted engine whose watcher has not started yet,
// with the context it is to run under.
type adoptedEngine struct {
	e   *managed
	ctx context.Context
}

// track makes the managed engine of an adopted one, found running as pid;
// adopt registers it and starts its watcher.
func track(id string, st shardstate.State, pid int, orphan bool) adoptedEngine {
	ctx, cancel := context.WithCancel(context.Background())
	// Until the plan says more, the state file is the spec: enough to
	// probe readiness and, after a crash, to start the engine again.
	spec := placement.Deployment{Name: st.Spec.ServedModelName, Model: st.Spec.Model, Engine: st.Spec.Engine, Image: st.Spec.Image}
	e := &managed{id: id, state: st, status: gossip.ShardStarting, stop: cancel, orphan: orphan,
		desired: Desired{Assignment: placement.Assignment{ShardID: st.ShardID, ReplicaID: st.ReplicaID, Deployment: st.Spec.Deployment, Role: st.Spec.Role,
			SpecVersion: st.Spec.SpecVersion, GPUs: st.Spec.GPUIndices, MemoryPerGPU: st.Spec.MemoryPerGPU}, Spec: spec}}
	e.state.PID = pid
	return adoptedEngine{e, ctx}
}
