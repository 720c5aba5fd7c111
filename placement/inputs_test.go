package placement

import (
	"maps"
	"reflect"
	"testing"

	"pgregory.net/rapid"
)

// What SameInputs calls the same, Compute plans the same: a view whose
// GPUs' MemoryUsed alone changed gives the plan of the original. And a
// change to anything else is seen.
func TestSameInputsMeansTheSamePlan(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v := genView(t)
		w := cloneView(v)
		for i := range w.Nodes {
			for j := range w.Nodes[i].GPUs {
				w.Nodes[i].GPUs[j].MemoryUsed = rapid.Uint64().Draw(t, "used")
			}
		}
		if !SameInputs(v, w) {
			t.Fatal("views that differ in MemoryUsed alone differ")
		}
		if p, q := Compute(v), Compute(w); !reflect.DeepEqual(p, q) {
			t.Fatalf("the same inputs, different plans:\n%+v\n%+v", p, q)
		}
	})
}

func TestSameInputsSeesEveryOtherChange(t *testing.T) {
	base := View{
		Nodes: []Node{{Name: "n1", Alive: true, Labels: map[string]string{"zone": "a"},
			GPUs:   []GPU{{Index: 0, UUID: "u0", Name: "H100", MemoryTotal: 80 << 30, MemoryUsed: 1 << 30, MemoryForeign: 1 << 30}},
			Shards: []HeldShard{{ShardID: "chat-0", SpecVersion: "v1", GPUs: []int{0}, Lease: LeaseValid, ClaimStamp: 1}}}},
		Deployments: []Deployment{{Name: "chat", Model: "m", Engine: "fake", Replicas: 1}},
	}
	for name, change := range map[string]func(v *View){
		"a node dies":          func(v *View) { v.Nodes[0].Alive = false },
		"a node joins":         func(v *View) { v.Nodes = append(v.Nodes, Node{Name: "n2", Alive: true}) },
		"a lease lapses":       func(v *View) { v.Nodes[0].Shards[0].Lease = LeaseLapsed },
		"a claim is renewed":   func(v *View) { v.Nodes[0].Shards[0].ClaimStamp = 2 },
		"a copy settles":       func(v *View) { v.Nodes[0].Shards[0].Settling = true },
		"an engine fails":      func(v *View) { v.Nodes[0].Shards[0].Failing = true },
		"foreign memory":       func(v *View) { v.Nodes[0].GPUs[0].MemoryForeign = 3 << 30 },
		"a driver fault":       func(v *View) { v.Nodes[0].GPUs[0].Faulted = true },
		"a label":              func(v *View) { v.Nodes[0].Labels = map[string]string{"zone": "b"} },
		"a cached model":       func(v *View) { v.Nodes[0].CachedModels = []string{"m"} },
		"a deployment scales":  func(v *View) { v.Deployments[0].Replicas = 2 },
		"a deployment is gone": func(v *View) { v.Deployments = nil },
	} {
		v := cloneView(base)
		change(&v)
		if SameInputs(base, v) {
			t.Errorf("%s: SameInputs says nothing changed", name)
		}
	}
	if !SameInputs(base, cloneView(base)) {
		t.Error("a view differs from its copy")
	}
}

// cloneView copies v deeply enough that changing the copy leaves v alone.
func cloneView(v View) View {
	out := View{Deployments: append([]Deployment(nil), v.Deployments...), Share: v.Share, Usage: maps.Clone(v.Usage)}
	for _, n := range v.Nodes {
		n.GPUs = append([]GPU(nil), n.GPUs...)
		n.Shards = append([]HeldShard(nil), n.Shards...)
		out.Nodes = append(out.Nodes, n)
	}
	return out
}

// Every field of a node, a GPU and a held shard is compared, MemoryUsed
// alone excepted: each is changed in turn, by reflection, so a field added
// to these types fails here until SameInputs compares it (or says why not).
func TestSameInputsSeesEveryField(t *testing.T) {
	base := View{Nodes: []Node{{Name: "n1", GPUs: []GPU{{}}, Shards: []HeldShard{{}}}}}
	ignored := map[string]bool{"GPU.MemoryUsed": true}
	check := func(typ string, field func(v *View) reflect.Value) {
		t.Helper()
		probe := field(&base)
		for i := range probe.NumField() {
			name := typ + "." + probe.Type().Field(i).Name
			v := cloneView(base)
			v.Nodes[0].Labels = nil
			f := field(&v).Field(i)
			switch f.Kind() {
			case reflect.String:
				f.SetString("x")
			case reflect.Bool:
				f.SetBool(true)
			case reflect.Int, reflect.Int64:
				f.SetInt(7)
			case reflect.Uint64:
				f.SetUint(7)
			case reflect.Slice:
				s := reflect.MakeSlice(f.Type(), 1, 1)
				if s.Index(0).Kind() == reflect.String {
					s.Index(0).SetString("x")
				} else if s.Index(0).Kind() == reflect.Int {
					s.Index(0).SetInt(7)
				}
				if f.Len() == 1 { // GPUs, Shards: compared by their own checks
					continue
				}
				f.Set(s)
			case reflect.Map:
				f.Set(reflect.ValueOf(map[string]string{"k": "v"}))
			default:
				t.Fatalf("%s: a %s, which this test does not change: teach it", name, f.Kind())
			}
			if got := SameInputs(base, v); got != ignored[name] {
				t.Errorf("%s changed: SameInputs = %v", name, got)
			}
		}
	}
	check("Node", func(v *View) reflect.Value { return reflect.ValueOf(&v.Nodes[0]).Elem() })
	check("GPU", func(v *View) reflect.Value { return reflect.ValueOf(&v.Nodes[0].GPUs[0]).Elem() })
	check("HeldShard", func(v *View) reflect.Value { return reflect.ValueOf(&v.Nodes[0].Shards[0]).Elem() })

	// The view's own fields beside its nodes and deployments.
	usage := View{Share: true, Usage: map[string]Usage{"a": {Idle: true, LastRequest: 3}}}
	for name, change := range map[string]func(v *View){
		"Share":             func(v *View) { v.Share = false },
		"Usage.Idle":        func(v *View) { v.Usage["a"] = Usage{LastRequest: 3} },
		"Usage.LastRequest": func(v *View) { v.Usage["a"] = Usage{Idle: true, LastRequest: 4} },
		"Usage (another)":   func(v *View) { v.Usage["b"] = Usage{} },
	} {
		v := cloneView(usage)
		change(&v)
		if SameInputs(usage, v) {
			t.Errorf("%s changed: SameInputs = true", name)
		}
	}
	if n := reflect.TypeFor[View]().NumField(); n != 4 {
		t.Errorf("View has %d fields; this test knows 4: teach it the new one", n)
	}
}
