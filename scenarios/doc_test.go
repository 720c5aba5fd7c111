package scenarios

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestGrammarDocumentsEveryCommand keeps doc.go, the one place the grammar
// is written down, in step with the code: every command, key and
// wait-until condition the runner accepts is documented there.
func TestGrammarDocumentsEveryCommand(t *testing.T) {
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	// A documented command or condition starts an indented line of the
	// doc comment: "//\tNAME ..." (or "//\texpect NAME" for expect's forms).
	documented := func(name string) bool {
		return regexp.MustCompile(`(?m)^//\t` + regexp.QuoteMeta(name) + `( |$)`).MatchString(doc)
	}
	for name, spec := range commandTable() {
		if !documented(name) {
			t.Errorf("command %s is not in doc.go", name)
		}
		for _, key := range strings.Fields(spec.keys + " mark") {
			if !strings.Contains(doc, key+"=") {
				t.Errorf("%s: key %s= is not in doc.go", name, key)
			}
		}
	}
	// The unknown-condition error lists every condition.
	_, err = (&runner{}).condition(&directive{}, "", nil)
	_, list, ok := strings.Cut(err.Error(), "(have ")
	if !ok {
		t.Fatalf("unknown condition: %v", err)
	}
	for _, c := range strings.Split(strings.TrimSuffix(list, ")"), ", ") {
		if !documented(c) {
			t.Errorf("condition %s is not in doc.go", c)
		}
	}
}
