package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor"
	"github.com/llmgw/llmgw/supervisor/spec"
	"github.com/llmgw/llmgw/supervisor/status"
)

// The cluster tools answer from this node's view. Their results are JSON
// objects (structuredContent, and the same JSON as text). They declare no
// output schema: the records carry fields whose JSON differs from their Go
// type (sizes such as "70GiB"), and an inferred schema would reject real
// answers.

type nodesIn struct {
	Name string `json:"name,omitempty" jsonschema:"only this node; every node if empty"`
}

type nodeOut struct {
	status.MemberInfo
	// ShardsHeld replaces the record's shard list; the shards tool has it.
	ShardsHeld int  `json:"shards_held"`
	Self       bool `json:"self,omitempty"`
}

type nodesOut struct {
	Self  string    `json:"self"`
	Nodes []nodeOut `json:"nodes"`
}

type deploymentsIn struct {
	Name string `json:"name,omitempty" jsonschema:"only this deployment; every deployment if empty"`
}

type deploymentsOut struct {
	Deployments []status.DeploymentInfo `json:"deployments"`
}

type shardsIn struct {
	Deployment string `json:"deployment,omitempty" jsonschema:"only shards of this deployment"`
	Node       string `json:"node,omitempty" jsonschema:"only shards placed on or held by this node"`
	Status     string `json:"status,omitempty" jsonschema:"only shards in this status (pending, starting, ready, crashed, backoff, stopping, unplaced)"`
}

type shardsOut struct {
	Shards []status.ShardInfo `json:"shards"`
}

type whyNotIn struct {
	Deployment string `json:"deployment,omitempty" jsonschema:"a deployment name: explain each of its shards"`
	Shard      string `json:"shard,omitempty" jsonschema:"a shard ID such as llama-0 or llama-0-s1: explain that shard"`
}

type shardWhy struct {
	ShardID     string               `json:"shard_id"`
	Deployment  string               `json:"deployment"`
	SpecVersion string               `json:"spec_version,omitempty"`
	Placed      bool                 `json:"placed"`
	Node        string               `json:"node,omitempty"`
	GPUs        []int                `json:"gpus,omitempty"`
	Status      gossip.ShardStatus   `json:"status"`
	Lease       placement.LeaseState `json:"lease,omitempty"`
	// Rank and GangSize are a gang member's place in its gang (absent for
	// a replica of one shard).
	Rank     *int `json:"rank,omitempty"`
	GangSize int  `json:"gang_size,omitempty"`
	// Why is one sentence: where it runs and how it is doing, or why it
	// runs nowhere.
	Why string `json:"why"`
}

type whyNotOut struct {
	Deployment string     `json:"deployment,omitempty"`
	Replicas   int        `json:"replicas_wanted,omitempty"`
	Placed     int        `json:"replicas_placed"`
	Ready      int        `json:"replicas_ready"`
	Summary    string     `json:"summary"`
	Shards     []shardWhy `json:"shards"`
}

type loadIn struct {
	Deployment string `json:"deployment,omitempty" jsonschema:"only shards of this deployment"`
	Node       string `json:"node,omitempty" jsonschema:"only shards held by this node"`
}

type loadRow struct {
	ShardID    string               `json:"shard_id"`
	Deployment string               `json:"deployment"`
	Node       string               `json:"node"`
	Status     gossip.ShardStatus   `json:"status"`
	Lease      placement.LeaseState `json:"lease"`
	Load       gossip.ShardLoad     `json:"load"`
	// AgeSeconds is how old the scrape is as this node tells time; empty
	// when the engine was never scraped.
	AgeSeconds *float64 `json:"age_s,omitempty"`
}

type loadTotal struct {
	Running       float64 `json:"running"`
	Waiting       float64 `json:"waiting"`
	PromptTPS     float64 `json:"prompt_tokens_per_s"`
	GenerationTPS float64 `json:"generation_tokens_per_s"`
	MaxKVCache    float64 `json:"max_kv_cache_usage"`
}

