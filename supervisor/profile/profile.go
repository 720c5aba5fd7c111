// Package profile describes inference engines as data: the image, a command
// template, the environment, and the HTTP paths and metric names llmgw reads.
// The supervisor resolves a profile against a deployment to get the argv and
// environment a runtime starts; no code path depends on which engine it is.
//
// Templates are Go text/template strings evaluated against Data. An element
// of Command or Env that renders to the empty string is dropped, which is how
// an optional flag is written: `{{if .GPUMemoryUtilization}}--flag={{.GPUMemoryUtilization}}{{end}}`.
// For an engine whose parser does not take --flag=value (llama.cpp's), the
// flag and its value are two elements that are both empty without the
// value: `{{if .Flag}}--flag{{end}}`, `{{.Flag}}`. The engine's API key goes
// in the variable Profile.KeyEnv names where the engine reads one.
package profile

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/load"
)

// Metrics names the Prometheus series llmgw's engine probe reads. Empty
// means the engine does not export it.
type Metrics struct {
	Running string `json:"running,omitempty"`
	Waiting string `json:"waiting,omitempty"`
	// KVCacheUsage is a 0..1 gauge; KVCacheUsageFallback is read when the
	// first is absent (older engine releases).
	KVCacheUsage         string `json:"kv_cache_usage,omitempty"`
	KVCacheUsageFallback string `json:"kv_cache_usage_fallback,omitempty"`
	PromptTokens         string `json:"prompt_tokens,omitempty"`
	GenerationTokens     string `json:"generation_tokens,omitempty"`
	// PrefixCacheHits and PrefixCacheQueries are the prefix cache's
	// counters in tokens, for its hit rate; empty when the engine has none.
	PrefixCacheHits    string `json:"prefix_cache_hits,omitempty"`
	PrefixCacheQueries string `json:"prefix_cache_queries,omitempty"`
	// ModelLabel is the label that carries the served model name.
	ModelLabel string `json:"model_label,omitempty"`
	// LoRAInfo is the gauge of the engine's LoRA slots in use (vLLM's
	// vllm:lora_requests_info); empty when it has none.
	LoRAInfo string `json:"lora_info,omitempty"`
}

// How a request names a LoRA adapter to an engine (Profile.LoRARequest).
const (
	LoRAByName    = "name"
	LoRABaseColon = "base:adapter"
	LoRAByIndex   = "index"
)

// Profile is one engine kind.
type Profile struct {
	Name string `json:"name"`
	// Image is the default container image; a deployment's image wins.
	// Empty for engines that only run as host processes.
	Image string `json:"image,omitempty"`
	// Command is the full argv, each element a template. It overrides the
	// image's entrypoint, so argv[0] must exist in the image (or on the
	// host's PATH for the process runtime; Inputs.Program replaces it).
	Command []string `json:"command"`
	// Env elements are KEY=VALUE templates; the deployment's env wins over
	// them.
	Env []string `json:"env,omitempty"`
	// KeyEnv names the environment variable the engine reads its API key
	// from (vLLM's VLLM_API_KEY, llama.cpp's LLAMA_API_KEY). The key then
	// travels in the engine's environment, which only its user and root
	// can read, not on its command line, which every local user can
	// (/proc/PID/cmdline, ps); it wins over a deployment's env of that
	// name. Empty: the command carries {{.APIKey}} itself (SGLang reads
	// its key from no variable).
	KeyEnv string `json:"key_env,omitempty"`
	// Paths llmgw probes. Readiness is HealthPath answering 200 and
	// ModelsPath listing the served name.
	HealthPath string `json:"health_path"`
	ModelsPath string `json:"models_path"`
	// LoRALoadPath and LoRAUnloadPath are the engine's endpoints that
	// register and drop a LoRA adapter at runtime (POST {"lora_name",
	// "lora_path"} and {"lora_name"}); empty for an engine that takes
	// adapters only at start. Registered adapters are read back from
	// ModelsPath: entries whose parent is the served model.
	LoRALoadPath   string `json:"lora_load_path,omitempty"`
	LoRAUnloadPath string `json:"lora_unload_path,omitempty"`
	// LoRARequest is how a request names an adapter to the engine:
	// LoRAByName (model is the adapter's name: vLLM), LoRABaseColon
	// (model is "<served>:<adapter>": SGLang) or LoRAByIndex (model is
	// the served name, and "lora": [{"id", "scale"}] turns the adapter
	// on by its place in the start flags: llama.cpp).
	LoRARequest string  `json:"lora_request,omitempty"`
	MetricsPath string  `json:"metrics_path,omitempty"`
	Metrics     Metrics `json:"metrics"`
	// Readiness is how busy this engine may look before llmgw calls it
	// dead, and how long the gateway waits on it (see Readiness).
	Readiness Readiness `json:"readiness"`
	// MemoryFraction says what Data.GPUMemoryUtilization is a fraction
	// of: FractionOfTotal (empty: the default) or FractionOfFreeStatic.
	MemoryFraction string `json:"memory_fraction,omitempty"`
	// Files are files the engine reads, name → template (rendered with
	// Data, as Command): the runner writes each 0600 into Inputs.FilesDir,
	// its own directory for this engine, before the start, and a command
	// names one as {{.FilesDir}}/NAME. A secret goes there rather than on
	// the command line, which every local user can read (SGLang's key, in
	// the YAML its --config takes). A file that renders empty is not
	// written.
	Files map[string]string `json:"files,omitempty"`
}

