// Package spec reads deployment specs as operators send them (JSON or
// YAML, through the API and MCP alike), bounding what a body may cost before
// any per-level work, and redacts the secrets a spec may carry for callers
// without the token.
package spec

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/llmgw/llmgw/placement"
)

// redacted replaces a secret-bearing value in what callers without the
// token see.
const redacted = "(redacted: send the cluster token to see it)"

// Redact returns d with env values and the values of key-like
// arguments (--api-key X, --hf-token=X, ...) redacted.
func Redact(d placement.Deployment) placement.Deployment {
	if len(d.Env) > 0 {
		env := make(map[string]string, len(d.Env))
		for k := range d.Env {
			env[k] = redacted
		}
		d.Env = env
	}
	if len(d.Args) > 0 {
		args := slices.Clone(d.Args)
		for i := 0; i < len(args); i++ {
			name, _, hasValue := strings.Cut(args[i], "=")
			if !secretFlag(name) {
				continue
			}
			if hasValue {
				args[i] = name + "=" + redacted
			} else if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				args[i+1] = redacted
				i++
			}
		}
		d.Args = args
	}
	return d
}

// secretFlag reports whether an engine flag's value is likely a secret.
func secretFlag(name string) bool {
	if !strings.HasPrefix(name, "-") {
		return false
	}
	n := strings.ToLower(name)
	for _, w := range []string{"key", "token", "secret", "password", "passwd", "credential"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// Decode reads a deployment from JSON or YAML.
//
// What a body may cost stays a small multiple of its size: JSON is checked
// for nesting by placement before anything is built per level, and YAML is
// checked here, before the YAML parser builds its tree (yamlGuard).
func Decode(body []byte, contentType string) (placement.Deployment, error) {
	js := body
	trimmed := bytes.TrimSpace(body)
	if !bytes.HasPrefix(trimmed, []byte("{")) || strings.Contains(contentType, "yaml") {
		if err := yamlGuard(body); err != nil {
			return placement.Deployment{}, fmt.Errorf("%w: %w", placement.ErrInvalidDeployment, err)
		}
		// The YAML reader takes the first document only: the rest of a
		// multi-document body would vanish without a word.
		if yamlDocuments(body) > 1 {
			return placement.Deployment{}, fmt.Errorf("%w: the body holds several YAML documents; send one deployment per request", placement.ErrInvalidDeployment)
		}
		var err error
		// Strict: a key given twice is an error, not "the last one wins".
		if js, err = yaml.YAMLToJSONStrict(body); err != nil {
			return placement.Deployment{}, fmt.Errorf("%w: spec is neither JSON nor valid YAML: %w", placement.ErrInvalidDeployment, err)
		}
	}
	return placement.DecodeDeployment(js)
}

// yamlDocuments counts the YAML documents in body that hold anything: a
// "---" at the start of a line separates documents (inside a block scalar
// it would be indented), and comments or blank lines alone are no document.
func yamlDocuments(body []byte) int {
	docs, content := 0, false
	// SplitSeq: one line at a time, not a slice of every line.
	for line := range bytes.SplitSeq(body, []byte("\n")) {
		t := bytes.TrimRight(line, " \t\r")
		if string(t) == "---" || bytes.HasPrefix(t, []byte("--- ")) || string(t) == "..." {
			if content {
				docs++
			}
			content = false
			continue
		}
		if s := bytes.TrimSpace(t); len(s) > 0 && s[0] != '#' {
			content = true
		}
	}
	if content {
		docs++
	}
	return docs
}