type loadOut struct {
	Shards       []loadRow            `json:"shards"`
	ByDeployment map[string]loadTotal `json:"by_deployment"`
}

type placeIn struct {
	Spec map[string]any `json:"spec" jsonschema:"the deployment, as llmgw place takes it: name, model, engine (vllm, sglang, llama.cpp, fake), replicas, tensor_parallel (or \"auto\"), pipeline_parallel, gpu_memory (e.g. \"70GiB\", or \"auto\": sized from the model's files), max_model_len, max_num_seqs, gpu_type, labels, image, args, env, update (surge or recreate)"`
}

type placeOut struct {
	Placed      string               `json:"placed"`
	SpecVersion string               `json:"spec_version"`
	Stamp       gossip.Stamp         `json:"stamp"`
	Spec        placement.Deployment `json:"spec"`
	Next        string               `json:"next"`
}

type unplaceIn struct {
	Name string `json:"name" jsonschema:"the deployment to remove"`
}

type unplaceOut struct {
	Removed string `json:"removed"`
}

// addCluster registers one cluster tool with call metrics.
func addCluster[In any](s *Server, t *mcp.Tool, h func(ctx context.Context, in In) (any, error)) {
	name := t.Name
	mcp.AddTool(s.srv, t, func(ctx context.Context, _ *mcp.CallToolRequest, in In) (*mcp.CallToolResult, any, error) {
		start := time.Now()
		out, err := h(ctx, in)
		s.observe(name, "local", start, err != nil)
		if err != nil {
			return nil, nil, err
		}
		return nil, out, nil
	})
	s.names = append(s.names, name)
}

func readOnly() *mcp.ToolAnnotations { return &mcp.ToolAnnotations{ReadOnlyHint: true} }

func (s *Server) addClusterTools() {
	addCluster(s, &mcp.Tool{Name: "nodes", Annotations: readOnly(), Description: "Every node this node knows by gossip: " +
		"name, state (alive, suspect, dead, left), API address, labels, GPUs (index, model, memory total/used/" +
		"foreign in bytes, NVLink peers, faulted), how many shards it holds, agent version, runtime, probe " +
		"summary (driver faults, meaning Xids and NVRM errors such as NV_ERR_*, in the recent window and since boot, " +
		"with the newest fault line) and telemetry (per GPU utilisation %, temperature °C and power W; per RDMA " +
		"port up or not and tx/rx MB/s; rounded, read at most every 15 s, with read_at). The answering node's own row says isolated (with since when) when it has heard no peer for several probe intervals. Node names are what the " +
		"host tools' node argument takes."}, s.nodes)
	addCluster(s, &mcp.Tool{Name: "deployments", Annotations: readOnly(), Description: "What the cluster is asked to " +
		"run: each deployment's spec (model, engine, replicas, tensor/pipeline parallel, memory, constraints), " +
		"spec version, how many replicas are placed and how many are ready (every shard holds a valid lease), " +
		"the nodes it runs on, and for every shard that could not be placed, why."}, s.deployments)
	addCluster(s, &mcp.Tool{Name: "shards", Annotations: readOnly(), Description: "Every shard: planned, held or " +
		"unplaced. For each: deployment, replica, spec version, node and GPU indices, lease (valid, starting, " +
		"lapsed, or none when nobody holds it; only a valid lease is routable), engine status, URL, PID or container, restarts and last exit " +
		"code, the engine's load, a reason when it is unplaced or being stopped, and for a member of a gang (a " +
		"replica across nodes) its rank, the gang's generation and what holds it back."}, s.shards)
	addCluster(s, &mcp.Tool{Name: "why_not", Annotations: readOnly(), Description: "Why a deployment (or one shard) " +
		"is or is not running: for each shard, the node and GPUs it was placed on with its lease and engine " +
		"status, or placement's reason for placing it nowhere (e.g. \"needs 4 GPUs with 70 GiB free; best " +
		"node n3 has 2\"). Give deployment or shard."}, s.whyNot)
	addCluster(s, &mcp.Tool{Name: "load", Annotations: readOnly(), Description: "Engine load per held shard, as each " +
		"holder last scraped its engine and gossiped it (any node answers for all): requests running and " +
		"waiting, KV-cache usage (0-1), prompt and generation tokens per second (rates_valid is false right " +
		"after an engine (re)start: the rates are then unknown, not zero), scrape age and scrape error; with " +
		"totals per deployment. Prompt and generation are apart: prefill with no generation is a busy engine, " +
		"nothing at all with waiting requests is a stalled one."}, s.load)
	addCluster(s, &mcp.Tool{Name: "place", Annotations: &mcp.ToolAnnotations{IdempotentHint: true}, Description: "Create " +
		"or change a deployment (the same as llmgw place). The spec is validated first and a bad one is refused " +
		"with the field at fault. Accepted, it is replicated to every node by gossip and placed by all of them " +
		"alike; a changed spec rolls: new shards start beside the old, which stop once the new are ready. " +
		"Returns the stored spec and its version, change (new, changed, scaled, settings or unchanged), how many replicas the plan computed with it places now and, for the rest, placement's reasons; call why_not a few seconds later to see where it landed."}, s.place)
	addCluster(s, &mcp.Tool{Name: "unplace", Annotations: &mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: ptr(true)}, Description: "Remove " +
		"a deployment (the same as llmgw unplace): every node stops its shards. Fails for a name the cluster " +
		"does not know, listing the ones it does."}, s.unplace)
}

