package engine

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/profile"
)

// SGLang's key reaches the engine in a 0600 file in a 0700 directory, and
// a restart with another key rewrites it.
func TestWriteProfileFilesKeyIs0600(t *testing.T) {
	prof, err := profile.Lookup("sglang")
	if err != nil {
		t.Fatal(err)
	}
	dir := profileFilesDir(t.TempDir(), "e1")
	spec := placement.Deployment{Name: "s", Model: "m"}
	for _, key := range []string{"first", "second"} {
		if err := writeProfileFiles(prof, spec, profile.Inputs{Port: 1, APIKey: key, FilesDir: dir}); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "sglang.yaml")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if want := "api-key: '" + key + "'\n"; string(b) != want {
			t.Errorf("file = %q, want %q", b, want)
		}
		for p, want := range map[string]os.FileMode{path: 0o600, dir: 0o700} {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != want {
				t.Errorf("%s mode %v, want %v", p, fi.Mode().Perm(), want)
			}
		}
	}
}
