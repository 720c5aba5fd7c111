package placement

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Engine profiles a deployment may name.
var engineProfiles = []string{"fake", "llamacpp", "sglang", "vllm"}

// EngineProfiles returns the engine profile names a deployment may use.
func EngineProfiles() []string { return slices.Clone(engineProfiles) }

// Deployment is what an operator asked for with `llmgw place`.
// Field names in JSON are the API's and the YAML file's.
type Deployment struct {
	Name   string `json:"name"`
	Model  string `json:"model"`
	Engine string `json:"engine,omitempty"`
	Image  string `json:"image,omitempty"`
	// Replicas is the number of serving endpoints. Zero is a real value
	// (scaled to zero: nothing runs); DecodeDeployment sets 1 when the field
	// is absent from the spec.
	Replicas int `json:"replicas"`
	// TensorParallel is the number of GPUs of one node each shard holds.
	TensorParallel int `json:"tensor_parallel,omitempty"`
	// PipelineParallel is the number of nodes one replica spans; the shards
	// of one replica are a gang, placed together or not at all.
	PipelineParallel int `json:"pipeline_parallel,omitempty"`
	// GPUMemory is the memory each shard needs on each of its GPUs. Zero
	// means the shard takes its GPUs whole.
	GPUMemory Bytes `json:"gpu_memory,omitempty"`
	// GPUMemoryAuto and TensorParallelAuto are set by DecodeDeployment for
	// `gpu_memory: auto` and `tensor_parallel: auto`. They never travel:
	// the node that accepts the place computes the figures from the
	// model's files once and stores them in GPUMemory, TensorParallel and
	// Fit, so the spec is the same on every node and placement stays pure.
	GPUMemoryAuto      bool `json:"-"`
	TensorParallelAuto bool `json:"-"`
	// MaxModelLen and MaxNumSeqs are the context of each sequence and how
	// many run at once, passed to the engine (vLLM --max-model-len and
	// --max-num-seqs). A gpu_memory: auto deployment's KV cache is sized
	// for them (0: the model's own context; as many sequences as the GPU
	// type holds, at most fit.DefaultMaxSeqs, stored here with
	// Fit.SeqsChosen); with an explicit gpu_memory the accepting node
	// checks that the share holds them when it can read the model's
	// headers.
	MaxModelLen int `json:"max_model_len,omitempty"`
	MaxNumSeqs  int `json:"max_num_seqs,omitempty"`
	// Fit is what the accepting node computed for gpu_memory: auto.
	Fit *Fit `json:"fit,omitempty"`
	// GPUType must be a substring of the GPU's name (case-insensitive).
	GPUType string            `json:"gpu_type,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// Update is how a new spec version replaces the old: "surge" (the
	// default, also when empty) starts the new version beside the old,
	// which serves until its replacement is ready; "recreate" stops the old
	// version first, a planned gap, for a replica too large to have two
	// copies at once (a TP 4 × PP 2 gang on 3 nodes).
	Update string `json:"update,omitempty"`
	// StartTimeout bounds how long an engine may start (after its image
	// is pulled) without becoming ready and without a sign of progress
	// (its log or the weights cache growing). Zero: the runner's default
	// (the node's --engine-start-timeout, 2 h unless set). It bounds only
	// a start (the vllm profile also hands it to vLLM as
	// VLLM_ENGINE_READY_TIMEOUT_S), so it stays out of the spec version:
	// changing it rolls no engine (the runner's watch of a start under way
	// takes the new value at once; vLLM's own bound, at the engine's next
	// start). No default is written into a stored spec, so a spec stored
	// before the field existed reads the same. An agent older than the
	// field drops it from the copy it relays; see gossip's supersedes for
	// why newer nodes keep theirs.
	StartTimeout Duration `json:"start_timeout,omitempty"`
	// Autoscale, when set, lets the cluster choose the replica count
	// within [Min, Max] by the load its engines report; Replicas is then
	// where it starts (and, placed again, where it stands). A spec says it
	// as replicas: {min: N, max: M}; a plain replicas: N leaves it nil,
	// a fixed count. Like Replicas and StartTimeout it stays out of the
	// spec version: scaling rolls no engine. Its fields need cluster
	// protocol 5 (fieldVersions).
	Autoscale *Autoscale `json:"autoscale,omitempty"`
	// Priority orders deployments for GPU sharing (share.go): when a
	// deployment with demand does not fit, idle replicas of autoscaled
	// deployments above their min give their GPUs up, lowest priority
	// first. From MinPriority to MaxPriority, 0 when unset. Like Replicas
	// it stays out of the spec version (it restarts nothing); it needs
	// cluster protocol 6.
	Priority int `json:"priority,omitempty"`
	// MaxLoras switches LoRA on: how many adapters one batch may hold
	// (vLLM --max-loras, SGLang --max-loras-per-batch), and MaxLoraRank
	// the largest adapter rank (0: 16). Start flags that size the
	// engine's buffers, so part of the spec version. See lora.go.
	MaxLoras    int `json:"max_loras,omitempty"`
	MaxLoraRank int `json:"max_lora_rank,omitempty"`
	// Adapters are registered on every replica at runtime, so they stay
	// out of the spec version (adding one restarts nothing), except for
	// llama.cpp, which takes them only at start. See lora.go.
	Adapters []Adapter `json:"adapters,omitempty"`
	// Prefill and Decode split the deployment into roles (prefill/decode
	// disaggregation, roles.go); both or neither. Replicas is then their
	// sum. Transfer is how the KV cache moves between them. Protocol 7.
	Prefill  *Role     `json:"prefill,omitempty"`
	Decode   *Role     `json:"decode,omitempty"`
	Transfer *Transfer `json:"transfer,omitempty"`
}

// The bounds of Deployment.Priority.
const (
	MinPriority = -1000
	MaxPriority = 1000
)

// Autoscale is how an autoscaled deployment's replica count moves.
type Autoscale struct {
	Min int `json:"min"`
	Max int `json:"max"`
	// TargetInflight is the running plus waiting requests per replica
	// aimed at (0: max_num_seqs when set, else 8).
	TargetInflight int `json:"target_inflight,omitempty"`
	// ScaleDownDelay is how long demand must stay low before a replica
	// goes (0: 5 min).
	ScaleDownDelay Duration `json:"scale_down_delay,omitempty"`
	// IdleWindow is, with Min 0, how long the deployment must see no
	// request at any gateway and none running or waiting in its engines
	// before its last replica goes (0: 10 min). It governs that last step,
	// not ScaleDownDelay.
	IdleWindow Duration `json:"idle_window,omitempty"`
}

// MaxScaleDownDelay is the longest scale_down_delay a deployment may ask
// for.
const MaxScaleDownDelay = 24 * time.Hour

// MaxStartTimeout is the longest start_timeout a deployment may ask for.
const MaxStartTimeout = 7 * 24 * time.Hour

// The update strategies a deployment may name.
const (
	UpdateSurge    = "surge"
	UpdateRecreate = "recreate"
)

// WithDefaults returns d with unset optional fields filled in.
//
// Replicas is left alone: 0 is a valid request (scale to zero) that Validate
// accepts, and a default here would make it impossible to express.
// DecodeDeployment, which can tell an absent field from an explicit 0,
// defaults it to 1.
func (d Deployment) WithDefaults() Deployment {
	if d.Engine == "" {
		d.Engine = "vllm"
	}
	if d.TensorParallel == 0 {
		d.TensorParallel = 1
	}
	if d.PipelineParallel == 0 {
		d.PipelineParallel = 1
	}
	d.rolesWithDefaults()
	return d
}

var (
	dnsLabel  = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	labelKey  = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,126}[A-Za-z0-9])?$`)
	envName   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	maxShards = 10000
)

