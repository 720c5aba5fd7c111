package placement

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// A spec field newer than protocol 1 is listed, with the version it
// needs, only where the spec sets it and the version does not know it.
func TestFieldsAboveListsWhatTheVersionDoesNotKnow(t *testing.T) {
	plain := Deployment{Name: "chat", Model: "m", Replicas: 1, Update: UpdateRecreate, Args: []string{"--x"}}
	timed := plain
	timed.StartTimeout = Duration(3 * time.Hour)
	for _, tc := range []struct {
		d       Deployment
		version int
		want    []FieldVersion
	}{
		{plain, 1, nil},
		{plain, 2, nil},
		{timed, 1, []FieldVersion{{Field: "start_timeout", Protocol: 2}}},
		{timed, 2, nil},
		{timed, 3, nil},
	} {
		if got := tc.d.FieldsAbove(tc.version); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("start_timeout %s at protocol %d: %v, want %v", tc.d.StartTimeout, tc.version, got, tc.want)
		}
	}
}

// Every field the table names is a field of the spec's JSON, spelled as
// the API spells it, and the table's set function sees it: a spec with
// the field set lists it at protocol 1.
func TestFieldVersionsNameRealFields(t *testing.T) {
	full := Deployment{Name: "chat", Model: "m", StartTimeout: Duration(time.Hour), Fit: &Fit{SeqsChosen: true}, Autoscale: &Autoscale{Min: 1, Max: 2}, Priority: 3,
		MaxLoras: 2, MaxLoraRank: 8, Adapters: []Adapter{{Name: "sql", Source: "org/sql-lora"}},
		Prefill: &Role{Replicas: 1}, Decode: &Role{Replicas: 1}, Transfer: &Transfer{Fallback: true}}
	b, err := json.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	for _, f := range fieldVersions() {
		// A dotted name is a field of an object field (fit.seqs_chosen).
		parent, child, nested := strings.Cut(f.Field, ".")
		if nested {
			var inner map[string]json.RawMessage
			_ = json.Unmarshal(fields[parent], &inner)
			if _, ok := inner[child]; !ok {
				t.Errorf("%s: no such field in %s (set it in this test's spec when adding a row)", f.Field, b)
			}
		} else if _, ok := fields[f.Field]; !ok {
			t.Errorf("%s: no such field in %s (set it in this test's spec when adding a row)", f.Field, b)
		}
		if f.Protocol < 2 {
			t.Errorf("%s: protocol %d; every agent knows the fields of protocol 1", f.Field, f.Protocol)
		}
		if !f.set(full) {
			t.Errorf("%s: set in %s, but the table does not see it", f.Field, b)
		}
	}
}

// A spec stored by the previous release (9f0749d) has, read by this one,
// the spec version that release gave it: an upgrade rolls no engine by
// itself. The expected values are what 9f0749d's SpecVersion returned for
// these specs; a field added since must stay out of the hash while unset,
// and a default must not be written into a decoded spec.
func TestSpecVersionIsThePreviousReleases(t *testing.T) {
	for _, tc := range []struct{ spec, want string }{
		{`{"name":"chat","model":"org/chat-model","replicas":2,"labels":{"zone":"a"},"args":["--max-model-len","8192"],"env":{"HF_HOME":"/w"}}`, "0278b391452d"},
		{`{"name":"big","model":"org/big","engine":"sglang","image":"lmsysorg/sglang:v0.4","replicas":3,"tensor_parallel":2,"pipeline_parallel":2,"gpu_memory":"40GiB","max_model_len":32768,"max_num_seqs":64,"fit":{"params":7000000000,"weights_bytes":14000000000,"kv_bytes_per_token":131072,"weights_per_gpu":7000000000,"kv_cache_per_gpu":8000000000,"overhead_per_gpu":2000000000,"source":"local"},"gpu_type":"H100","update":"recreate"}`, "289750f6e286"},
		{`{"name":"min","model":"org/m","replicas":1}`, "419572b71602"},
	} {
		// As gossip and deployments.json read a stored spec.
		var d Deployment
		if err := json.Unmarshal([]byte(tc.spec), &d); err != nil {
			t.Fatal(err)
		}
		if got := d.SpecVersion(); got != tc.want {
			t.Errorf("%s: spec version %s, 9f0749d's was %s", d.Name, got, tc.want)
		}
		// As the API decodes one.
		d, err := DecodeDeployment([]byte(tc.spec))
		if err != nil {
			t.Fatal(err)
		}
		if got := d.SpecVersion(); got != tc.want {
			t.Errorf("%s decoded by the API: spec version %s, 9f0749d's was %s", d.Name, got, tc.want)
		}
		// Fields that do not change how an engine runs stay out of it.
		tuned := d
		tuned.Replicas, tuned.Update, tuned.StartTimeout = 7, UpdateSurge, Duration(time.Hour)
		if got := tuned.SpecVersion(); got != tc.want {
			t.Errorf("%s: replicas, update or start_timeout moved the spec version to %s", d.Name, got)
		}
	}
}
