package profile

import (
	"slices"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/placement"
)

// Every rank of a gang gets the engine's own multi-node flags from its
// inputs: the size, its rank, rank 0's rendezvous, and --headless above
// rank 0; collective traffic is bound to the advertised interface. SGLang
// runs one pipeline stage per node (--pp-size 2, --tp-size 8 within it),
// not tensor parallelism across the machine boundary.
func TestResolveGangEveryRank(t *testing.T) {
	d := placement.Deployment{Name: "big", Model: "org/big", TensorParallel: 8, PipelineParallel: 2}
	for _, tc := range []struct {
		profile string
		rank    int
		wantCmd []string
	}{
		{"vllm", 0, []string{"vllm", "serve", "org/big", "--served-model-name", "big", "--tensor-parallel-size", "8",
			"--host", "0.0.0.0", "--port", "8100", "--pipeline-parallel-size=2", "--nnodes=2", "--node-rank=0",
			"--master-addr=10.0.0.1", "--master-port=8123"}},
		{"vllm", 1, []string{"vllm", "serve", "org/big", "--served-model-name", "big", "--tensor-parallel-size", "8",
			"--host", "0.0.0.0", "--port", "8100", "--pipeline-parallel-size=2", "--nnodes=2", "--node-rank=1",
			"--master-addr=10.0.0.1", "--master-port=8123", "--headless"}},
		{"sglang", 0, []string{"python3", "-m", "sglang.launch_server", "--model-path", "org/big", "--served-model-name", "big",
			"--tp-size", "8", "--pp-size=2", "--host", "0.0.0.0", "--port", "8100", "--enable-metrics", "--nnodes=2", "--node-rank=0",
			"--dist-init-addr=10.0.0.1:8123"}},
		{"sglang", 1, []string{"python3", "-m", "sglang.launch_server", "--model-path", "org/big", "--served-model-name", "big",
			"--tp-size", "8", "--pp-size=2", "--host", "0.0.0.0", "--port", "8100", "--enable-metrics", "--nnodes=2", "--node-rank=1",
			"--dist-init-addr=10.0.0.1:8123"}},
		{"fake", 1, []string{"/llmgw", "engine", "fake", "--model", "big", "--host", "0.0.0.0", "--port", "8100",
			"--nnodes=2", "--node-rank=1", "--master-addr=10.0.0.1", "--master-port=8123", "--headless"}},
	} {
		p, err := Lookup(tc.profile)
		if err != nil {
			t.Fatal(err)
		}
		in := Inputs{Port: 8100, Self: "/llmgw", ShardIndex: tc.rank, HostIP: "10.0.0.2", NetIface: "eth1",
			Gang: &GangInputs{NNodes: 2, Rank: tc.rank, MasterAddr: "10.0.0.1", MasterPort: 8123}}
		cmd, env, _, err := Resolve(p, d, in)
		if err != nil {
			t.Fatalf("%s rank %d: %v", tc.profile, tc.rank, err)
		}
		if !slices.Equal(cmd, tc.wantCmd) {
			t.Errorf("%s rank %d:\n got %q\nwant %q", tc.profile, tc.rank, cmd, tc.wantCmd)
		}
		if tc.profile == "fake" {
			continue
		}
		for _, kv := range []string{"VLLM_HOST_IP=10.0.0.2", "NCCL_SOCKET_IFNAME=eth1", "GLOO_SOCKET_IFNAME=eth1"} {
			if !slices.Contains(env, kv) {
				t.Errorf("%s rank %d: env %q lacks %s", tc.profile, tc.rank, env, kv)
			}
		}
	}
}