// Bounds on a spec's maps, so that every valid spec fits the decoder's
// MaxSpecValues with room to spare, written as YAML or as JSON.
const (
	maxLabels = 256
	maxEnv    = 1024
)

// FieldError names the field that is wrong, the value, and what is allowed.
type FieldError struct {
	Field string
	Value string
	Want  string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s: invalid value %q: %s", e.Field, e.Value, e.Want)
}

// ValidateName checks a deployment name: a DNS label, so it is safe in
// URLs, file names and container labels as it is.
func ValidateName(name string) error {
	if !dnsLabel.MatchString(name) {
		return &FieldError{Field: "name", Value: name, Want: "a DNS label: 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit"}
	}
	return nil
}

// Validate checks a deployment after WithDefaults. The error names the first
// bad field, the value and what is allowed.
func (d Deployment) Validate() error {
	bad := func(field, value, want string) error { return &FieldError{Field: field, Value: value, Want: want} }
	if err := ValidateName(d.Name); err != nil {
		return err
	}
	if strings.TrimSpace(d.Model) == "" || len(d.Model) > 512 || strings.ContainsAny(d.Model, "\x00\n") {
		return bad("model", d.Model, "a model id such as meta-llama/Llama-3.1-8B-Instruct or a path, at most 512 characters")
	}
	if !slices.Contains(engineProfiles, d.Engine) {
		return bad("engine", d.Engine, "one of "+strings.Join(engineProfiles, ", "))
	}
	if len(d.Image) > 512 || strings.ContainsAny(d.Image, " \t\n\x00") {
		return bad("image", d.Image, "an image reference without spaces, at most 512 characters")
	}
	if d.Replicas < 0 || d.Replicas > 1000 {
		return bad("replicas", strconv.Itoa(d.Replicas), "an integer from 0 to 1000")
	}
	if d.TensorParallel < 1 || d.TensorParallel > 64 {
		return bad("tensor_parallel", strconv.Itoa(d.TensorParallel), "an integer from 1 to 64 (GPUs of one node per shard)")
	}
	if d.PipelineParallel < 1 || d.PipelineParallel > 64 {
		return bad("pipeline_parallel", strconv.Itoa(d.PipelineParallel), "an integer from 1 to 64 (nodes per replica)")
	}
	if d.Update != "" && d.Update != UpdateSurge && d.Update != UpdateRecreate {
		return bad("update", d.Update, "surge (the default: the new version starts beside the old, which serves until it is ready) or recreate (the old version stops first: a planned gap, for replicas too large to surge)")
	}
	if d.Engine == "llamacpp" && d.PipelineParallel > 1 {
		return bad("pipeline_parallel", strconv.Itoa(d.PipelineParallel), "1 with engine llamacpp: llama.cpp has no multi-node launch (it splits a model over one node's GPUs only); use engine vllm or sglang to span nodes")
	}
	if d.Replicas*d.PipelineParallel > maxShards {
		return bad("replicas", strconv.Itoa(d.Replicas), fmt.Sprintf("replicas × pipeline_parallel at most %d shards", maxShards))
	}
	if d.GPUMemory > 0 && d.GPUMemory < 1<<20 {
		return bad("gpu_memory", d.GPUMemory.String(), "at least 1MiB, e.g. 70GiB (or unset for whole GPUs)")
	}
	if d.MaxModelLen < 0 || d.MaxModelLen > 1<<24 {
		return bad("max_model_len", strconv.Itoa(d.MaxModelLen), "a context length from 1 to 16777216 tokens (or leave it out: the model's own)")
	}
	if d.MaxNumSeqs < 0 || d.MaxNumSeqs > 1<<16 {
		return bad("max_num_seqs", strconv.Itoa(d.MaxNumSeqs), "from 1 to 65536 concurrent sequences (or leave it out: with gpu_memory auto as many as the GPU holds, up to 16; else the engine's own limit)")
	}
	if d.StartTimeout < 0 || time.Duration(d.StartTimeout) > MaxStartTimeout {
		return bad("start_timeout", d.StartTimeout.String(), "a duration above 0 and at most 168h (7 days), such as 2h (or unset: 2h)")
	}
	if err := d.validateLoRA(); err != nil {
		return err
	}
	if err := d.validateRoles(); err != nil {
		return err
	}
	if d.Priority < MinPriority || d.Priority > MaxPriority {
		return bad("priority", strconv.Itoa(d.Priority), fmt.Sprintf("an integer from %d to %d (higher keeps its GPUs longer when the cluster shares them; or leave it out: 0)", MinPriority, MaxPriority))
	}
	if a := d.Autoscale; a != nil {
		if err := a.validate(d.Replicas); err != nil {
			return err
		}
	}
	if d.Fit != nil {
		if err := d.Fit.validate(); err != nil {
			return err
		}
	}
	if len(d.GPUType) > 64 {
		return bad("gpu_type", d.GPUType, "a substring of a GPU name such as H100, at most 64 characters")
	}
	if len(d.Labels) > maxLabels {
		return bad("labels", strconv.Itoa(len(d.Labels)), fmt.Sprintf("at most %d labels", maxLabels))
	}
	for _, k := range sortedKeys(d.Labels) {
		if !labelKey.MatchString(k) {
			return bad("labels", k, "keys of letters, digits, '.', '_', '/' or '-'")
		}
		if len(d.Labels[k]) > 256 {
			return bad("labels."+k, d.Labels[k], "a value of at most 256 characters")
		}
	}
	if len(d.Args) > 256 {
		return bad("args", strconv.Itoa(len(d.Args)), "at most 256 arguments")
	}
	for i, a := range d.Args {
		if len(a) > 4096 || strings.ContainsRune(a, 0) {
			return bad(fmt.Sprintf("args[%d]", i), a, "at most 4096 characters and no NUL byte")
		}
	}
	if len(d.Env) > maxEnv {
		return bad("env", strconv.Itoa(len(d.Env)), fmt.Sprintf("at most %d variables", maxEnv))
	}
	for _, k := range sortedKeys(d.Env) {
		if !envName.MatchString(k) {
			return bad("env", k, "variable names of letters, digits and '_', not starting with a digit")
		}
		if len(d.Env[k]) > 4096 || strings.ContainsRune(d.Env[k], 0) {
			return bad("env."+k, d.Env[k], "a value of at most 4096 characters and no NUL byte")
		}
	}
	return nil
}

