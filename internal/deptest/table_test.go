package deptest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The design's package table (docs/architecture.md, "Packages and import
// rules") is the allow-list: every package of the module has a row, every
// row is a package of the module, and every module package a package's
// non-test files import is one its row names (tests import the test
// helpers from anywhere). A new import, or a new, moved or removed package,
// changes the table in the same commit, so the two cannot drift.

// row is one line of the table: the packages it describes and what they
// may import.
type row struct {
	pkgs     []string
	anything bool
	allowed  []string // module packages; a trailing "/*" allows a subtree
	line     int
}

func (r row) allows(imp string) bool {
	if r.anything {
		return true
	}
	for _, a := range r.allowed {
		if a == imp || (strings.HasSuffix(a, "/*") && within(imp, strings.TrimSuffix(a, "/*"))) {
			return true
		}
	}
	return false
}

var (
	backticked = regexp.MustCompile("`([^`]+)`")
	braces     = regexp.MustCompile(`^(.*)\{([^}]*)\}(.*)$`)
	pkgPath    = regexp.MustCompile(`^[a-z0-9]+(/[a-z0-9*]+)+$`)
)

// expand turns "supervisor/{a,b}" into its packages.
func expand(s string) []string {
	m := braces.FindStringSubmatch(s)
	if m == nil {
		return []string{s}
	}
	var out []string
	for _, alt := range strings.Split(m[2], ",") {
		out = append(out, expand(m[1]+strings.TrimSpace(alt)+m[3])...)
	}
	return out
}

// splitTop splits at commas outside braces.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '{':
			depth++
		case '}':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

// parseTable reads the package table of the design. A may-import cell is a
// comma-separated list of module packages (braces expand, "/*" is a
// subtree); "anything" allows all; prose ("charm libraries", "standard
// library only", "–") allows no module package; what follows a ";" (a
// "never" clause) is the prose of the rules above, not the allow-list. An
// item that is neither is an error naming its line, so a misspelt package
// is not read as prose that allows nothing.
func parseTable(doc string) (map[string]row, error) {
	lines := strings.Split(doc, "\n")
	start := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "| package | owns | may import") })
	if start < 0 {
		return nil, fmt.Errorf("docs/architecture.md has no package table (a line starting \"| package | owns | may import\")")
	}
	rows := map[string]row{}
	for i := start + 2; i < len(lines) && strings.HasPrefix(lines[i], "|"); i++ {
		cells := strings.Split(strings.Trim(lines[i], "|"), " | ")
		if len(cells) < 3 {
			return nil, fmt.Errorf("docs/architecture.md:%d: a table row needs three cells", i+1)
		}
		r := row{line: i + 1}
		for _, m := range backticked.FindAllStringSubmatch(cells[0], -1) {
			r.pkgs = append(r.pkgs, expand(m[1])...)
		}
		if len(r.pkgs) == 0 {
			return nil, fmt.Errorf("docs/architecture.md:%d: a row names no package (in backticks)", i+1)
		}
		may := cells[len(cells)-1]
		may, _, _ = strings.Cut(may, ";")
		for _, item := range splitTop(may) {
			item = strings.Trim(strings.TrimSpace(item), "`")
			first, _, prose := strings.Cut(item, " ")
			switch {
			case item == "anything":
				r.anything = true
			case isPackage(first) && prose:
				return nil, fmt.Errorf("docs/architecture.md:%d: %q: a package followed by words; put them after a \";\"", i+1, item)
			case prose || item == "–":
				// Prose: allows no module package.
			default:
				for _, p := range expand(item) {
					if !isPackage(p) {
						return nil, fmt.Errorf("docs/architecture.md:%d: %q is neither a module package nor prose", i+1, p)
					}
					r.allowed = append(r.allowed, p)
				}
			}
		}
		for _, p := range r.pkgs {
			if prev, dup := rows[p]; dup {
				return nil, fmt.Errorf("docs/architecture.md:%d: %s already has a row (line %d)", i+1, p, prev.line)
			}
			rows[p] = r
		}
	}
	return rows, nil
}

