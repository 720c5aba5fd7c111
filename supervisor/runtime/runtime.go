// Package runtime is the contract between the supervisor and whatever runs
// engines on a node: containerd for containers, or plain processes for
// engines installed on the host and for the built-in fake engine.
//
// It holds plain types only; implementations live in subpackages, and only
// supervisor/runtime/containerd imports containerd.
package runtime

import (
	"context"
	"errors"
	"time"
)

// ErrNotFound is returned (wrapped) when an engine ID is unknown to the
// runtime.
var ErrNotFound = errors.New("engine not found")

// Labels every runtime attaches to what it starts, so that after an agent
// restart the supervisor can tell its own engines from anything else.
const (
	LabelNode  = "llmgw.node"
	LabelShard = "llmgw.shard"
	LabelSpec  = "llmgw.spec"
	// The engine ID, replica and deployment, so that an orphan found by
	// label can be explained without its state file.
	LabelEngine     = "llmgw.engine"
	LabelReplica    = "llmgw.replica"
	LabelDeployment = "llmgw.deployment"
)

// Labels returns the labels a runtime attaches to the engine of s; empty
// values are left out.
func (s EngineSpec) Labels() map[string]string {
	m := make(map[string]string, 6)
	for k, v := range map[string]string{
		LabelNode: s.Node, LabelShard: s.ShardID, LabelSpec: s.SpecVersion,
		LabelEngine: s.ID, LabelReplica: s.ReplicaID, LabelDeployment: s.Deployment,
	} {
		if v != "" {
			m[k] = v
		}
	}
	return m
}

// EngineSpec is everything a runtime needs to start one shard's engine.
// The supervisor resolves profiles and ports before it calls Start.
type EngineSpec struct {
	// ID is unique per node and stable for one (shard, spec version):
	// "<shard id>-<spec version>". Runtimes use it as container ID or to
	// name state.
	ID          string `json:"id"`
	Node        string `json:"node"`
	ShardID     string `json:"shard_id"`
	ReplicaID   string `json:"replica_id"`
	Deployment  string `json:"deployment"`
	SpecVersion string `json:"spec_version"`
	// Image is used by container runtimes; the process runtime ignores it.
	Image string `json:"image,omitempty"`
	// Command is the full argv of the engine.
	Command []string `json:"command"`
	// Env is KEY=VALUE, applied over the runtime's base environment.
	Env        []string `json:"env,omitempty"`
	GPUIndices []int    `json:"gpu_indices"`
	// GPUUUIDs name the GPUs for CDI (nvidia.com/gpu=<uuid>). Empty for
	// simulated GPUs.
	GPUUUIDs []string `json:"gpu_uuids,omitempty"`
	HTTPPort int      `json:"http_port"`
	// LogPath is an absolute file that receives stdout and stderr, written
	// so that logging survives the agent (the shim or the child writes it).
	LogPath string `json:"log_path"`
	// WeightsDir, when set, is bind-mounted at the same path in containers.
	WeightsDir string `json:"weights_dir,omitempty"`
	// CacheDir, when set, is bind-mounted at the same path in containers:
	// the engines' compile caches outlive the container.
	CacheDir string `json:"cache_dir,omitempty"`
	// Gang: the engine is one member of a replica that spans nodes; with
	// RDMADevices (the node's, e.g. mlx5_0) its container gets the RDMA
	// device nodes, CAP_IPC_LOCK and an unlimited memlock, which NCCL
	// needs to register memory with the adapter (GPUDirect RDMA).
	// Without them NCCL falls back to TCP sockets.
	Gang        bool     `json:"gang,omitempty"`
	RDMADevices []string `json:"rdma_devices,omitempty"`
}

// State of an engine as the runtime sees it.
type State string

const (
	StateRunning State = "running"
	StateExited  State = "exited"
	StateUnknown State = "unknown"
)

// Engine is one engine the runtime knows about.
type Engine struct {
	ID     string            `json:"id"`
	Labels map[string]string `json:"labels"`
	State  State             `json:"state"`
	// PID of the engine's main process on the host, 0 when not running.
	PID       int       `json:"pid"`
	ExitCode  int       `json:"exit_code"`
	StartedAt time.Time `json:"started_at"`
	ExitedAt  time.Time `json:"exited_at,omitzero"`
	// ContainerID is the container's ID when the runtime runs engines in
	// containers (it may differ from ID: containerd's IDs are shorter);
	// empty otherwise. Callers record it as it comes, without asking which
	// runtime they hold.
	ContainerID string `json:"container_id,omitempty"`
}

// Runtime starts and stops engines on this node.
//
// Every method is safe for concurrent use. An engine outlives the agent
// process: after a restart, List finds what an earlier agent started.
type Runtime interface {
	// Name is "containerd" or "process", for logs and records. Callers do
	// not branch on it: what differs comes back in Engine (ContainerID) or
	// as an optional interface (ImagePuller).
	Name() string
	// Start creates and starts an engine. Starting an ID that exists and
	// runs is an error; one that exited is replaced.
	Start(ctx context.Context, spec EngineSpec) (Engine, error)
	// Stop sends SIGTERM to the engine and all its processes, waits up to
	// grace, then SIGKILLs, and removes the engine. Stopping an unknown ID
	// returns an error wrapping ErrNotFound.
	Stop(ctx context.Context, id string, grace time.Duration) error
	// Status reports one engine.
	Status(ctx context.Context, id string) (Engine, error)
	// List reports every engine this runtime started for node, running or
	// exited but not yet removed.
	List(ctx context.Context, node string) ([]Engine, error)
}

// ImagePuller is implemented by a Runtime whose engines start from images
// that must be present first (containerd). Its caller pulls before Start,
// so a multi-gigabyte pull is a starting engine the caller can see and
// cancel, not a Start that hangs; a runtime without images does not
// implement it.
type ImagePuller interface {
	// EnsureImage makes ref present and ready to start from, pulling it
	// when missing. progress, when not nil, is told from time to time
	// how many bytes arrived of how many known so far (the total grows as
	// manifests are read), so a caller can say "pulling image 43%".
	EnsureImage(ctx context.Context, ref string, progress func(done, total int64)) error
}

// Stray is an engine the supervisor's state file remembers but the runtime
// no longer lists (its record was lost or unreadable): what the file says
// of it.
type Stray struct {
	ID      string
	PID     int
	Command []string
}

// StrayStopper is a Runtime that can find a Stray by what the state file
// remembers and stop it, so that an engine whose record was lost is never
// left running untracked beside its replacement. It reports whether it
// found one. (containerd lists by the container's own labels and needs no
// record: it has nothing to find this way.)
type StrayStopper interface {
	StopStray(ctx context.Context, s Stray, grace time.Duration) (found bool, err error)
}
