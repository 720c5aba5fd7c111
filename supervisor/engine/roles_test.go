package engine

import (
	"net"
	"strconv"
	"testing"

	"github.com/llmgw/llmgw/placement"
)

// A role's engine gets a KV port, starts with its role's flags (the fake
// serves NIXL's side channel there), and says its role and port in its
// record; an agent restart adopts it with both and keeps the port held.
func TestRoleEngineGetsItsKVPorts(t *testing.T) {
	env := newRunnerEnv(t)
	r := env.open()
	whole := placement.Deployment{Name: "pd", Model: "m/tiny", Engine: "fake", Prefill: &placement.Role{Replicas: 1, TensorParallel: 2},
		Decode: &placement.Role{Replicas: 1}}.WithDefaults()
	d := Desired{Assignment: placement.Assignment{ShardID: "pd-p0", ReplicaID: "pd-p0", Deployment: "pd", Role: placement.RolePrefill,
		SpecVersion: whole.SpecVersion(), GPUs: []int{0, 1}}, Spec: whole.ForRole(placement.RolePrefill)}
	runReady(t, r, d)
	rec := shardRecord(r, "pd-p0")
	if rec.Role != placement.RolePrefill || rec.KVPort <= 0 {
		t.Fatalf("record: role %q, kv port %d", rec.Role, rec.KVPort)
	}
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(rec.KVPort)))
	if err != nil {
		t.Fatalf("nothing listens on the KV port %d: %v", rec.KVPort, err)
	}
	_ = c.Close()
	held := func(r *Runner) bool {
		r.ports.mu.Lock()
		defer r.ports.mu.Unlock()
		return r.ports.taken[rec.KVPort] != ""
	}
	if !held(r) {
		t.Errorf("the KV port %d is not held", rec.KVPort)
	}
	r.Close()

	r2 := env.open()
	r2.Reconcile(t.Context(), []Desired{d})
	waitShard(t, r2, "pd-p0 adopted ready", func([]string) bool { return readyPID(r2, "pd-p0") > 0 })
	if again := shardRecord(r2, "pd-p0"); again.Role != placement.RolePrefill || again.KVPort != rec.KVPort || again.PID != rec.PID {
		t.Errorf("adopted: role %q port %d pid %d, want %q %d %d", again.Role, again.KVPort, again.PID, rec.Role, rec.KVPort, rec.PID)
	}
	if !held(r2) {
		t.Errorf("the adopted engine's KV port %d is not held", rec.KVPort)
	}
	r2.Reconcile(t.Context(), nil)
	waitShard(t, r2, "pd-p0 stopped", func(s []string) bool { return len(s) == 0 })
}