// SpecVersion is a short hash of everything that changes how a shard runs.
// Replicas is left out on purpose: scaling must not restart the replicas
// that already serve.
func (d Deployment) SpecVersion() string {
	d = d.WithDefaults()
	// How a version is replaced does not change how it runs: switching
	// to recreate must not itself recreate everything.
	d.Replicas, d.Update, d.StartTimeout, d.Autoscale, d.Priority = 0, "", 0, nil, 0
	if !d.AdaptersAtStart() {
		d.Adapters = nil // registered at runtime: adding one restarts nothing
	}
	// A role's count scales like replicas; the gateways' P/D settings
	// and the placement preference (domain) restart nothing. A role's
	// image equals the deployment's.
	for _, r := range []**Role{&d.Prefill, &d.Decode} {
		if *r != nil {
			c := **r
			c.Replicas, c.Image = 0, ""
			*r = &c
		}
	}
	if d.Transfer != nil {
		t := *d.Transfer
		t.Fallback, t.SkipBelow, t.Domain = false, 0, ""
		d.Transfer = &t
		if t == (Transfer{}) {
			d.Transfer = nil // as a spec without it: setting fallback restarts nothing
		}
	}
	// json.Marshal sorts map keys, so the hash is stable.
	b, err := json.Marshal(d)
	if err != nil {
		// Deployment has only marshalable fields; this cannot happen.
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:12]
}