// Readiness is one engine kind's tolerance: real engines answer their
// health check slowly when busy (vLLM's shares the event loop with
// generation; SGLang's runs a generation), so one slow or failed probe
// says nothing. The rule (supervisor/engine, judge.go): an engine stops
// being routable when its process is gone, or when Failures probes in a
// row failed or timed out AND its token counters (prompt plus generation
// tokens, Metrics.PromptTokens and GenerationTokens) did not move during
// the last ProgressWindow. An engine that stays so for HungRestart after
// having been ready is restarted. A truly hung engine therefore leaves
// routing within about Failures × (ProbeTimeout + poll) (or ProgressWindow
// when that is longer), and is restarted HungRestart later.
type Readiness struct {
	// ProbeTimeout bounds one health (and models) probe.
	ProbeTimeout time.Duration `json:"probe_timeout"`
	// Failures is K: probes failed or timed out in a row.
	Failures int `json:"failures"`
	// ProgressWindow is W: counters that moved within it keep a slow
	// engine routable whatever its probes say.
	ProgressWindow time.Duration `json:"progress_window"`
	// HungRestart is R: not routable and no progress for this long,
	// after having been ready, and the engine is restarted (a crash).
	HungRestart time.Duration `json:"hung_restart"`
	// FirstByteTimeout bounds, at the gateway, the wait for an answer's
	// first byte: long enough for a full-context prefill behind a queue.
	FirstByteTimeout time.Duration `json:"first_byte_timeout"`
	// StreamIdleTimeout bounds, at the gateway, the gap between two
	// events of a streamed answer (or two reads of a plain one).
	StreamIdleTimeout time.Duration `json:"stream_idle_timeout"`
}

// HangBound is how long a truly hung engine (no answer, no progress)
// stays routable at most, polled every poll: K probes that each time out,
// or the progress window when that is longer.
func (r Readiness) HangBound(poll time.Duration) time.Duration {
	return max(time.Duration(r.Failures)*(r.ProbeTimeout+poll), r.ProgressWindow)
}

