package scenarios

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/internal/freeport"
)

var (
	rewrite     = flag.Bool("rewrite", false, "rewrite the expected outputs of the scenarios that run")
	runAll      = flag.Bool("all", false, "run every scenario, not only those labelled short (also: LLMGW_SCENARIOS=all)")
	binaryFlag  = flag.String("binary", "", "use this llmgw binary instead of building one (also: LLMGW_BINARY)")
	keepDir     = flag.String("keep", "", "keep each scenario's data dirs and node logs under this directory")
	summaryFile = flag.String("summary", "", "also write the summary table to this file (also: LLMGW_SCENARIO_SUMMARY)")
	filesFlag   = flag.String("files", "", "run these scenario files (comma-separated paths) instead of testdata/*.txt, whatever their labels")
)

// TestScenarios runs testdata/*.txt against real nodes: by default the
// scenarios labelled short; with -all (make scenarios) every one. Run one
// with -run 'TestScenarios/node-crash'.
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	all := *runAll || os.Getenv("LLMGW_SCENARIOS") == "all"
	if *filesFlag != "" {
		files, all = strings.Split(*filesFlag, ","), true
	}
	var selected []string
	for _, f := range files {
		s, err := parseFile(f)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if all || slices.Contains(s.labels, "short") {
			selected = append(selected, f)
		}
	}
	if len(selected) == 0 {
		t.Skip("no scenario selected")
	}
	bin := binary(t)
	ports := freeport.New()
	var results []Result
	for _, f := range selected {
		name := strings.TrimSuffix(filepath.Base(f), ".txt")
		t.Run(name, func(t *testing.T) {
			res, err := Run(t.Context(), Options{Binary: bin, WorkDir: *keepDir, Rewrite: *rewrite, Out: logWriter{t}, Ports: ports}, f)
			results = append(results, res)
			if res.Skipped {
				t.Skip(res.Why)
			}
			if err != nil || !res.Passed {
				for _, n := range sortedKeys(res.Logs) {
					t.Logf("--- last lines of %s's log:\n%s", n, res.Logs[n])
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Rewritten {
				t.Logf("rewrote %s", f)
			}
			if !res.Passed {
				t.Error(res.Why)
			}
		})
	}
	sum := Summary(results)
	t.Log("summary\n" + sum)
	out := *summaryFile
	if out == "" {
		out = os.Getenv("LLMGW_SCENARIO_SUMMARY")
	}
	if out != "" {
		if err := os.WriteFile(out, []byte(sum), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// binary builds llmgw once into a temporary directory, unless one is
// given.
func binary(t *testing.T) string {
	if b := *binaryFlag; b != "" {
		return b
	}
	if b := os.Getenv("LLMGW_BINARY"); b != "" {
		return b
	}
	bin := filepath.Join(t.TempDir(), "llmgw")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/llmgw/llmgw/cmd/llmgw")
	cmd.Env = os.Environ()
	if os.Getenv("CGO_CFLAGS") == "" {
		// go-nvml's cgo bindings call functions its header marks deprecated.
		cmd.Env = append(cmd.Env, "CGO_CFLAGS=-Wno-deprecated-declarations")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build llmgw: %v\n%s", err, out)
	}
	return bin
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func sortedKeys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
