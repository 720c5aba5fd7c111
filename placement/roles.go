package placement

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Prefill/decode disaggregation (cluster protocol 7).
//
// A deployment with roles runs two kinds of replica from one spec: prefill
// replicas compute prompts and hand their KV cache over, decode replicas
// take it and generate. Each role has its own replica count and tensor
// parallel size; everything else (model, image, memory, labels) is the
// deployment's, so both roles run the same engine build: two vLLM
// releases refuse each other's KV (NIXL's handshake compares a hash of the
// version), and SGLang's transfer assumes one layout on both sides.
//
// Replica IDs name the role: "<name>-p<i>" and "<name>-d<i>", with gang
// suffixes as for any replica ("<name>-p0-s1"). No plain deployment's
// replica can take such an ID: its indexes are digits only.
//
// Placement expands each role as a deployment of its own, under the
// deployment's one spec version (a change to either role's shape rolls
// both: their engines must stay of one build). Each role prefers nodes
// near the other role's shards: the same node, else the same value of
// the label transfer.domain names, so the KV crosses the shortest link.

// The roles of a disaggregated deployment.
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// Role is one role's shape.
type Role struct {
	// Replicas is how many replicas of the role run (1 to 1000).
	Replicas int `json:"replicas"`
	// TensorParallel is each shard's GPUs (0: the deployment's
	// tensor_parallel). Spelled tp, as in --prefill-tp.
	TensorParallel int `json:"tp,omitempty"`
	// Image must be the deployment's image when given: it is accepted so
	// that a spec which names one per role says so, and refused when
	// they differ.
	Image string `json:"image,omitempty"`
}

// Transfer is how a disaggregated deployment moves its KV cache, and what
// the gateways do when it cannot.
type Transfer struct {
	// Backend is the KV transfer library: "nixl" for vLLM (its
	// NixlConnector, the only one llmgw launches), "mooncake" (SGLang's
	// default) or "nixl" for SGLang. Empty: the engine's default.
	Backend string `json:"backend,omitempty"`
	// NIC is the RDMA device the transfer uses (mlx5_0): UCX_NET_DEVICES
	// for NIXL, --disaggregation-ib-device for SGLang. Empty: the
	// library picks.
	NIC string `json:"nic,omitempty"`
	// Domain is a node label key (rack, nvl-domain): a role's shard
	// prefers nodes whose value of it equals that of a node holding the
	// other role, after the other role's own nodes.
	Domain string `json:"domain,omitempty"`
	// Fallback lets a decode replica serve a request alone (computing its
	// prompt itself) when no prefill replica is ready or the prefill leg
	// failed before anything reached the client. Off: such a request
	// fails with an error that says why. Counted as fallback either way
	// it is taken: disaggregation never stops silently.
	Fallback bool `json:"fallback,omitempty"`
	// SkipBelow skips the prefill leg for prompts whose part not already
	// in a decode replica's prefix cache, as the gateway estimates it, is
	// below this many tokens (0: always disaggregate): a short prefill
	// costs less than its transfer. Counted as skipped.
	SkipBelow int `json:"skip_below,omitempty"`
}

// HasRoles reports whether d is disaggregated into prefill and decode.
func (d Deployment) HasRoles() bool { return d.Prefill != nil || d.Decode != nil }

// Roles are the roles of d in placement order, nil without roles.
func (d Deployment) Roles() []string {
	if !d.HasRoles() {
		return nil
	}
	return []string{RolePrefill, RoleDecode}
}

// role is the shape of one of d's roles (nil: d has no such role).
func (d Deployment) role(name string) *Role {
	switch name {
	case RolePrefill:
		return d.Prefill
	case RoleDecode:
		return d.Decode
	}
	return nil
}

// ForRole is d as one of its roles runs: the role's replicas and tensor
// parallel size (after WithDefaults). Without roles, or for "", it is d.
func (d Deployment) ForRole(name string) Deployment {
	d = d.WithDefaults()
	r := d.role(name)
	if r == nil {
		return d
	}
	d.Replicas, d.TensorParallel = r.Replicas, r.TensorParallel
	return d
}

// RoleReplicaID names replica i of a role of deployment name: "<name>-p<i>"
// or "<name>-d<i>"; without a role, ReplicaID.
func RoleReplicaID(deployment, role string, i int) string {
	switch role {
	case RolePrefill:
		return deployment + "-p" + strconv.Itoa(i)
	case RoleDecode:
		return deployment + "-d" + strconv.Itoa(i)
	}
	return ReplicaID(deployment, i)
}