// Inputs are the facts of this node and this shard a profile needs beyond
// the deployment.
type Inputs struct {
	// AdapterPaths are the deployment's LoRA adapters as the engine
	// reads them (each source resolved on this node: AdapterPath), in
	// the spec's order, for an engine that takes them only at start
	// (llama.cpp's --lora).
	AdapterPaths []string
	// Port is the engine's HTTP port and Host the address it binds
	// ("0.0.0.0" when empty: other nodes route to it).
	Port int
	Host string
	// GPUMemoryTotal is the memory of one of the shard's GPUs in bytes. With
	// the deployment's per-GPU memory it gives the engine's memory fraction;
	// zero leaves the engine's own default.
	GPUMemoryTotal uint64
	// Self is the path of the running llmgw binary (the fake engine).
	Self string
	// Program, when set, replaces argv[0]: the host path of an engine
	// installed outside a container.
	Program string
	// WeightsDir is the weights cache (bind-mounted in containers).
	WeightsDir string
	// ShardIndex is the shard's position in its replica (pipeline stage).
	ShardIndex int
	// APIKey is the key the engine must demand on its API (see
	// internal/secret.EngineKey): whoever calls the engine's /v1/* presents
	// it as a bearer token. Empty: the engine runs without a key.
	APIKey string
	// Gang is set for a member of a replica that spans nodes
	// (pipeline_parallel above 1); nil for a replica of one shard.
	Gang *GangInputs
	// HostIP is the node's advertised address and NetIface the interface
	// that carries it ("" when none does): a gang's engines bind their
	// collective traffic to it (VLLM_HOST_IP, NCCL_SOCKET_IFNAME,
	// GLOO_SOCKET_IFNAME), or NCCL may pick an interface peers cannot
	// reach.
	HostIP   string
	NetIface string
	// StartTimeout is how long the runner lets the engine start (the
	// deployment's start_timeout, or its default); 0 leaves the engine's
	// own start-up limits alone.
	StartTimeout time.Duration
	// GPUFree is the free memory of each of the shard's GPUs, in bytes,
	// read from NVML just before the start, in the order of the shard's
	// GPUs; nil when unknown (simulated GPUs). An engine whose memory flag
	// is a fraction of free memory (SGLang) is sized from it.
	GPUFree []uint64
	// RDMADevices are the node's RDMA devices (mlx5_0, ...), from the
	// interconnect probe; nil when it has none. A gang's collectives use
	// them (NCCL_IB_HCA).
	RDMADevices []string
	// CacheDir is a directory under the data dir for the engines' compile
	// caches, bind-mounted into containers like the weights dir ("" when
	// none).
	CacheDir string
	// ClusterVersion is the cluster protocol version (internal/protocol)
	// of the node's reconcile pass that started a gang member: every rank
	// of a gang must launch alike, so a layout that changed between
	// versions follows it. 0 means the newest this build speaks.
	ClusterVersion int
	// FilesDir is the directory the runner writes Profile.Files into
	// (visible at the same path in a container); "" when the runner
	// writes none, and a profile then falls back to what needs no file.
	FilesDir string
	// OTLPTracesEndpoint is the OTLP/HTTP URL (ending in /v1/traces) an
	// engine that traces itself sends its spans to; "" when it traces
	// nothing. A node setting (llmgw node up --otlp-engines), like the
	// rest of Inputs: no spec version sees it, so turning it on restarts
	// no engine that runs, and each start after that carries it.
	OTLPTracesEndpoint string
	// Role is the engine's role in a disaggregated deployment
	// (placement.RolePrefill or RoleDecode; "" in any other). KVPort is
	// the first of its KV transfer ports (one per tensor-parallel rank)
	// and KVHost the node's address, where the other role reaches them.
	// TransferBackend and NIC are the deployment's transfer settings.
	Role            string
	KVPort          int
	KVHost          string
	TransferBackend string
	NIC             string
}

// GangInputs is one member's place in its gang: the engines' own
// multi-node flags are written from it.
type GangInputs struct {
	// NNodes is the gang's size and Rank this member's rank (its shard
	// index; rank 0 serves HTTP and hosts the rendezvous).
	NNodes, Rank int
	// MasterAddr and MasterPort are rank 0's rendezvous address, as rank
	// 0's node published it.
	MasterAddr string
	MasterPort int
}

// newestClusterVersion is the newest cluster protocol version whose rules
// the profiles know (internal/protocol.Max; profile imports no module
// package beyond its allow-list, so it is a number here).
const newestClusterVersion = 7