// An operator's env wins over what llmgw derives from the interface.
func TestResolveGangOperatorEnvWins(t *testing.T) {
	p, _ := Lookup("vllm")
	d := placement.Deployment{Name: "big", Model: "m", PipelineParallel: 2, Env: map[string]string{"NCCL_SOCKET_IFNAME": "ib0"}}
	_, env, _, err := Resolve(p, d, Inputs{Port: 1, HostIP: "10.0.0.2", NetIface: "eth1",
		Gang: &GangInputs{NNodes: 2, Rank: 0, MasterAddr: "10.0.0.2", MasterPort: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(env, "NCCL_SOCKET_IFNAME=ib0") || slices.Contains(env, "NCCL_SOCKET_IFNAME=eth1") {
		t.Errorf("env = %q, want the operator's NCCL_SOCKET_IFNAME", env)
	}
	if !slices.Contains(env, "GLOO_SOCKET_IFNAME=eth1") {
		t.Errorf("env = %q, want GLOO_SOCKET_IFNAME from the interface", env)
	}
}

// A replica of one shard starts exactly as before: no gang flag, no gang
// env, whatever interface the node has.
func TestResolveSingleHasNoGangFlags(t *testing.T) {
	for _, name := range []string{"vllm", "sglang", "fake", "llamacpp"} {
		p, _ := Lookup(name)
		cmd, env, _, err := Resolve(p, placement.Deployment{Name: "s", Model: "m"}, Inputs{Port: 1, Self: "/llmgw", HostIP: "10.0.0.2", NetIface: "eth1"})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range append(cmd, env...) {
			if strings.Contains(a, "nnodes") || strings.Contains(a, "headless") || strings.Contains(a, "SOCKET_IFNAME") || strings.Contains(a, "VLLM_HOST_IP") {
				t.Errorf("%s: single-shard engine got %q", name, a)
			}
		}
	}
}

// A gang member without its gang facts is refused rather than started as
// an unrelated single engine.
func TestResolveGangNeedsRendezvous(t *testing.T) {
	p, _ := Lookup("vllm")
	d := placement.Deployment{Name: "big", Model: "m", PipelineParallel: 2}
	for _, g := range []*GangInputs{nil, {NNodes: 3, Rank: 0, MasterAddr: "a", MasterPort: 1}, {NNodes: 2, Rank: 2, MasterAddr: "a", MasterPort: 1},
		{NNodes: 2, Rank: 1, MasterPort: 1}, {NNodes: 2, Rank: 1, MasterAddr: "a"}} {
		if _, _, _, err := Resolve(p, d, Inputs{Port: 1, Gang: g}); err == nil || !strings.Contains(err.Error(), "pipeline_parallel 2 needs") {
			t.Errorf("gang %+v: err = %v", g, err)
		}
	}
}

func TestBuiltinGangTemplatesValidate(t *testing.T) {
	for name, p := range Builtin() {
		if err := p.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// An IPv6 rendezvous is bracketed where the engine takes HOST:PORT as one
// value (SGLang's --dist-init-addr) and bare where it takes the address
// alone (vLLM's --master-addr, which vLLM brackets itself).
func TestResolveGangIPv6Rendezvous(t *testing.T) {
	d := placement.Deployment{Name: "big", Model: "m", TensorParallel: 2, PipelineParallel: 2}
	in := Inputs{Port: 1, Gang: &GangInputs{NNodes: 2, Rank: 1, MasterAddr: "fd00::1", MasterPort: 29500}}
	for name, want := range map[string]string{"sglang": "--dist-init-addr=[fd00::1]:29500", "vllm": "--master-addr=fd00::1"} {
		p, _ := Lookup(name)
		cmd, _, _, err := Resolve(p, d, in)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(cmd, want) {
			t.Errorf("%s: command %q lacks %s", name, cmd, want)
		}
	}
}

// A gang on a node with RDMA devices names them to NCCL, unless the
// deployment sets NCCL_IB_HCA itself; a single engine gets no NCCL_IB_HCA.
func TestResolveGangRDMADevices(t *testing.T) {
	gang := &GangInputs{NNodes: 2, Rank: 0, MasterAddr: "10.0.0.1", MasterPort: 2}
	for _, name := range []string{"vllm", "sglang"} {
		p, _ := Lookup(name)
		d := placement.Deployment{Name: "big", Model: "m", PipelineParallel: 2}
		_, env, _, err := Resolve(p, d, Inputs{Port: 1, Gang: gang, RDMADevices: []string{"mlx5_0", "mlx5_1"}})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(env, "NCCL_IB_HCA=mlx5_0,mlx5_1") {
			t.Errorf("%s: env %q lacks NCCL_IB_HCA=mlx5_0,mlx5_1", name, env)
		}
		d.Env = map[string]string{"NCCL_IB_HCA": "=mlx5_3"}
		_, env, _, _ = Resolve(p, d, Inputs{Port: 1, Gang: gang, RDMADevices: []string{"mlx5_0"}})
		if !slices.Contains(env, "NCCL_IB_HCA==mlx5_3") || slices.Contains(env, "NCCL_IB_HCA=mlx5_0") {
			t.Errorf("%s: env %q, want the deployment's NCCL_IB_HCA", name, env)
		}
		_, env, _, _ = Resolve(p, placement.Deployment{Name: "s", Model: "m"}, Inputs{Port: 1, RDMADevices: []string{"mlx5_0"}})
		for _, kv := range env {
			if strings.HasPrefix(kv, "NCCL_IB_HCA=") {
				t.Errorf("%s: single engine got %s", name, kv)
			}
		}
	}
}

// SGLang's gang layout follows the cluster version: every rank must
// launch alike, and agents before protocol 3 render TP across the whole
// gang with no --pp-size. A cluster still at 2 keeps that layout; at 3
// (or unset: the newest) each node is one pipeline stage.
func TestSGLangGangLayoutFollowsTheClusterVersion(t *testing.T) {
	p, err := Lookup("sglang")
	if err != nil {
		t.Fatal(err)
	}
	d := placement.Deployment{Name: "big", Model: "org/big", TensorParallel: 8, PipelineParallel: 2}
	for _, tc := range []struct {
		version int
		want    []string
		not     string
	}{
		{2, []string{"--tp-size", "16"}, "--pp-size=2"},
		{3, []string{"--tp-size", "8", "--pp-size=2"}, ""},
		{0, []string{"--tp-size", "8", "--pp-size=2"}, ""},
	} {
		in := Inputs{Port: 8100, ShardIndex: 1, ClusterVersion: tc.version,
			Gang: &GangInputs{NNodes: 2, Rank: 1, MasterAddr: "10.0.0.1", MasterPort: 8123}}
		cmd, _, _, err := Resolve(p, d, in)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.Index(cmd, tc.want[0])
		if i < 0 || !slices.Equal(cmd[i:i+len(tc.want)], tc.want) {
			t.Errorf("cluster version %d: %q lacks %q", tc.version, cmd, tc.want)
		}
		if tc.not != "" && slices.Contains(cmd, tc.not) {
			t.Errorf("cluster version %d: %q has %s", tc.version, cmd, tc.not)
		}
	}
	// A single-node replica is the same at every version.
	one := placement.Deployment{Name: "one", Model: "org/one", TensorParallel: 2}
	a, _, _, _ := Resolve(p, one, Inputs{Port: 8100, ClusterVersion: 2})
	b, _, _, _ := Resolve(p, one, Inputs{Port: 8100, ClusterVersion: 3})
	if !slices.Equal(a, b) {
		t.Errorf("a single-node replica renders differently by version:\n%q\n%q", a, b)
	}
}