// ReplicaID names replica i of deployment name.
func ReplicaID(deployment string, i int) string { return deployment + "-" + strconv.Itoa(i) }

// ShardID names shard j of a replica: the replica's own ID when the
// deployment has one shard per replica.
func ShardID(replica string, j, pipelineParallel int) string {
	if pipelineParallel <= 1 {
		return replica
	}
	return replica + "-s" + strconv.Itoa(j)
}

// EngineID names the engine of one (shard, spec version) on a node: its
// process or container, its state file and log, and its API key (derived
// from the cluster token and this ID) are all named by it, so the runner
// that starts it and the gateway and tools that call it must agree.
func EngineID(shard, specVersion string) string { return shard + "-" + specVersion }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Fit is the breakdown behind a gpu_memory: auto figure, per GPU, as the
// accepting node computed it (placement/fit), kept so every node shows the
// same numbers in reasons and views.
type Fit struct {
	Params          uint64 `json:"params"`
	WeightsBytes    uint64 `json:"weights_bytes"`
	KVBytesPerToken uint64 `json:"kv_bytes_per_token"`
	// Per GPU: the weights' share, the KV cache for max_num_seqs
	// sequences of max_model_len tokens, and the stated overhead.
	Weights  uint64 `json:"weights_per_gpu"`
	KVCache  uint64 `json:"kv_cache_per_gpu"`
	Overhead uint64 `json:"overhead_per_gpu"`
	// Source says where the headers came from: "local", "node NAME" or
	// the hub.
	Source string `json:"source,omitempty"`
	// SeqsChosen: the spec named no max_num_seqs, so the accepting node
	// chose MaxNumSeqs (fit.ChooseSeqs) to size the KV cache. The figure
	// is then how much memory to ask for, not a limit the user set:
	// engines that size their KV cache from their memory (vLLM, SGLang)
	// get no concurrency flag, llama.cpp gets -np with it.
	SeqsChosen bool `json:"seqs_chosen,omitempty"`
}

