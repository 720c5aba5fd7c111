package gossip

import "testing"

// The target in force is the newest of those for the deployment's
// current spec, whichever record holds it; targets for an older spec and
// for other deployments count for nothing.
func TestScaleTargetFor(t *testing.T) {
	spec := Stamp{Wall: 100, Origin: "a"}
	old := Stamp{Wall: 50, Origin: "a"}
	d := DeploymentRecord{Name: "chat", Stamp: spec}
	member := func(name string, ts ...ScaleTarget) Member {
		return Member{Name: name, Record: &NodeRecord{Name: name, Scale: ts}}
	}
	members := []Member{
		member("a", ScaleTarget{Deployment: "chat", Spec: spec, Replicas: 2, At: Stamp{Wall: 200, Origin: "a"}}),
		member("b", ScaleTarget{Deployment: "chat", Spec: spec, Replicas: 3, At: Stamp{Wall: 300, Origin: "b"}},
			ScaleTarget{Deployment: "other", Spec: spec, Replicas: 9, At: Stamp{Wall: 900, Origin: "b"}}),
		member("c", ScaleTarget{Deployment: "chat", Spec: old, Replicas: 7, At: Stamp{Wall: 999, Origin: "c"}}),
		{Name: "d"},
	}
	got, ok := ScaleTargetFor(members, d)
	if !ok || got.Replicas != 3 || got.At.Origin != "b" {
		t.Errorf("target = %+v, %v; want b's 3", got, ok)
	}
	// In any order of members.
	rev := []Member{members[3], members[2], members[1], members[0]}
	if again, _ := ScaleTargetFor(rev, d); again != got {
		t.Errorf("another order chose %+v", again)
	}
	if _, ok := ScaleTargetFor(members[2:], d); ok {
		t.Error("a target for an older spec was taken")
	}
}
