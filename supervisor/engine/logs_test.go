package engine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// capLog keeps one generation and empties the log in place; a writer that
// holds the file open with O_APPEND (our runtimes' engines, containerd's
// shim) goes on writing at its new start.
func TestCapLogCopiesAndEmptiesInPlace(t *testing.T) {
	p := filepath.Join(t.TempDir(), "e.log")
	w, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	old := strings.Repeat("old line\n", 100)
	w.WriteString(old)
	if err := capLog(p, 10000); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p + ".1"); !os.IsNotExist(err) {
		t.Fatalf("a log under the limit was rotated (%v)", err)
	}
	if err := capLog(p, 100); err != nil {
		t.Fatal(err)
	}
	w.WriteString("new line\n")
	if b, _ := os.ReadFile(p + ".1"); string(b) != old {
		t.Fatalf("generation .1 holds %d bytes, want the %d before the cap", len(b), len(old))
	}
	if b, _ := os.ReadFile(p); string(b) != "new line\n" {
		t.Fatalf("log after the cap = %q, want only the new line", b)
	}
}
