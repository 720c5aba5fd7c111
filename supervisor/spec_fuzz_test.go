package supervisor

import (
	"encoding/json"
	"testing"
)

// FuzzDecodeSpec feeds JSON and YAML through the API's decoder: it never
// panics, and whatever it accepts is valid and survives a JSON round trip
// unchanged (what gossip does to it).
func FuzzDecodeSpec(f *testing.F) {
	f.Add([]byte(`{"name":"chat","model":"m","replicas":2,"gpu_memory":"70GiB"}`), "application/json")
	f.Add([]byte("name: chat\nmodel: m\ntensor_parallel: 2\nlabels: {zone: a}\nargs: [--x]\n"), "application/yaml")
	f.Add([]byte("name: [\n"), "application/yaml")
	f.Add([]byte(`{"name":"x","model":"m","gpu_memory":-1}`), "")
	f.Fuzz(func(t *testing.T, body []byte, ctype string) {
		d, err := DecodeSpec(body, ctype)
		if err != nil {
			return
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("accepted an invalid spec: %v", err)
		}
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		d2, err := DecodeSpec(b, "application/json")
		if err != nil {
			t.Fatalf("re-decode of %s: %v", b, err)
		}
		if d.SpecVersion() != d2.SpecVersion() {
			t.Fatalf("round trip changed the spec: %s", b)
		}
	})
}
