package deptest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/llmgw/llmgw"

// pkg is what `go list -json` says of one package.
type pkg struct {
	ImportPath   string
	Imports      []string
	Deps         []string
	TestImports  []string
	XTestImports []string
}

func (p pkg) rel() string { return strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/") }

// direct is every package p's own files import, tests included.
func (p pkg) direct() []string {
	return slices.Concat(p.Imports, p.TestImports, p.XTestImports)
}

func listModule(t *testing.T) []pkg {
	t.Helper()
	touchSources(t)
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,Deps,TestImports,XTestImports", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages of %s; expected the whole module", len(pkgs), module)
	}
	return pkgs
}

// touchSources reads every Go file of the module. go test caches a
// passing result until a file the test read changes, and it cannot see what
// `go list` read: without this, a forbidden import added later would pass
// from the cache.
func touchSources(t *testing.T) {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata"):
			return filepath.SkipDir
		case !d.IsDir() && strings.HasSuffix(path, ".go"):
			_, err := os.ReadFile(path)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read the module's sources: %v", err)
	}
}

// within reports whether rel is dir or a package under it.
func within(rel, dir string) bool { return rel == dir || strings.HasPrefix(rel, dir+"/") }

func stdlib(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

// rule is one import rule: for every package it applies to, bad names the
// imports it forbids, with why.
type rule struct {
	name    string
	applies func(rel string) bool
	// imports picks what is checked: direct imports (tests included), or
	// the non-test dependency closure.
	imports func(p pkg) []string
	bad     func(imp string) bool
}

func rules() []rule {
	ours := func(dir string) func(string) bool {
		return func(imp string) bool {
			return within(strings.TrimPrefix(imp, module+"/"), dir) && strings.HasPrefix(imp, module+"/")
		}
	}
	closure := func(p pkg) []string { return p.Deps }
	return []rule{
		{
			name:    "gossip and probes are below the supervisor: they never import it, even indirectly",
			applies: func(rel string) bool { return within(rel, "gossip") || within(rel, "probes") },
			imports: closure,
			bad:     ours("supervisor"),
		},
		{
			name:    "only supervisor/runtime/containerd imports containerd",
			applies: func(rel string) bool { return !within(rel, "supervisor/runtime/containerd") },
			imports: pkg.direct,
			bad:     func(imp string) bool { return strings.HasPrefix(imp, "github.com/containerd/") },
		},
		{
			name:    "placement is pure: the standard library only",
			applies: func(rel string) bool { return within(rel, "placement") },
			imports: closure,
			// placement/fit/fittest may use placement/fit, which is held to
			// the same rule.
			bad: func(imp string) bool { return !stdlib(imp) && !ours("placement")(imp) },
		},
		{
			name:    "supervisor/status, the read model, is pure: no I/O of its own",
			applies: func(rel string) bool { return rel == "supervisor/status" },
			imports: func(p pkg) []string { return p.Imports },
			bad: func(imp string) bool {
				return slices.Contains([]string{"os", "os/exec", "net", "net/http", "io/fs", "syscall", "math/rand", "math/rand/v2"}, imp) ||
					strings.HasPrefix(imp, module+"/supervisor") || strings.HasPrefix(imp, module+"/probes")
			},
		},
		{
			// The node that accepts a place computes the figure once; the
			// CLI and tests must get the same one from the same headers.
			name:    "placement/fit, the memory estimate, does no I/O: probes/weights reads the files",
			applies: func(rel string) bool { return within(rel, "placement/fit") },
			imports: func(p pkg) []string { return p.Imports },
			bad: func(imp string) bool {
				return slices.Contains([]string{"os", "os/exec", "net", "net/http", "io/fs", "syscall", "math/rand", "math/rand/v2", "time", "sync"}, imp)
			},
		},
		{
			// It routes from the read model, as any node does.
			name:    "supervisor/gateway never imports the node or the engine runner",
			applies: func(rel string) bool { return within(rel, "supervisor/gateway") },
			imports: func(p pkg) []string { return slices.Concat(p.Deps, p.direct()) },
			bad:     func(imp string) bool { return imp == module+"/supervisor" || ours("supervisor/engine")(imp) },
		},
		{
			name:    "nothing but cmd/llmgw imports the scenarios",
			applies: func(rel string) bool { return rel != "cmd/llmgw" && !within(rel, "scenarios") },
			imports: func(p pkg) []string { return slices.Concat(p.Deps, p.direct()) },
			bad:     ours("scenarios"),
		},
		{
			name:    "nothing imports cmd",
			applies: func(rel string) bool { return !within(rel, "cmd") },
			imports: func(p pkg) []string { return slices.Concat(p.Deps, p.direct()) },
			bad:     ours("cmd"),
		},
		{
			// internal/clock names the part of clockwork the loops use.
			name:    "internal/ holds leaf helpers: the standard library only (internal/clock: and clockwork)",
			applies: func(rel string) bool { return within(rel, "internal") && rel != "internal/deptest" },
			imports: func(p pkg) []string { return p.Imports },
			bad:     func(imp string) bool { return !stdlib(imp) && imp != "github.com/jonboulle/clockwork" },
		},
	}
}

func TestImportRules(t *testing.T) {
	pkgs := listModule(t)
	for _, r := range rules() {
		var broken []string
		for _, p := range pkgs {
			if !r.applies(p.rel()) {
				continue
			}
			for _, imp := range r.imports(p) {
				if r.bad(imp) {
					broken = append(broken, fmt.Sprintf("%s imports %s", p.rel(), imp))
				}
			}
		}
		slices.Sort(broken)
		broken = slices.Compact(broken)
		if len(broken) > 0 {
			t.Errorf("%s:\n  %s", r.name, strings.Join(broken, "\n  "))
		}
	}
}

// Every rule must be able to fail: each forbids something that a real
// import path would trip.
func TestRulesCanFail(t *testing.T) {
	cases := map[string]struct{ pkg, imp string }{
		"gossip and probes are below the supervisor: they never import it, even indirectly": {"gossip", module + "/supervisor"},
		"only supervisor/runtime/containerd imports containerd":                             {"supervisor/engine", "github.com/containerd/containerd/v2/client"},
		"placement is pure: the standard library only":                                      {"placement", "github.com/hashicorp/memberlist"},
		"supervisor/status, the read model, is pure: no I/O of its own":                     {"supervisor/status", "os"},
		"supervisor/gateway never imports the node or the engine runner":                    {"supervisor/gateway", module + "/supervisor/engine"},
		"placement/fit, the memory estimate, does no I/O: probes/weights reads the files":   {"placement/fit", "os"},
		"nothing but cmd/llmgw imports the scenarios":                                       {"supervisor", module + "/scenarios"},
		"nothing imports cmd": {"scenarios", module + "/cmd/llmgw"},
		"internal/ holds leaf helpers: the standard library only (internal/clock: and clockwork)": {"internal/clock", module + "/gossip"},
	}
	for _, r := range rules() {
		c, ok := cases[r.name]
		if !ok {
			t.Errorf("rule %q has no case showing it can fail", r.name)
			continue
		}
		if !r.applies(c.pkg) || !r.bad(c.imp) {
			t.Errorf("rule %q does not catch %s importing %s", r.name, c.pkg, c.imp)
		}
	}
}
