package profile

import (
	"slices"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/placement"
)

// A role of a disaggregated deployment starts as its engine's own P/D
// launch says: vLLM (and the fake) with NixlConnector and the side
// channel's address and first port, SGLang with its mode, backend and,
// for a prefill, its bootstrap port. Without a role none of it renders.
func TestRoleFlags(t *testing.T) {
	const nixl = `--kv-transfer-config={"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"fail"}`
	for _, tc := range []struct {
		engine, role, nic string
		args, env         []string
		absent            []string
	}{
		{"vllm", placement.RolePrefill, "mlx5_0", []string{nixl}, []string{"VLLM_NIXL_SIDE_CHANNEL_HOST=10.0.0.7", "VLLM_NIXL_SIDE_CHANNEL_PORT=8300", "UCX_NET_DEVICES=mlx5_0:1"}, nil},
		{"fake", placement.RoleDecode, "", []string{nixl}, []string{"VLLM_NIXL_SIDE_CHANNEL_HOST=10.0.0.7", "VLLM_NIXL_SIDE_CHANNEL_PORT=8300"}, nil},
		{"sglang", placement.RolePrefill, "mlx5_1", []string{"--disaggregation-mode=prefill", "--disaggregation-transfer-backend=mooncake", "--disaggregation-bootstrap-port=8300", "--disaggregation-ib-device=mlx5_1"}, nil, nil},
		{"sglang", placement.RoleDecode, "", []string{"--disaggregation-mode=decode", "--disaggregation-transfer-backend=mooncake"}, nil, []string{"--disaggregation-bootstrap-port"}},
	} {
		p, err := Lookup(tc.engine)
		if err != nil {
			t.Fatal(err)
		}
		d := placement.Deployment{Name: "pd", Model: "m", Engine: tc.engine}
		in := Inputs{Port: 8100, Self: "/usr/bin/llmgw", Role: tc.role, KVPort: 8300, KVHost: "10.0.0.7", NIC: tc.nic}
		cmd, env, _, err := Resolve(p, d, in)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.engine, tc.role, err)
		}
		for _, a := range tc.args {
			if !slices.Contains(cmd, a) {
				t.Errorf("%s %s: %q lacks %s", tc.engine, tc.role, cmd, a)
			}
		}
		for _, e := range tc.env {
			if !slices.Contains(env, e) {
				t.Errorf("%s %s: env %q lacks %s", tc.engine, tc.role, env, e)
			}
		}
		for _, a := range tc.absent {
			if strings.Contains(strings.Join(cmd, " "), a) {
				t.Errorf("%s %s: %q has %s", tc.engine, tc.role, cmd, a)
			}
		}
		// Without a role: nothing of it.
		cmd, env, _, err = Resolve(p, d, Inputs{Port: 8100, Self: "/usr/bin/llmgw"})
		if err != nil {
			t.Fatal(err)
		}
		if line := strings.Join(slices.Concat(cmd, env), " "); strings.Contains(line, "kv-transfer") || strings.Contains(line, "NIXL") || strings.Contains(line, "disaggregation") {
			t.Errorf("%s without a role: %s", tc.engine, line)
		}
	}
	if _, _, _, err := Resolve(vllmProfile(), placement.Deployment{Name: "pd", Model: "m"}, Inputs{Port: 8100, Role: placement.RolePrefill}); err == nil {
		t.Error("a role without a KV port rendered")
	}
}