// Data is what templates see.
type Data struct {
	// Model is the deployment's model (a hub id or a path).
	Model string
	// ServedName is the name clients address: the deployment name.
	ServedName string
	Port       int
	Host       string
	TP         int
	PP         int
	ShardIndex int
	// GPUMemoryUtilization is the fraction of each GPU the engine may take,
	// formatted with two decimals ("0.45"), or empty when unset.
	GPUMemoryUtilization string
	WeightsDir           string
	Self                 string
	// APIKey is Inputs.APIKey; empty when the engine runs without a key.
	APIKey string
	// MaxModelLen and MaxNumSeqs are the deployment's (0: unset), which a
	// gpu_memory: auto figure was computed for: the engine must not cache
	// more than that memory holds.
	MaxModelLen int
	MaxNumSeqs  int
	// MaxNumSeqsGiven is whether the user gave max_num_seqs (llmgw did
	// not choose it: placement.Fit.SeqsChosen). An engine that bounds its
	// concurrency by its KV cache (vLLM, SGLang) is given a cap only then.
	MaxNumSeqsGiven bool
	// NNodes is the number of nodes the replica spans (1 for a replica of
	// one shard; the gang fields below are then zero), NodeRank this
	// member's rank, MasterAddr and MasterPort rank 0's rendezvous, and
	// Headless whether this member serves no HTTP (every rank but 0).
	NNodes     int
	NodeRank   int
	MasterAddr string
	MasterPort int
	Headless   bool
	// TPTotal is TP × NNodes: the tensor-parallel size of an engine that
	// counts every GPU of the gang in it (SGLang's --tp-size).
	TPTotal int
	// MasterHostPort is MasterAddr:MasterPort with an IPv6 address in
	// brackets ("[fd00::1]:29500"), for an engine that takes them as one
	// value (SGLang's --dist-init-addr).
	MasterHostPort string
	// RDMADevices is Inputs.RDMADevices joined by commas (NCCL_IB_HCA's
	// form); CacheDir Inputs.CacheDir and FilesDir Inputs.FilesDir.
	RDMADevices string
	CacheDir    string
	FilesDir    string
	// HostIP and NetIface are Inputs.HostIP and Inputs.NetIface.
	HostIP   string
	NetIface string
	// StartTimeoutSeconds is Inputs.StartTimeout in whole seconds (0:
	// unset), for an engine's own start-up wait.
	StartTimeoutSeconds int
	// ClusterVersion is Inputs.ClusterVersion, 0 read as the newest.
	ClusterVersion int
	// OTLPTracesEndpoint is Inputs.OTLPTracesEndpoint.
	OTLPTracesEndpoint string
	// MaxLoras and MaxLoraRank are the deployment's LoRA sizes (0: LoRA
	// off; the rank filled in, 16, when LoRA is on), and LoraPaths the
	// adapters' paths joined by commas (Inputs.AdapterPaths), for an
	// engine that loads them at start.
	MaxLoras    int
	MaxLoraRank int
	LoraPaths   string
	// Role, KVPort, KVHost, TransferBackend and NIC are Inputs'.
	Role            string
	KVPort          int
	KVHost          string
	TransferBackend string
	NIC             string
}