func ptr[T any](v T) *T { return &v }

func (s *Server) nodes(_ context.Context, in nodesIn) (any, error) {
	out := nodesOut{Self: s.self(), Nodes: []nodeOut{}}
	var names []string
	for _, m := range s.node.Status().Members() {
		names = append(names, m.Name)
		if in.Name != "" && m.Name != in.Name {
			continue
		}
		held := len(m.Shards)
		m.Shards = nil
		out.Nodes = append(out.Nodes, nodeOut{MemberInfo: m, ShardsHeld: held, Self: m.Name == s.self()})
	}
	if in.Name != "" && len(out.Nodes) == 0 {
		return nil, fmt.Errorf("no node named %q; nodes: %s", in.Name, strings.Join(names, ", "))
	}
	return out, nil
}

func (s *Server) deploymentNames() string {
	var names []string
	for _, d := range s.node.Status().Deployments(s.node.Now()) {
		names = append(names, d.Name)
	}
	if len(names) == 0 {
		return "(none)"
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

func (s *Server) deployments(_ context.Context, in deploymentsIn) (any, error) {
	out := deploymentsOut{Deployments: []status.DeploymentInfo{}}
	for _, d := range s.node.Status().Deployments(s.node.Now()) {
		if in.Name == "" || d.Name == in.Name {
			out.Deployments = append(out.Deployments, d)
		}
	}
	if in.Name != "" && len(out.Deployments) == 0 {
		return nil, fmt.Errorf("no deployment named %q; deployments: %s", in.Name, s.deploymentNames())
	}
	return out, nil
}

func (s *Server) shards(_ context.Context, in shardsIn) (any, error) {
	out := shardsOut{Shards: []status.ShardInfo{}}
	for _, sh := range s.node.Status().Shards(s.node.Now()) {
		if (in.Deployment != "" && sh.Deployment != in.Deployment) || (in.Node != "" && sh.Node != in.Node) || (in.Status != "" && sh.Status != gossip.ShardStatus(in.Status)) {
			continue
		}
		out.Shards = append(out.Shards, sh)
	}
	return out, nil
}

func (s *Server) whyNot(_ context.Context, in whyNotIn) (any, error) {
	switch {
	case in.Deployment == "" && in.Shard == "":
		return nil, errors.New("give deployment (a name from the deployments tool) or shard (an ID from the shards tool)")
	case in.Deployment != "" && in.Shard != "":
		return nil, errors.New("give deployment or shard, not both")
	}
	var rows []status.ShardInfo
	for _, sh := range s.node.Status().Shards(s.node.Now()) {
		if (in.Shard != "" && sh.ShardID == in.Shard) || (in.Deployment != "" && sh.Deployment == in.Deployment) {
			rows = append(rows, sh)
		}
	}
	out := whyNotOut{Shards: []shardWhy{}}
	dep := in.Deployment
	if in.Shard != "" {
		if len(rows) == 0 {
			return nil, fmt.Errorf("no shard %q in this node's plan or in any node's record; deployments: %s", in.Shard, s.deploymentNames())
		}
		dep = rows[0].Deployment
	}
	found := false
	for _, d := range s.node.Status().Deployments(s.node.Now()) {
		if d.Name == dep {
			found = true
			out.Deployment, out.Placed, out.Ready = d.Name, d.Placed, d.Ready
			if in.Shard == "" {
				out.Replicas = d.Replicas
			}
			break
		}
	}
	if !found && in.Shard == "" {
		return nil, fmt.Errorf("no deployment named %q; deployments: %s", in.Deployment, s.deploymentNames())
	}
	for _, sh := range rows {
		out.Shards = append(out.Shards, explain(sh))
	}
	out.Summary = summarize(in, out, found)
	return out, nil
}

// explain says in one sentence where a shard runs and how, or why nowhere.
func explain(sh status.ShardInfo) shardWhy {
	w := shardWhy{ShardID: sh.ShardID, Deployment: sh.Deployment, SpecVersion: sh.SpecVersion, Node: sh.Node,
		GPUs: sh.GPUs, Status: sh.Status, Lease: sh.Lease, Placed: sh.Node != ""}
	switch {
	case sh.Status == gossip.ShardUnplaced:
		w.Why = "placed nowhere: " + sh.Reason
	case sh.Reason != "":
		w.Why = fmt.Sprintf("held by %s: %s", sh.Node, sh.Reason)
	case sh.Lease == placement.LeaseValid:
		w.Why = fmt.Sprintf("runs on %s GPUs %v; engine %s, lease valid (routable)", sh.Node, sh.GPUs, sh.Status)
	case sh.Status == gossip.ShardPending:
		w.Why = fmt.Sprintf("placed on %s GPUs %v; %s has not reported the engine yet", sh.Node, sh.GPUs, sh.Node)
	default:
		w.Why = fmt.Sprintf("placed on %s GPUs %v; engine %s, lease %s (not routable until the engine is ready)", sh.Node, sh.GPUs, sh.Status, sh.Lease)
		if sh.Restarts > 0 {
			w.Why += fmt.Sprintf("; restarted %d times", sh.Restarts)
			if sh.LastExit != nil {
				w.Why += fmt.Sprintf(", last exit %d", *sh.LastExit)
			}
		}
	}
	if sh.Draining {
		w.Why += "; draining: an older spec version or a replica scaled away, kept serving until the current replicas are ready"
	}
	if g := sh.Gang; g != nil {
		rank := g.Rank
		w.Rank, w.GangSize = &rank, g.Size
		// What holds the gang back: a gang serves only when every member
		// does, so the one that does not is the answer.
		if g.Note != "" && sh.Lease != placement.LeaseValid {
			w.Why += fmt.Sprintf("; gang rank %d of %d on %s: %s", g.Rank, g.Size, sh.Node, g.Note)
		}
	}
	return w
}

func summarize(in whyNotIn, out whyNotOut, known bool) string {
	unplaced := 0
	for _, w := range out.Shards {
		if !w.Placed {
			unplaced++
		}
	}
	switch {
	case in.Shard != "" && len(out.Shards) > 0:
		return out.Shards[0].Why
	case !known:
		return "deployment not found"
	case out.Replicas == 0:
		return "scaled to zero: replicas is 0, so nothing runs"
	case len(out.Shards) == 0:
		return "no shards in this node's plan yet: the spec may not have reached this node's view or the plan was not recomputed; ask again in a few seconds"
	case unplaced > 0:
		return fmt.Sprintf("%d of %d shards could not be placed; %d of %d replicas placed, %d ready", unplaced, len(out.Shards), out.Placed, out.Replicas, out.Ready)
	case out.Ready == out.Replicas:
		return fmt.Sprintf("all %d replicas placed and ready", out.Replicas)
	default:
		return fmt.Sprintf("%d of %d replicas placed, %d ready: engines are starting or restarting", out.Placed, out.Replicas, out.Ready)
	}
}

func (s *Server) load(_ context.Context, in loadIn) (any, error) {
	out := loadOut{Shards: []loadRow{}, ByDeployment: map[string]loadTotal{}}
	now := s.node.Now()
	for _, sh := range s.node.Status().Shards(now) {
		if sh.Node == "" || sh.Status == gossip.ShardPending {
			continue // nobody holds it, so nobody scraped it
		}
		if (in.Deployment != "" && sh.Deployment != in.Deployment) || (in.Node != "" && sh.Node != in.Node) {
			continue
		}
		r := loadRow{ShardID: sh.ShardID, Deployment: sh.Deployment, Node: sh.Node, Status: sh.Status, Lease: sh.Lease, Load: sh.Load}
		if !sh.Load.ScrapedAt.IsZero() {
			age := now.Sub(sh.Load.ScrapedAt).Round(100 * time.Millisecond).Seconds()
			r.AgeSeconds = &age
		}
		out.Shards = append(out.Shards, r)
		t := out.ByDeployment[sh.Deployment]
		t.Running += sh.Load.Running
		t.Waiting += sh.Load.Waiting
		t.PromptTPS += sh.Load.PromptTPS
		t.GenerationTPS += sh.Load.GenerationTPS
		if sh.Load.Knows(gossip.ReadingKVCache) {
			t.MaxKVCache = max(t.MaxKVCache, sh.Load.KVCacheUsage)
		}
		out.ByDeployment[sh.Deployment] = t
	}
	return out, nil
}

func (s *Server) place(ctx context.Context, in placeIn) (any, error) {
	if len(in.Spec) == 0 {
		return nil, errors.New("spec is empty: give at least name and model")
	}
	body, err := json.Marshal(in.Spec)
	if err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	d, err := spec.Decode(body, "application/json")
	if err != nil {
		return nil, fmt.Errorf("spec refused: %w", err)
	}
	info, err := s.node.Place(ctx, d)
	if err != nil {
		return nil, err
	}
	s.log.Info("deployment placed over MCP", "name", d.Name)
	// The spec as stored: gpu_memory: auto resolved to its figures.
	return placeOut{Placed: d.Name, SpecVersion: info.SpecVersion, Stamp: info.Stamp, Spec: info.Deployment,
		Next: "every node now places it alike; call why_not with deployment " + d.Name + " to see where it runs"}, nil
}

func (s *Server) unplace(_ context.Context, in unplaceIn) (any, error) {
	if in.Name == "" {
		return nil, fmt.Errorf("name a deployment; deployments: %s", s.deploymentNames())
	}
	switch err := s.node.Unplace(in.Name); {
	case errors.Is(err, supervisor.ErrNoDeployment):
		return nil, fmt.Errorf("no deployment named %q; deployments: %s", in.Name, s.deploymentNames())
	case err != nil:
		return nil, err
	}
	s.log.Info("deployment removed over MCP", "name", in.Name)
	return unplaceOut{Removed: in.Name}, nil
}