// validate checks the autoscaling fields against the replicas a spec
// starts at; the errors name the fields as a spec writes them.
func (a Autoscale) validate(replicas int) error {
	bad := func(field string, value int, want string) error {
		return &FieldError{Field: field, Value: strconv.Itoa(value), Want: want}
	}
	switch {
	case a.Min < 0 || a.Min > 1000:
		return bad("replicas.min", a.Min, "an integer from 0 to 1000 (0: scaled to zero when idle, woken by a request)")
	case a.Max < 1 || a.Max > 1000:
		return bad("replicas.max", a.Max, "an integer from 1 to 1000")
	case a.Min > a.Max:
		return bad("replicas.min", a.Min, fmt.Sprintf("at most replicas.max (%d)", a.Max))
	case a.TargetInflight < 0 || a.TargetInflight > 1<<16:
		return bad("target_inflight", a.TargetInflight, "from 1 to 65536 requests per replica (or leave it out: max_num_seqs, else 8)")
	case replicas < a.Min || replicas > a.Max:
		return bad("replicas", replicas, fmt.Sprintf("within replicas.min and replicas.max (%d to %d) on an autoscaled deployment", a.Min, a.Max))
	}
	if a.ScaleDownDelay < 0 || time.Duration(a.ScaleDownDelay) > MaxScaleDownDelay {
		return &FieldError{Field: "scale_down_delay", Value: a.ScaleDownDelay.String(), Want: "a duration from 1s to 24h (or leave it out: 5m)"}
	}
	if a.IdleWindow < 0 || time.Duration(a.IdleWindow) > MaxScaleDownDelay {
		return &FieldError{Field: "idle_window", Value: a.IdleWindow.String(), Want: "a duration from 1s to 24h (or leave it out: 10m)"}
	}
	if a.IdleWindow != 0 && a.Min > 0 {
		return &FieldError{Field: "idle_window", Value: a.IdleWindow.String(), Want: "only with replicas.min 0: it is how long an idle deployment waits before its last replica goes"}
	}
	return nil
}

func (f Fit) validate() error {
	if len(f.Source) > 256 || strings.ContainsAny(f.Source, "\x00\n") {
		return &FieldError{Field: "fit.source", Value: f.Source, Want: "at most 256 characters on one line"}
	}
	return nil
}

// String is the breakdown as reasons show it.
func (f Fit) String() string {
	g := func(b uint64) string { return strconv.FormatFloat(float64(b)/(1<<30), 'f', 1, 64) + " GiB" }
	return g(f.Weights) + " weights + " + g(f.KVCache) + " KV cache + " + g(f.Overhead) + " overhead"
}

// FieldVersion is a spec field that not every cluster protocol version
// knows, and the first version that does.
type FieldVersion struct {
	// Field is the field's name in the API and in YAML.
	Field string
	// Protocol is the first cluster protocol version (internal/protocol)
	// whose agents decode the field.
	Protocol int
}

// fieldVersion is one row of fieldVersions.
type fieldVersion struct {
	FieldVersion
	set func(Deployment) bool
}

// fieldVersions lists every spec field newer than protocol 1, with the
// version that brought it. An agent of an older version decodes a spec
// without such a field: it would run the deployment without it, and
// relay its stripped copy. So a place that sets one is refused until the
// cluster runs its version, and a new field joins this table with the
// version bump that brings it. (Placement imports nothing of the module,
// so the versions are numbers here: 2 is protocol.V2.)
func fieldVersions() []fieldVersion {
	return []fieldVersion{
		{FieldVersion{Field: "start_timeout", Protocol: 2}, func(d Deployment) bool { return d.StartTimeout != 0 }},
		{FieldVersion{Field: "fit.seqs_chosen", Protocol: 3}, func(d Deployment) bool { return d.Fit != nil && d.Fit.SeqsChosen }},
		{FieldVersion{Field: "autoscale", Protocol: 5}, func(d Deployment) bool { return d.Autoscale != nil }},
		{FieldVersion{Field: "priority", Protocol: 6}, func(d Deployment) bool { return d.Priority != 0 }},
		{FieldVersion{Field: "max_loras", Protocol: 6}, func(d Deployment) bool { return d.MaxLoras != 0 }},
		{FieldVersion{Field: "max_lora_rank", Protocol: 6}, func(d Deployment) bool { return d.MaxLoraRank != 0 }},
		{FieldVersion{Field: "adapters", Protocol: 6}, func(d Deployment) bool { return len(d.Adapters) > 0 }},
		{FieldVersion{Field: "prefill", Protocol: 7}, func(d Deployment) bool { return d.Prefill != nil }},
		{FieldVersion{Field: "decode", Protocol: 7}, func(d Deployment) bool { return d.Decode != nil }},
		{FieldVersion{Field: "transfer", Protocol: 7}, func(d Deployment) bool { return d.Transfer != nil }},
	}
}

// FieldsAbove lists the fields set in d that cluster protocol version v
// does not know, each with the version it needs, in a fixed order. Empty:
// every node of a cluster at v reads d as it is.
func (d Deployment) FieldsAbove(v int) []FieldVersion {
	var out []FieldVersion
	for _, f := range fieldVersions() {
		if f.Protocol > v && f.set(d) {
			out = append(out, f.FieldVersion)
		}
	}
	return out
}
