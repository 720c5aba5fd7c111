package placement

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func pdRoles(p, ptp, d, dtp int) func(*Deployment) {
	return func(dep *Deployment) {
		dep.Replicas = 0
		dep.Prefill = &Role{Replicas: p, TensorParallel: ptp}
		dep.Decode = &Role{Replicas: d, TensorParallel: dtp}
	}
}

func TestRolesExpandIntoNamedReplicas(t *testing.T) {
	d := mkDep("pd", pdRoles(1, 2, 2, 1))
	v := View{Deployments: []Deployment{d}, Nodes: []Node{
		mkNode("n1", hgpus(2, "H100", 80, true)),
		mkNode("n2", hgpus(2, "H100", 80, true)),
	}}
	p := Compute(v)
	if len(p.Unplaced) != 0 {
		t.Fatalf("unplaced: %+v", p.Unplaced)
	}
	want := map[string]struct {
		role string
		gpus int
	}{"pd-p0": {RolePrefill, 2}, "pd-d0": {RoleDecode, 1}, "pd-d1": {RoleDecode, 1}}
	if len(p.Assignments) != len(want) {
		t.Fatalf("assignments: %+v", p.Assignments)
	}
	for _, a := range p.Assignments {
		w, ok := want[a.ShardID]
		if !ok || a.Role != w.role || len(a.GPUs) != w.gpus || a.Deployment != "pd" || a.ReplicaID != a.ShardID || a.SpecVersion != version(d) {
			t.Errorf("assignment %+v, want role %q on %d GPUs", a, w.role, w.gpus)
		}
	}
	// The prefill takes one node whole; both decodes share the other.
	if p0 := find(p, "pd-p0")[0].Node; find(p, "pd-d0")[0].Node == p0 || find(p, "pd-d1")[0].Node == p0 {
		t.Errorf("a decode placed on the prefill's full node: %+v", p.Assignments)
	}
}

func TestDecodePlacedNearPrefill(t *testing.T) {
	// Four nodes of two GPUs; the prefill sits on n3. With spread alone
	// the decode would go to any empty node; near the prefill it shares
	// n3.
	d := mkDep("pd", pdRoles(1, 1, 1, 1))
	nodes := []Node{
		mkNode("n1", hgpus(2, "H100", 80, true)),
		mkNode("n2", hgpus(2, "H100", 80, true)),
		mkNode("n3", hgpus(2, "H100", 80, true), holding(hold("pd-p0", version(d), LeaseValid, 1, 0))),
		mkNode("n4", hgpus(2, "H100", 80, true)),
	}
	p := Compute(View{Deployments: []Deployment{d}, Nodes: nodes})
	if got := find(p, "pd-d0"); len(got) != 1 || got[0].Node != "n3" {
		t.Fatalf("pd-d0 not beside its prefill on n3: %+v", p.Assignments)
	}

	// n3 full: the same domain (rack b) before any other node.
	d.Transfer = &Transfer{Domain: "rack"}
	nodes = []Node{
		mkNode("n1", hgpus(2, "H100", 80, true), withLabels("rack", "a")),
		mkNode("n2", hgpus(2, "H100", 80, true), withLabels("rack", "a")),
		mkNode("n3", hgpus(1, "H100", 80, true), withLabels("rack", "b"), holding(hold("pd-p0", version(d), LeaseValid, 1, 0))),
		mkNode("n4", hgpus(2, "H100", 80, true), withLabels("rack", "b")),
	}
	p = Compute(View{Deployments: []Deployment{d}, Nodes: nodes})
	if got := find(p, "pd-d0"); len(got) != 1 || got[0].Node != "n4" {
		t.Fatalf("pd-d0 not in its prefill's rack (n4): %+v", p.Assignments)
	}
}

