package profile

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Optional flags are written --flag=value in one element so that the whole
// flag drops out when the value is empty (see the package doc). vLLM and
// SGLang parse with argparse, which accepts that form.
const (
	hfHome = "{{if .WeightsDir}}HF_HOME={{.WeightsDir}}{{end}}"
)

// gang writes a multi-node flag only for a replica that spans nodes:
// `--name=<field>` when NNodes is above 1, nothing otherwise, so a
// replica of one shard starts exactly as before.
func gang(name, field string) string {
	return "{{if gt .NNodes 1}}--" + name + "={{." + field + "}}{{end}}"
}

// gangEnv binds a gang's collective traffic to the interface that carries
// the node's advertised address. A deployment's own env wins over these
// (see Resolve), for an operator who knows better (an InfiniBand HCA).
//
// NCCL_IB_HCA names the node's RDMA devices, so NCCL's collectives between
// the gang's nodes take the fabric (NET/IB) rather than TCP sockets; NCCL
// would look for devices by itself, but a container sees only what it is
// given, and naming them keeps NCCL off a device the probe did not count.
var gangEnv = []string{
	"{{if and (gt .NNodes 1) .HostIP}}VLLM_HOST_IP={{.HostIP}}{{end}}",
	"{{if and (gt .NNodes 1) .NetIface}}NCCL_SOCKET_IFNAME={{.NetIface}}{{end}}",
	"{{if and (gt .NNodes 1) .NetIface}}GLOO_SOCKET_IFNAME={{.NetIface}}{{end}}",
	"{{if and (gt .NNodes 1) .RDMADevices}}NCCL_IB_HCA={{.RDMADevices}}{{end}}",
}

// compileCaches keep PyTorch's inductor and Triton's kernel caches under
// the node's cache dir (Inputs.CacheDir), which outlives the engine and
// its container, so a restart does not compile every kernel again. Both
// variables are read by torch and triton themselves
// (torch/_inductor/runtime/cache_dir_utils.py, triton/runtime/cache.py),
// whichever engine runs them.
var compileCaches = []string{
	"{{if .CacheDir}}TORCHINDUCTOR_CACHE_DIR={{.CacheDir}}/torchinductor{{end}}",
	"{{if .CacheDir}}TRITON_CACHE_DIR={{.CacheDir}}/triton{{end}}",
}

// headless marks the members above rank 0, which serve no HTTP.
const headless = "{{if .Headless}}--headless{{end}}"

// tolerance is the readiness rule the built-in engines share, with each
// one's probe timeout and progress window: three failed probes in a row
// (K), a hung engine restarted after 2 min (R), and at the gateway 10 min
// to an answer's first byte (a 128k-token prompt queued behind others can
// take minutes to its first token) and 2 min between stream events.
func tolerance(probe, window time.Duration) Readiness {
	return Readiness{ProbeTimeout: probe, Failures: 3, ProgressWindow: window, HungRestart: 2 * time.Minute,
		FirstByteTimeout: 10 * time.Minute, StreamIdleTimeout: 2 * time.Minute}
}

// Builtin returns the profiles llmgw ships, keyed by name. Every call builds
// fresh values, so callers may change what they get.
func Builtin() map[string]Profile {
	return map[string]Profile{
		"vllm":     vllmProfile(),
		"sglang":   sglangProfile(),
		"llamacpp": llamacppProfile(),
		"fake":     fakeProfile(),
	}
}

// Lookup returns the built-in profile name.
func Lookup(name string) (Profile, error) {
	b := Builtin()
	p, ok := b[name]
	if !ok {
		names := make([]string, 0, len(b))
		for n := range b {
			names = append(names, n)
		}
		slices.Sort(names)
		return Profile{}, fmt.Errorf("unknown engine profile %q (have %s)", name, strings.Join(names, ", "))
	}
	return p, nil
}
