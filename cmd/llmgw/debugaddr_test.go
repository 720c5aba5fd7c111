package main

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// --debug-addr serves Go's profiles on loopback, and nothing else of the
// node does: the API does not.
func TestDebugAddrServesProfiles(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	n := startNode(t, "n1", filepath.Join(t.TempDir(), "n1"), "--debug-addr", addr)
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("http://" + addr + "/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Fatalf("GET /debug/pprof/ at --debug-addr: %d %.200s", code, body)
	}
	if code, _ := get("http://" + addr + "/debug/pprof/heap?debug=1"); code != http.StatusOK {
		t.Errorf("heap profile: %d", code)
	}
	if code, _ := get(n.api + "/debug/pprof/"); code == http.StatusOK {
		t.Error("the API serves the profiles too")
	}
}
