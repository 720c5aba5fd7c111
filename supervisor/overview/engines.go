package overview

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/status"
)

// EnginesReader reads the engines this machine runs from the shard state
// files, read-only, and, when the agent answers, the leases as it last
// published them.
type EnginesReader struct {
	API  API
	Addr string
	// Alive tells whether a pid runs (PIDAlive).
	Alive func(pid int) bool
}

// EnginesSection is what the Engines section shows.
type EnginesSection struct {
	Engines []Engine
	// Bad names the state files that could not be used, and why.
	Bad []string
	// LeaseNote says why the lease column is empty (the agent does not
	// answer).
	LeaseNote string
	NeedsRoot bool
	Note      string
}

// Engine is one engine from its shard state file.
type Engine struct {
	Shard, Model, Engine, Deployment string
	SpecVersion                      string
	GPUs                             []int
	// MemoryPerGPU is what the shard was placed with on each GPU (0:
	// whole GPUs).
	MemoryPerGPU uint64
	Port, PID    int
	// PIDAlive: the process is still there (an agent that is down leaves
	// its engines running).
	PIDAlive  bool
	StartedAt time.Time
	Restarts  int
	// Lease and Status are the agent's, as it last published them; empty
	// when it does not answer or does not list the shard.
	Lease, Status string
}

// Read reads the engines section.
func (r EnginesReader) Read(ctx context.Context, d datadir.Dir, st stamp) EnginesSection {
	var s EnginesSection
	states, bad := d.ReadShardStates()
	for _, b := range bad {
		if errors.Is(b.Err, os.ErrPermission) {
			s.NeedsRoot = true
			continue
		}
		s.Bad = append(s.Bad, filepath.Base(b.Path)+": "+b.Err.Error())
	}
	alive := r.Alive
	if alive == nil {
		alive = PIDAlive
	}
	for _, st := range states {
		e := Engine{Shard: st.ShardID, Model: st.Spec.ServedModelName, Engine: st.Spec.Engine, Deployment: st.Spec.Deployment,
			SpecVersion: st.Spec.SpecVersion, GPUs: st.Spec.GPUIndices, MemoryPerGPU: st.Spec.MemoryPerGPU, Port: st.Spec.HTTPPort, PID: st.PID,
			PIDAlive: alive(st.PID), StartedAt: st.StartedAt, Restarts: st.Restarts}
		// Clients ask for the served name (the deployment's); the hub id
		// stands in only when there is none.
		if e.Model == "" {
			e.Model = st.Spec.Model
		}
		s.Engines = append(s.Engines, e)
	}
	if len(s.Engines) == 0 || r.API == nil {
		return s
	}
	self, _, _ := d.ReadIdentity()
	var shards []status.ShardInfo
	actx, cancel := part(ctx, 0.75)
	defer cancel()
	if err := r.API.Get(actx, apiAddr(r.Addr, st), "/v1/shards", &shards); err != nil {
		s.LeaseNote = "leases not shown: the agent does not answer"
		return s
	}
	for i := range s.Engines {
		e := &s.Engines[i]
		for _, sh := range shards {
			if sh.ShardID == e.Shard && sh.SpecVersion == e.SpecVersion && (self.Name == "" || sh.Node == self.Name) {
				e.Lease, e.Status = string(sh.Lease), string(sh.Status)
			}
		}
	}
	return s
}
