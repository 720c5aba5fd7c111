package spec

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/internal/testmem"
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
		d, err := Decode(body, ctype)
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
		d2, err := Decode(b, "application/json")
		if err != nil {
			t.Fatalf("re-decode of %s: %v", b, err)
		}
		if d.SpecVersion() != d2.SpecVersion() {
			t.Fatalf("round trip changed the spec: %s", b)
		}
	})
}

// FuzzDecodeSpecMemory: whatever the body, decoding it allocates at most
// a small multiple of its size plus a constant (specAllocBudget). The
// seeds are smaller cuts of the bodies that once cost far more: deep
// nesting (600 KB of nested JSON objects took 10 GB; the 15 KB of nested
// YAML flow mappings here took 15 MB), wide lists and aliases. Small, so
// that the fuzzer mutates and minimises them quickly;
// TestDecodeSpecRefusesCostlyBodies has the full sizes.
func FuzzDecodeSpecMemory(f *testing.F) {
	for _, h := range hostileSpecs(3000) {
		f.Add([]byte(h.body), h.ctype)
	}
	for _, body := range ordinarySpecs {
		f.Add([]byte(body), "")
	}
	f.Fuzz(func(t *testing.T, body []byte, ctype string) {
		var err error
		got := testmem.Allocated(func() { _, err = Decode(body, ctype) })
		if limit := specAllocBudget(len(body)); testmem.Exact() && got > limit {
			t.Fatalf("a %d-byte body (%.80q…) allocated %d bytes, over its budget of %d (decode error: %v)", len(body), body, got, limit, err)
		}
	})
}

// specAllocBudget is what decoding a body of n bytes may allocate: every
// YAML or JSON decoder copies the text several times over (25 times for
// one long YAML string), and the shape limits bound what is spent per
// value (a few MB at placement.MaxSpecValues).
func specAllocBudget(n int) uint64 { return 32*uint64(n) + 4<<20 }

type hostileSpec struct {
	name, body, ctype string
	// wantErr is what the refusal must say.
	wantErr string
}

// hostileSpecs are bodies whose decoding once cost far more than their
// size, each with what its refusal must say when it is large: n is how
// many levels or list entries the deep and wide ones hold, give or take
// a factor (the block mappings' size grows with the square of their
// levels, so they have fewer).
func hostileSpecs(n int) []hostileSpec {
	indented := func(levels int, lineBreak string) string {
		var b strings.Builder
		for i := range levels {
			b.WriteString(strings.Repeat(" ", i) + "a:" + lineBreak)
		}
		return b.String()
	}
	deep := "nested deeper than 32 levels"
	wide := "more than 4096 keys, values and list entries"
	var labels strings.Builder
	for i := range n / 10 {
		fmt.Fprintf(&labels, "  k%d: v\n", i)
	}
	// The YAML parser's own limit is 10,000 levels: deeper, it refuses
	// cheaply by itself.
	yamlLevels := min(n, 9990)
	return []hostileSpec{
		{"JSON objects", strings.Repeat(`{"a":`, n/5), "", deep},
		{"JSON arrays in args", `{"name":"a","model":"m","args":` + strings.Repeat(`[`, n), "", deep},
		{"JSON objects as YAML", strings.Repeat(`{"a":`, n/5), "application/yaml", deep},
		{"YAML flow sequences", "args: " + strings.Repeat(`[`, yamlLevels) + strings.Repeat(`]`, yamlLevels), "application/yaml", deep},
		{"YAML flow mappings", "args: " + strings.Repeat(`{a: `, yamlLevels) + strings.Repeat(`}`, yamlLevels), "", deep},
		{"YAML compact sequences", "args:\n" + strings.Repeat(`- `, yamlLevels) + "x\n", "", deep},
		{"YAML block mappings", indented(max(n/600, 40), "\n"), "", deep},
		{"YAML block mappings, NEL line breaks", indented(max(n/600, 40), "\u0085"), "", deep},
		{"YAML block mappings, CR line breaks", indented(max(n/600, 40), "\r"), "", deep},
		{"JSON wide args", `{"name":"a","model":"m","args":[` + strings.Repeat(`"a",`, n/3) + `"a"]}`, "", wide},
		{"YAML wide flow args", "name: a\nmodel: m\nargs: [" + strings.Repeat("a,", n/2) + "a]\n", "", wide},
		{"YAML wide block args", "name: a\nmodel: m\nargs:\n" + strings.Repeat("- a\n", n/3), "", wide},
		{"YAML wide labels", "name: a\nmodel: m\nlabels:\n" + labels.String(), "", wide},
		{"YAML aliases", "a: &a [" + strings.Repeat("x,", 100) + "x]\nb: &b [" + strings.Repeat("*a,", 100) + "*a]\nc: [" + strings.Repeat("*b,", 100) + "*b]\n", "", "YAML aliases (*name) are not accepted"},
		{"UTF-16", "\xff\xfen\x00a\x00m\x00e\x00:\x00 \x00a\x00", "application/yaml", "not UTF-8"},
	}
}

// ordinarySpecs are specs written the ways people write them; the shape
// checks must accept every one.
var ordinarySpecs = []string{
	`{"name":"chat","model":"m","replicas":2,"gpu_memory":"70GiB","labels":{"zone":"a"},"env":{"A":"1"},"args":["--x","[y]"]}`,
	"name: chat\nmodel: m\ntensor_parallel: 2\nlabels: {zone: a}\nargs: [--x]\n",
	"---\n# a comment\nname: chat   # trailing comment\nmodel: \"m # not a comment\"\nlabels:\n  zone: a\n  'rack': \"b: c\"\nargs:\n- --max-model-len=8192\n- \"--chat-template={\\\"a\\\": [1]}\"\n- '--x=it''s'\n-   --y=[a]\nenv:\n  HF_HOME: /w\n  NOTE: it's {fine} [really]\n...\n",
	"name: chat\r\nmodel: m\r\nargs:\r\n  - |\r\n    a: [\r\n        b: {\r\n            c\r\n  - >-\r\n    folded\r\n",
	"name: &n chat\nmodel: !!str m\nreplicas: 3\nenv: {A: '1', B: \"2\"}\nargs:\n  -   --x\n  - \"--y\"   # quoted\n",
}