// Resolve renders p for deployment d on this node: the argv (the profile's
// command, then the deployment's args), the environment (the profile's, then
// the deployment's, sorted by name; later wins per name) and the image.
func Resolve(p Profile, d placement.Deployment, in Inputs) (cmd []string, env []string, image string, err error) {
	data, err := dataFor(p, d, in)
	if err != nil {
		return nil, nil, "", err
	}
	d = d.WithDefaults()

	// argv[0] is rendered on its own: dropping it when empty would promote
	// the first argument to the program.
	prog, err := render(p.Name+" command", p.Command[:1], 0, data)
	if err != nil {
		return nil, nil, "", err
	}
	if in.Program != "" {
		prog = []string{in.Program}
	}
	if len(prog) == 0 {
		return nil, nil, "", fmt.Errorf("profile %q: command %q renders to no program", p.Name, p.Command[0])
	}
	args, err := render(p.Name+" command", p.Command[1:], 1, data)
	if err != nil {
		return nil, nil, "", err
	}
	cmd = slices.Concat(prog, args, d.Args)

	penv, err := render(p.Name+" env", p.Env, 0, data)
	if err != nil {
		return nil, nil, "", err
	}
	over := d.Env
	if p.KeyEnv != "" && in.APIKey != "" {
		// Over the deployment's env too: a deployment that named the
		// variable would otherwise give the engine a key no gateway
		// presents.
		over = maps.Clone(d.Env)
		if over == nil {
			over = map[string]string{}
		}
		over[p.KeyEnv] = in.APIKey
	}
	env, err = mergeEnv(penv, over)
	if err != nil {
		return nil, nil, "", fmt.Errorf("profile %q: %w", p.Name, err)
	}

	image = p.Image
	if d.Image != "" {
		image = d.Image
	}
	return cmd, env, image, nil
}

// dataFor is what p's templates see for deployment d on this node.
func dataFor(p Profile, d placement.Deployment, in Inputs) (Data, error) {
	var err error
	d = d.WithDefaults()
	if len(p.Command) == 0 {
		return Data{}, fmt.Errorf("profile %q: empty command", p.Name)
	}
	if in.Port <= 0 || in.Port > 65535 {
		return Data{}, fmt.Errorf("profile %q: port %d out of range", p.Name, in.Port)
	}
	data := Data{
		Model: d.Model, ServedName: d.Name, Port: in.Port, Host: in.Host,
		TP: d.TensorParallel, PP: d.PipelineParallel, ShardIndex: in.ShardIndex,
		WeightsDir: in.WeightsDir, Self: in.Self, APIKey: in.APIKey,
		MaxModelLen: d.MaxModelLen, MaxNumSeqs: d.MaxNumSeqs,
		MaxNumSeqsGiven: d.MaxNumSeqs > 0 && (d.Fit == nil || !d.Fit.SeqsChosen),
		RDMADevices:     strings.Join(in.RDMADevices, ","), CacheDir: in.CacheDir, FilesDir: in.FilesDir,
		NNodes: 1, TPTotal: d.TensorParallel, HostIP: in.HostIP, NetIface: in.NetIface,
		StartTimeoutSeconds: int(in.StartTimeout / time.Second),
		ClusterVersion:      cmp.Or(in.ClusterVersion, newestClusterVersion),
		OTLPTracesEndpoint:  in.OTLPTracesEndpoint,
		MaxLoras:            d.MaxLoras,
		LoraPaths:           strings.Join(in.AdapterPaths, ","),
		Role:                in.Role, KVPort: in.KVPort, KVHost: in.KVHost,
		TransferBackend: in.TransferBackend, NIC: in.NIC,
	}
	if in.Role != "" && (in.KVPort < 0 || in.KVPort > 65535 || in.KVHost == "") {
		// No silent loopback: a prefill on another node than its decode
		// must name an address the decode reaches.
		return Data{}, fmt.Errorf("profile %q: role %s needs the node's address (--host an IP) and a KV transfer port (got %q, %d)", p.Name, in.Role, in.KVHost, in.KVPort)
	}
	if d.MaxLoras > 0 {
		data.MaxLoraRank = cmp.Or(d.MaxLoraRank, placement.DefaultLoraRank)
	}
	if d.PipelineParallel > 1 {
		g := in.Gang
		if g == nil || g.NNodes != d.PipelineParallel || g.Rank < 0 || g.Rank >= g.NNodes || g.MasterAddr == "" || g.MasterPort <= 0 || g.MasterPort > 65535 {
			return Data{}, fmt.Errorf("profile %q: pipeline_parallel %d needs the gang's size, this member's rank and rank 0's rendezvous address (got %+v)", p.Name, d.PipelineParallel, g)
		}
		data.NNodes, data.NodeRank, data.MasterAddr, data.MasterPort = g.NNodes, g.Rank, g.MasterAddr, g.MasterPort
		data.Headless = g.Rank > 0
		data.TPTotal = d.TensorParallel * g.NNodes
		data.MasterHostPort = net.JoinHostPort(g.MasterAddr, strconv.Itoa(g.MasterPort))
	}
	if data.Host == "" {
		data.Host = "0.0.0.0"
	}
	if d.GPUMemory > 0 && in.GPUMemoryTotal > 0 {
		switch {
		case p.MemoryFraction == FractionOfFreeStatic && in.GPUFree != nil:
			// The engine's pipeline stages are its nodes: SGLang's
			// pp_size is the gang's size.
			data.GPUMemoryUtilization, err = sglangFraction(uint64(d.GPUMemory), in.GPUMemoryTotal, in.GPUFree, d.TensorParallel, data.NNodes)
		default:
			// Without a free-memory reading (simulated GPUs) a
			// free-static engine gets the share of total memory, as
			// before: its GPU is then as free as placement believes.
			data.GPUMemoryUtilization, err = utilization(uint64(d.GPUMemory), in.GPUMemoryTotal)
		}
		if err != nil {
			return Data{}, fmt.Errorf("profile %q: %w", p.Name, err)
		}
	}

	return data, nil
}