// isPackage: a module package path a cell may name ("/*" for a subtree).
func isPackage(p string) bool { return pkgPath.MatchString(p) || isTopPackage(p) }

// isTopPackage: a one-word module package a cell may name.
func isTopPackage(p string) bool {
	return slices.Contains([]string{"gossip", "placement", "probes", "supervisor", "scenarios"}, p)
}

func readDesign(t *testing.T) string {
	t.Helper()
	out, err := os.ReadFile(filepath.Join("..", "..", "docs", "architecture.md"))
	if err != nil {
		t.Fatalf("read the design: %v", err)
	}
	return string(out)
}

func TestImportsFollowTheDesignTable(t *testing.T) {
	rows, err := parseTable(readDesign(t))
	if err != nil {
		t.Fatal(err)
	}
	var missing, broken []string
	listed := map[string]bool{}
	for _, p := range listModule(t) {
		rel := p.rel()
		listed[rel] = true
		r, ok := rows[rel]
		if !ok {
			missing = append(missing, rel)
			continue
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			if dep := strings.TrimPrefix(imp, module+"/"); !r.allows(dep) {
				broken = append(broken, rel+" imports "+dep)
			}
		}
	}
	var stale []string
	for p, r := range rows {
		if !listed[p] {
			stale = append(stale, fmt.Sprintf("%s (line %d)", p, r.line))
		}
	}
	slices.Sort(stale)
	if len(stale) > 0 {
		t.Errorf("rows in docs/architecture.md's package table for packages the module does not have (remove or rename them):\n  %s", strings.Join(stale, "\n  "))
	}
	if len(missing) > 0 {
		t.Errorf("packages without a row in docs/architecture.md's package table (add one: what it owns, what it may import):\n  %s", strings.Join(missing, "\n  "))
	}
	if len(broken) > 0 {
		t.Errorf("imports the design's table does not allow (add them to the package's row, or remove the import):\n  %s", strings.Join(broken, "\n  "))
	}
}

// The table parser can fail: an import a row does not name is refused, a
// package without a row is not found, and the cell forms read as they say.
func TestDesignTableParser(t *testing.T) {
	doc := "| package | owns | may import (module packages) |\n|---|---|---|\n" +
		"| `a/b`, `a/c` | x | gossip, supervisor/{engine,status}, internal/*; never supervisor |\n" +
		"| `cmd/x` | y | anything |\n" +
		"| `leaf` | z | – |\n" +
		"| `ui` | w | charm libraries, placement/fit |\n"
	rows, err := parseTable(doc)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pkg, imp string
		ok       bool
	}{
		{"a/b", "gossip", true},
		{"a/c", "supervisor/engine", true},
		{"a/b", "supervisor/status", true},
		{"a/b", "internal/clock", true},
		{"a/b", "supervisor", false},
		{"a/b", "placement", false},
		{"cmd/x", "scenarios", true},
		{"leaf", "internal/clock", false},
		{"ui", "placement/fit", true},
		{"ui", "placement", false},
	} {
		if got := rows[c.pkg].allows(c.imp); got != c.ok {
			t.Errorf("%s importing %s: allowed %v, want %v", c.pkg, c.imp, got, c.ok)
		}
	}
	if _, ok := rows["nope"]; ok {
		t.Error("a package the table does not name has a row")
	}
	// A cell it cannot read is an error, not prose that allows nothing.
	head := "| package | owns | may import (module packages) |\n|---|---|---|\n"
	for _, bad := range []string{
		"| `a/b` | x | gossip, supervisor/Status |\n",
		"| `a/b` | x | gosip |\n",
		"| `a/b` | x | placement/fit (pure) |\n",
		"| `a/b` | x | gossip, |\n",
		"| a/b | x | gossip |\n",
		"| `a/b` | x |\n",
	} {
		if _, err := parseTable(head + bad); err == nil || !strings.Contains(err.Error(), "docs/architecture.md:3") {
			t.Errorf("%q: %v, want an error naming line 3", bad, err)
		}
	}
}