// ParseReplicaID splits a replica ID into its deployment, role ("" for a
// replica of a deployment without roles) and index.
func ParseReplicaID(replica string) (deployment, role string, index int, ok bool) {
	i := strings.LastIndexByte(replica, '-')
	if i <= 0 {
		return "", "", 0, false
	}
	deployment, rest := replica[:i], replica[i+1:]
	switch {
	case len(rest) > 1 && rest[0] == 'p':
		role, rest = RolePrefill, rest[1:]
	case len(rest) > 1 && rest[0] == 'd':
		role, rest = RoleDecode, rest[1:]
	}
	if !allDigits(rest) || (len(rest) > 1 && rest[0] == '0') {
		return "", "", 0, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil {
		return "", "", 0, false
	}
	return deployment, role, n, true
}

// The transfer backends each engine may name.
var transferBackends = map[string][]string{
	"vllm":   {"nixl"},
	"fake":   {"nixl"},
	"sglang": {"mooncake", "nixl"},
}

// nicName is an RDMA device's name (mlx5_0), without the port that
// UCX_NET_DEVICES adds (the profile renders mlx5_0:1).
var nicName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// validateRoles checks the fields of disaggregation (after WithDefaults).
func (d Deployment) validateRoles() error {
	bad := func(field, value, want string) error { return &FieldError{Field: field, Value: value, Want: want} }
	if !d.HasRoles() {
		if d.Transfer != nil {
			return bad("transfer", "(set)", "only with prefill and decode roles: a deployment without them moves no KV cache")
		}
		return nil
	}
	switch {
	case d.Prefill == nil:
		return bad("prefill", "(missing)", "given beside decode: {replicas: N, tp: T}; a decode replica needs a prefill replica to hand it the KV cache (or leave both out)")
	case d.Decode == nil:
		return bad("decode", "(missing)", "given beside prefill: {replicas: N, tp: T}; a prefill replica only computes the prompt (or leave both out)")
	}
	if _, ok := transferBackends[d.Engine]; !ok {
		return bad("prefill", "engine "+d.Engine, "prefill and decode roles with engine vllm, sglang or fake: llama.cpp has no KV transfer between servers")
	}
	for _, name := range d.Roles() {
		r := d.role(name)
		if r.Replicas < 1 || r.Replicas > 1000 {
			return bad(name+".replicas", strconv.Itoa(r.Replicas), "an integer from 1 to 1000")
		}
		if r.TensorParallel < 1 || r.TensorParallel > 64 {
			return bad(name+".tp", strconv.Itoa(r.TensorParallel), "an integer from 1 to 64 (GPUs of one node per shard; or leave it out: tensor_parallel)")
		}
		if (d.Fit != nil || d.GPUMemoryAuto) && r.TensorParallel != d.TensorParallel {
			// The figure is per GPU for one split of the model.
			return bad(name+".tp", strconv.Itoa(r.TensorParallel), fmt.Sprintf("tensor_parallel (%d) with gpu_memory auto, which sizes one split of the model; or give gpu_memory explicitly", d.TensorParallel))
		}
		if r.Image != "" && r.Image != d.Image {
			return bad(name+".image", r.Image, fmt.Sprintf("the deployment's image (%q) or nothing: both roles run one engine build, since two releases refuse each other's KV cache", d.Image))
		}
	}
	if d.Autoscale != nil {
		return bad("autoscale", "(set)", "a fixed count per role with prefill and decode (prefill.replicas, decode.replicas): autoscaling by role is not built")
	}
	if d.MaxLoras > 0 {
		return bad("max_loras", strconv.Itoa(d.MaxLoras), "no LoRA with prefill and decode roles: the gateway does not carry an adapter across the two legs")
	}
	if t := d.Transfer; t != nil {
		if t.Backend != "" {
			allowed := transferBackends[d.Engine]
			if !slices.Contains(allowed, t.Backend) {
				return bad("transfer.backend", t.Backend, "with engine "+d.Engine+": one of "+strings.Join(allowed, ", "))
			}
		}
		if t.NIC != "" && !nicName.MatchString(t.NIC) {
			return bad("transfer.nic", t.NIC, "an RDMA device name such as mlx5_0")
		}
		if t.Domain != "" && !labelKey.MatchString(t.Domain) {
			return bad("transfer.domain", t.Domain, "a node label key such as rack")
		}
		if t.SkipBelow < 0 || t.SkipBelow > 1<<20 {
			return bad("transfer.skip_below", strconv.Itoa(t.SkipBelow), "from 0 (always disaggregate) to 1048576 uncached prompt tokens")
		}
		// An SGLang decode server computes no prompt: its requests wait in
		// a pre-allocation queue for a prefill's KV (DecodePreallocQueue
		// in python/sglang/srt/disaggregation/decode.py), so it cannot
		// serve one alone. vLLM's kv_both workers can.
		if d.Engine == "sglang" && t.Fallback {
			return bad("transfer.fallback", "true", "false with engine sglang: an SGLang decode server computes no prompt of its own, it only takes a prefill's KV")
		}
		if d.Engine == "sglang" && t.SkipBelow > 0 {
			return bad("transfer.skip_below", strconv.Itoa(t.SkipBelow), "0 with engine sglang: an SGLang decode server computes no prompt of its own, so no request can skip its prefill")
		}
	}
	return nil
}

// rolesWithDefaults fills each role's tensor parallel size and the
// replica count (the roles' sum: what status counts).
func (d *Deployment) rolesWithDefaults() {
	if d.Prefill == nil && d.Decode == nil {
		return
	}
	n := 0
	for _, r := range []**Role{&d.Prefill, &d.Decode} {
		if *r == nil {
			continue
		}
		c := **r // a copy: WithDefaults takes d by value, the roles by pointer
		if c.TensorParallel == 0 {
			c.TensorParallel = d.TensorParallel
		}
		n += c.Replicas
		*r = &c
	}
	d.Replicas = n
}