func TestRoleScaleDownDrains(t *testing.T) {
	d := mkDep("pd", pdRoles(1, 1, 2, 1))
	v := View{Deployments: []Deployment{d}, Nodes: []Node{
		mkNode("n1", hgpus(2, "H100", 80, false)),
		mkNode("n2", hgpus(2, "H100", 80, false)),
	}}
	v = heldFromPlan(v, Compute(v), LeaseValid)
	// pd-d0 restarts (it is not ready): pd-d1 serves until it is.
	for i := range v.Nodes {
		for j := range v.Nodes[i].Shards {
			if v.Nodes[i].Shards[j].ShardID == "pd-d0" {
				v.Nodes[i].Shards[j].Lease = LeaseStarting
			}
		}
	}
	v.Deployments[0].Decode = &Role{Replicas: 1, TensorParallel: 1}
	if version(v.Deployments[0]) != version(d) {
		t.Fatal("a role's replica count changed the spec version: scaling would roll every engine")
	}
	p := Compute(v)
	got := find(p, "pd-d1")
	if len(got) != 1 || !got[0].Draining || got[0].Role != RoleDecode {
		t.Fatalf("pd-d1 not kept draining after decode 2→1: %+v", p.Assignments)
	}
	if a := find(p, "pd-d0"); len(a) != 1 || a[0].Draining {
		t.Fatalf("pd-d0: %+v", a)
	}
}

func TestRolesSpecVersion(t *testing.T) {
	base := mkDep("pd", pdRoles(1, 1, 1, 1))
	same := mkDep("pd", pdRoles(3, 0, 2, 0), func(d *Deployment) {
		d.Transfer = &Transfer{Fallback: true, SkipBelow: 256}
	})
	same.Transfer = nil // compared below with and without
	if version(base) != version(same) {
		t.Error("role counts or a defaulted tp changed the spec version")
	}
	withPolicy := base
	withPolicy.Transfer = &Transfer{Fallback: true, SkipBelow: 256, Domain: "rack"}
	if version(withPolicy) != version(base) {
		t.Error("the gateways' fallback or skip_below, or the placement's domain, changed the spec version")
	}
	for name, d := range map[string]Deployment{
		"prefill tp": mkDep("pd", pdRoles(1, 2, 1, 1)),
		"nic":        mkDep("pd", pdRoles(1, 1, 1, 1), func(d *Deployment) { d.Transfer = &Transfer{NIC: "mlx5_0"} }),
		"no roles":   mkDep("pd"),
	} {
		if version(d) == version(base) {
			t.Errorf("%s: spec version unchanged", name)
		}
	}
}

