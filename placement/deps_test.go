package placement

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// allowedImports is everything placement's non-test code may import: pure
// standard-library packages that neither do I/O nor depend on scheduling or
// randomness. Adding to it is a design decision; say why in the commit.
var allowedImports = []string{
	"bytes",
	"cmp",
	"encoding/binary",
	"encoding/hex",
	"encoding/json",
	"crypto/sha256",
	"errors",
	"fmt",
	"io", // io.EOF only; io does no I/O by itself
	"maps",
	"math",
	"math/bits",
	"reflect",
	"regexp",
	"slices",
	"sort",
	"strconv",
	"strings",
	"time",
	"unicode",
	"unicode/utf8",
}

// forbiddenPrefixes name the reason a package may never be imported here,
// so a failure says more than "not in the list".
var forbiddenPrefixes = map[string]string{
	"os":                              "file and process I/O",
	"net":                             "network I/O",
	"syscall":                         "system calls",
	"io/ioutil":                       "file I/O",
	"math/rand":                       "randomness: plans must be equal on every node",
	"crypto/rand":                     "randomness: plans must be equal on every node",
	"sync":                            "placement runs no goroutines",
	"runtime":                         "placement must not depend on the runtime",
	"unsafe":                          "no",
	"github.com/containerd/":          "containerd belongs to the supervisor's runtime",
	"github.com/hashicorp/memberlist": "gossip belongs to gossip/",
}

// TestImports parses the package's non-test files (no go list, no build
// cache) and fails on any import outside the allowlist.
func TestImports(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		ast, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range ast.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			for prefix, why := range forbiddenPrefixes {
				if path == prefix || strings.HasPrefix(path, strings.TrimSuffix(prefix, "/")+"/") {
					t.Errorf("%s imports %s: %s", f, path, why)
				}
			}
			if !slices.Contains(allowedImports, path) {
				t.Errorf("%s imports %s, which is not in the allowlist of pure standard-library packages", f, path)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no source files found: run from the package directory")
	}
}