// Files renders p.Files for deployment d on this node: name → content,
// without the files that render empty. The runner writes them 0600 into
// in.FilesDir before it starts the engine (Resolve's command names them).
func Files(p Profile, d placement.Deployment, in Inputs) (map[string]string, error) {
	if len(p.Files) == 0 {
		return nil, nil
	}
	data, err := dataFor(p, d, in)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(p.Files))
	for _, name := range slices.Sorted(maps.Keys(p.Files)) {
		r, err := render(p.Name+" file "+name, []string{p.Files[name]}, 0, data)
		if err != nil {
			return nil, err
		}
		if len(r) > 0 {
			out[name] = r[0]
		}
	}
	return out, nil
}

// utilization is want/total with two decimals, rounded down: engines that
// share a GPU then never claim more together than placement reserved for
// them (rounding up, three 1/3 shares would ask for 1.02 of the GPU).
func utilization(want, total uint64) (string, error) {
	if want > total {
		return "", fmt.Errorf("gpu_memory %s exceeds the GPU's %s", placement.Bytes(want), placement.Bytes(total))
	}
	hundredths := want * 100 / total
	if hundredths == 0 {
		return "", fmt.Errorf("gpu_memory %s is under 1%% of the GPU's %s", placement.Bytes(want), placement.Bytes(total))
	}
	return strconv.FormatFloat(float64(hundredths)/100, 'f', 2, 64), nil
}

// funcs are the functions templates may call beyond text/template's own.
var funcs = template.FuncMap{"yamlString": yamlString}

// yamlString quotes s as a YAML single-quoted scalar (a quote doubled), so
// a value that looks like a number, a boolean or YAML syntax stays the
// string it is when the engine parses the file.
func yamlString(s string) (string, error) {
	if strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return "", errors.New("a control character cannot go in a YAML single-quoted string")
	}
	return "'" + strings.ReplaceAll(s, "'", "''") + "'", nil
}

// render executes each template; first is the index of tmpls[0] in the
// profile, for error messages.
func render(what string, tmpls []string, first int, data Data) ([]string, error) {
	out := make([]string, 0, len(tmpls))
	var buf bytes.Buffer
	for i, s := range tmpls {
		t, err := template.New(what).Option("missingkey=error").Funcs(funcs).Parse(s)
		if err != nil {
			return nil, fmt.Errorf("%s[%d] %q: %w", what, first+i, s, err)
		}
		buf.Reset()
		if err := t.Execute(&buf, data); err != nil {
			return nil, fmt.Errorf("%s[%d] %q: %w", what, first+i, s, err)
		}
		if buf.Len() > 0 {
			out = append(out, buf.String())
		}
	}
	return out, nil
}

