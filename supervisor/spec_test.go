package supervisor

import (
	"errors"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/placement"
)

// DecodeSpec takes exactly one deployment, and says so when a body holds
// more than one, or a key twice, instead of keeping part of it.
func TestDecodeSpecRefusesWhatItWouldHalfApply(t *testing.T) {
	for _, tc := range []struct {
		name, body, ctype, wantErr string
	}{
		{"two YAML documents", "name: a\nmodel: m\n---\nname: b\nmodel: m\n", "application/yaml", "several YAML documents"},
		{"a YAML key twice", "name: a\nmodel: m\nreplicas: 1\nreplicas: 2\n", "application/yaml", "replicas"},
		{"a JSON key twice", `{"name":"a","model":"m","replicas":1,"replicas":2}`, "application/json", "replicas: given more than once"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeSpec([]byte(tc.body), tc.ctype)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, placement.ErrInvalidDeployment) {
				t.Fatalf("got %v, want an invalid-deployment error containing %q", err, tc.wantErr)
			}
		})
	}
	for _, body := range []string{
		"---\nname: a\nmodel: m\n",                   // a leading marker is one document
		"# a comment\n---\nname: a\nmodel: m\n...\n", // and so are comments and an end marker
		"name: a\nmodel: m\nargs:\n  - |\n    ---\n", // "---" inside a block scalar is text
	} {
		d, err := DecodeSpec([]byte(body), "application/yaml")
		if err != nil || d.Name != "a" {
			t.Errorf("%q: %+v, %v; want deployment a", body, d, err)
		}
	}
}