func TestRolesBadInput(t *testing.T) {
	for _, c := range []struct {
		spec, field string
	}{
		{`{"name":"pd","model":"m","prefill":{"replicas":1}}`, "decode"},
		{`{"name":"pd","model":"m","decode":{"replicas":1}}`, "prefill"},
		{`{"name":"pd","model":"m","engine":"llamacpp","prefill":{"replicas":1},"decode":{"replicas":1}}`, "prefill"},
		{`{"name":"pd","model":"m","image":"a:1","prefill":{"replicas":1,"image":"a:2"},"decode":{"replicas":1}}`, "prefill.image"},
		{`{"name":"pd","model":"m","replicas":3,"prefill":{"replicas":1},"decode":{"replicas":1}}`, "replicas"},
		{`{"name":"pd","model":"m","prefill":{"replicas":0},"decode":{"replicas":1}}`, "prefill.replicas"},
		{`{"name":"pd","model":"m","prefill":{"replicas":1,"tp":65},"decode":{"replicas":1}}`, "prefill.tp"},
		{`{"name":"pd","model":"m","prefill":{"replicas":1},"decode":{"replicas":1},"transfer":{"backend":"mooncake"}}`, "transfer.backend"},
		{`{"name":"pd","model":"m","transfer":{"fallback":true}}`, "transfer"},
		{`{"name":"pd","model":"m","prefill":{"replicas":1},"decode":{"replicas":1},"max_loras":2}`, "max_loras"},
		{`{"name":"pd","model":"m","engine":"sglang","prefill":{"replicas":1},"decode":{"replicas":1},"transfer":{"fallback":true}}`, "transfer.fallback"},
		{`{"name":"pd","model":"m","gpu_memory":"auto","prefill":{"replicas":1,"tp":2},"decode":{"replicas":1}}`, "prefill.tp"},
	} {
		_, err := DecodeDeployment([]byte(c.spec))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%s: error %v, want one naming %s", c.spec, err, c.field)
		}
	}
	// A record relayed by gossip is read leniently: a field a newer build
	// added inside an object must not make an older node drop the spec.
	var relayed Deployment
	if err := json.Unmarshal([]byte(`{"name":"pd","model":"m","prefill":{"replicas":1,"later":2},"decode":{"replicas":1},"transfer":{"later":true},"adapters":[{"name":"a","source":"b","later":1}]}`), &relayed); err != nil || relayed.Prefill == nil {
		t.Errorf("a relayed spec with a newer build's fields: %v", err)
	}
	// A role's unknown field is named, not dropped.
	if _, err := DecodeDeployment([]byte(`{"name":"pd","model":"m","prefill":{"replicas":1,"tensor_parallel":2},"decode":{"replicas":1}}`)); err == nil || !strings.Contains(err.Error(), "prefill") {
		t.Errorf("a role's unknown field: %v", err)
	}
	d, err := DecodeDeployment([]byte(`{"name":"pd","model":"m","engine":"sglang","tensor_parallel":2,"prefill":{"replicas":2},"decode":{"replicas":1,"tp":1},"transfer":{"backend":"mooncake"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if d.Replicas != 3 || d.Prefill.TensorParallel != 2 || d.Decode.TensorParallel != 1 {
		t.Errorf("decoded %+v %+v %+v", d, *d.Prefill, *d.Decode)
	}
	if got := d.FieldsAbove(6); len(got) != 3 {
		t.Errorf("fields above protocol 6: %+v, want prefill, decode, transfer", got)
	}
}

func TestParseReplicaID(t *testing.T) {
	for _, c := range []struct {
		id, dep, role string
		i             int
		ok            bool
	}{
		{"pd-p0", "pd", RolePrefill, 0, true},
		{"pd-d12", "pd", RoleDecode, 12, true},
		{"chat-3", "chat", "", 3, true},
		{"a-p-0", "a-p", "", 0, true},
		{"pd-p", "", "", 0, false},
		{"pd-x1", "", "", 0, false},
		{"pd-p01", "", "", 0, false},
		{"pd", "", "", 0, false},
	} {
		dep, role, i, ok := ParseReplicaID(c.id)
		if dep != c.dep || role != c.role || i != c.i || ok != c.ok {
			t.Errorf("%s: %q %q %d %v", c.id, dep, role, i, ok)
		}
		if ok && RoleReplicaID(dep, role, i) != c.id {
			t.Errorf("%s does not round-trip", c.id)
		}
	}
}

// A rolling update of a disaggregated deployment replaces both roles as
// one unit: the old decode keeps serving beside its new copy until the new
// prefill serves too, so an old prefill always has an old decode to pair
// with, and the other way round.
func TestRolesRollTogether(t *testing.T) {
	old := mkDep("pd", pdRoles(1, 1, 1, 1))
	cur := mkDep("pd", pdRoles(1, 1, 1, 1), args("--new"))
	nodes := func(newPrefill LeaseState) []Node {
		return []Node{
			mkNode("n1", hgpus(2, "H100", 80, false), holding(hold("pd-p0", version(old), LeaseValid, 1, 0), hold("pd-p0", version(cur), newPrefill, 3, 1))),
			mkNode("n2", hgpus(2, "H100", 80, false), holding(hold("pd-d0", version(old), LeaseValid, 2, 0), hold("pd-d0", version(cur), LeaseValid, 4, 1))),
		}
	}
	p := Compute(View{Deployments: []Deployment{cur}, Nodes: nodes(LeaseStarting)})
	for _, id := range []string{"pd-p0", "pd-d0"} {
		drained := false
		for _, a := range find(p, id) {
			drained = drained || (a.SpecVersion == version(old) && a.Draining)
		}
		if !drained {
			t.Errorf("%s's old version stopped while the new prefill loads: %+v", id, find(p, id))
		}
	}
	p = Compute(View{Deployments: []Deployment{cur}, Nodes: nodes(LeaseValid)})
	for _, a := range p.Assignments {
		if a.SpecVersion == version(old) {
			t.Errorf("%s's old version kept once both roles serve the new one", a.ShardID)
		}
	}
}