// mergeEnv applies the deployment's variables over the profile's and sorts
// the result, so equal inputs give equal specs (and spec hashes).
func mergeEnv(base []string, over map[string]string) ([]string, error) {
	m := make(map[string]string, len(base)+len(over))
	for _, kv := range base {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("env %q: want KEY=VALUE", kv)
		}
		m[k] = v
	}
	for k, v := range over {
		m[k] = v
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	env := make([]string, 0, len(keys))
	for _, k := range keys {
		env = append(env, k+"="+m[k])
	}
	return env, nil
}

// envName is what key_env may be: a portable environment variable name.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Validate parses every template of p and checks the required fields, so a
// profile loaded from a file fails at load rather than at first start.
func (p Profile) Validate() error {
	if p.Name == "" {
		return errors.New("profile: name is required")
	}
	if len(p.Command) == 0 {
		return fmt.Errorf("profile %q: command is required", p.Name)
	}
	if p.HealthPath == "" || p.ModelsPath == "" {
		return fmt.Errorf("profile %q: health_path and models_path are required", p.Name)
	}
	if p.KeyEnv != "" && !envName.MatchString(p.KeyEnv) {
		return fmt.Errorf("profile %q: key_env %q is not an environment variable name (letters, digits and _, not starting with a digit)", p.Name, p.KeyEnv)
	}
	// Both a single engine and a gang member, so that a template that
	// only a gang takes (an {{if gt .NNodes 1}} branch) is checked too.
	single := Data{Model: "m", ServedName: "s", Port: 1, Host: "h", TP: 1, PP: 1, GPUMemoryUtilization: "0.50", WeightsDir: "/w", Self: "/llmgw", APIKey: "k",
		MaxModelLen: 8192, MaxNumSeqs: 1, MaxNumSeqsGiven: true, NNodes: 1, TPTotal: 1, HostIP: "10.0.0.1", NetIface: "eth0", StartTimeoutSeconds: 7200,
		CacheDir: "/c", FilesDir: "/f"}
	member := single
	member.PP, member.NNodes, member.NodeRank, member.MasterAddr, member.MasterPort, member.Headless, member.TPTotal = 2, 2, 1, "10.0.0.2", 29500, true, 2
	switch p.MemoryFraction {
	case "", FractionOfTotal, FractionOfFreeStatic:
	default:
		return fmt.Errorf("profile %q: memory_fraction %q is not %q or %q", p.Name, p.MemoryFraction, FractionOfTotal, FractionOfFreeStatic)
	}
	for name := range p.Files {
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\\\x00") {
			return fmt.Errorf("profile %q: file name %q must be a plain file name (no directory)", p.Name, name)
		}
	}
	member.MasterHostPort, member.RDMADevices = "10.0.0.2:29500", "mlx5_0"
	for _, sample := range []Data{single, member} {
		if _, err := render(p.Name+" command", p.Command, 0, sample); err != nil {
			return err
		}
		if _, err := render(p.Name+" env", p.Env, 0, sample); err != nil {
			return err
		}
		for _, name := range slices.Sorted(maps.Keys(p.Files)) {
			if _, err := render(p.Name+" file "+name, []string{p.Files[name]}, 0, sample); err != nil {
				return err
			}
		}
	}
	return nil
}

// LoadNames are the profile's metric names as the load scraper reads them
// (probes/load). Every engine exports the process start time the same way.
func (m Metrics) LoadNames() load.Names {
	n := load.Names{Running: m.Running, Waiting: m.Waiting, PromptTokens: m.PromptTokens,
		GenerationTokens: m.GenerationTokens, PrefixHits: m.PrefixCacheHits, PrefixQueries: m.PrefixCacheQueries,
		StartTime: load.VLLM().StartTime, LoRAInfo: m.LoRAInfo}
	for _, k := range []string{m.KVCacheUsage, m.KVCacheUsageFallback} {
		if k != "" {
			n.KVCache = append(n.KVCache, k)
		}
	}
	return n
}
