package spec

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/llmgw/llmgw/placement"
)

// yamlTrickySpecs are YAML forms where a scan that only looks at the text
// would lose its place: plain scalars continued over lines (their quotes
// and brackets are text), block scalars with and without indentation
// indicators, compact and indentless sequences, complex and flow keys,
// properties, comments and other line breaks.
var yamlTrickySpecs = []string{
	"x:\n- plain\n \"not a quote\n- [a, [b]]\n",
	"key: plain\n  \"still plain\na: {b: [c]}\n",
	"a: |\n      text [\n    \"more\nb: 1\n",
	"- - |2\n    text\n  - [x]\n",
	"a: >-\n  folded {\n\n  \"\nb: [c]\n",
	"? [a, b]\n: value\n? - c\n: - d\n",
	"[a, b]: c\n{d: e}: [f]\n",
	"&x !!map a: !!str b\nc: &y [d]\n",
	"a:\n  - b: c\n    d:\n    - e\n    - f: g\n",
	"a: 'it''s\n  [x'\nb: \"esc \\\" [ \\\n  y\"\n",
	"a: b # c: [d\ne: f\n",
	"a:\r\n  b:\r\n    c: d\r\n",
	"a:\u0085  b: [c]\u2028d: e\n",
	"%YAML 1.1\n---\na: [b]\n...\n---\nc: d\n",
	"a: b\n\tc: d\n",
	"[a, b: c, {d: e}]\n",
	"a: -x\nb: ?y\nc: :z\n",
	"a:\n\n\n  b\n\n  c\n",
}

// FuzzYAMLShapeBoundsTheParse holds yamlShape to what it promises: for
// every body it lets through, the tree the YAML parser builds nests no
// deeper, and holds at most twice the values, than it counted. A scan
// that lost its place (took text for structure or structure for text)
// would let a costly body through; this finds it.
func FuzzYAMLShapeBoundsTheParse(f *testing.F) {
	for _, body := range yamlTrickySpecs {
		f.Add([]byte(body))
	}
	for _, body := range ordinarySpecs {
		f.Add([]byte(body))
	}
	for _, h := range hostileSpecs(200) {
		f.Add([]byte(h.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		shape, err := yamlShape(body, placement.MaxSpecDepth, 1<<30)
		if err != nil {
			return // refused before the parser sees it
		}
		js, err := yaml.YAMLToJSON(body)
		if err != nil {
			return
		}
		depth, values := jsonTreeShape(t, js)
		if depth > shape.depth || values > 2*shape.values+1 {
			t.Fatalf("%q parses to depth %d with %d values; the scan promised at most %d and %d", body, depth, values, shape.depth, 2*shape.values+1)
		}
	})
}

// jsonTreeShape is the nesting depth of js and how many keys and values it
// holds.
func jsonTreeShape(t *testing.T, js []byte) (depth, values int) {
	dec := json.NewDecoder(bytes.NewReader(js))
	open := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return depth, values
		}
		if err != nil {
			t.Fatalf("the YAML parser made invalid JSON %q: %v", js, err)
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			open++
			depth = max(depth, open)
			values++
		case json.Delim('}'), json.Delim(']'):
			open--
		default:
			values++ // a key or a scalar
		}
	}
}

// The scan follows the parser through the forms a text-only scan gets
// wrong, and refuses what it must, saying where.
func TestYAMLShape(t *testing.T) {
	for _, body := range yamlTrickySpecs {
		shape, err := yamlShape([]byte(body), placement.MaxSpecDepth, 1<<30)
		if err != nil {
			t.Errorf("%q: %v", body, err)
			continue
		}
		js, err := yaml.YAMLToJSON([]byte(body))
		if err != nil {
			continue // the scan's count still bounds what was built before the error
		}
		if depth, values := jsonTreeShape(t, js); depth > shape.depth || values > 2*shape.values+1 {
			t.Errorf("%q parses to depth %d with %d values; the scan counted %d and %d", body, depth, values, shape.depth, shape.values)
		}
	}
	for _, tc := range []struct{ body, want string }{
		// A continued plain scalar's quote hides nothing from the scan.
		{"x:\n- plain\n \"\n- " + strings.Repeat("[", 40) + "\n", "nested deeper than 32 levels (at line 4)"},
		{"a: |\n   \"\nb:\n" + strings.Repeat(" ", 1) + "c:\n  d:\n   e:\n    f:\n     g:\n      h:\n       i:\n        j:\n         k:\n          l:\n           m:\n            n:\n             o:\n              p:\n               q:\n                r: s\n", "nested deeper than 32 levels"},
		{"a: [b, *c]\n", "line 1: YAML aliases"},
		{"a: b\n\uFEFFc: d\n", "byte-order mark"},
		{"a: \xff\n", "not UTF-8"},
	} {
		_, err := yamlShape([]byte(tc.body), placement.MaxSpecDepth, placement.MaxSpecValues)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error saying %q", tc.body, err, tc.want)
		}
	}
}
