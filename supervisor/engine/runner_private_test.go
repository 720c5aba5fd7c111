package engine

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/protocol"
)

// machineAddress is an address of this machine other than loopback, or
// "" when it has none.
func machineAddress() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
			return ipn.IP.String()
		}
	}
	return ""
}

// Below cluster version 4 an engine listens on every address (older
// gateways dial its record's URL); from 4 on, on loopback only, and its
// record says so (Private), also once a restarted agent adopted it. An
// engine started below 4 is not restarted when the version rises: its
// record's note says why its port is still open.
func TestEnginesListenOnLoopbackFromClusterVersion4(t *testing.T) {
	outside := machineAddress()
	for _, tc := range []struct {
		version int
		private bool
		host    string
	}{
		{protocol.V3, false, "0.0.0.0"},
		{protocol.V4, true, "127.0.0.1"},
	} {
		t.Run(fmt.Sprint("version=", tc.version), func(t *testing.T) {
			env := newRunnerEnv(t)
			r := env.open()
			d := desired("chat")
			d.ClusterVersion = tc.version
			runReady(t, r, d)
			rec := r.Shards()[0]
			if rec.Private != tc.private || !strings.HasPrefix(rec.URL, "http://127.0.0.1:") {
				t.Fatalf("record %+v: want private %v at the node's address", rec, tc.private)
			}
			argv, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", rec.PID))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(argv), "--host\x00"+tc.host+"\x00") {
				t.Errorf("the engine's command line %q lacks --host %s", strings.ReplaceAll(string(argv), "\x00", " "), tc.host)
			}
			_, port, _ := strings.Cut(strings.TrimPrefix(rec.URL, "http://"), ":")
			if outside != "" {
				cl := &http.Client{Timeout: 2 * time.Second}
				resp, err := cl.Get("http://" + net.JoinHostPort(outside, port) + "/health")
				if err == nil {
					resp.Body.Close()
				}
				if reached := err == nil; reached == tc.private {
					t.Errorf("from %s the engine answered: %v, want %v", outside, reached, !tc.private)
				}
				cl.CloseIdleConnections()
			}
			// The agent restarts: the adopted engine says what it was
			// started with, whatever the version is now.
			r.Close()
			r2 := env.openUnsettled(func(*Config) {})
			t.Cleanup(func() {
				r2.Settle()
				r2.Reconcile(context.Background(), nil)
				waitShard(t, r2, "stopped", func(s []string) bool { return len(s) == 0 })
			})
			if s := r2.Shards(); len(s) != 1 || s[0].PID != rec.PID || s[0].Private != tc.private {
				t.Fatalf("adopted: %+v, want pid %d private %v", s, rec.PID, tc.private)
			}
			r2.Settle()
			d.ClusterVersion = protocol.V4
			r2.Reconcile(context.Background(), []Desired{d})
			waitShard(t, r2, "ready again", func([]string) bool { return readyPID(r2, "chat-0") == rec.PID })
			s := r2.Shards()[0]
			if s.PID != rec.PID {
				t.Fatalf("the engine was restarted when the version rose: pid %d, was %d", s.PID, rec.PID)
			}
			if got := s.Note == notePublic; got == tc.private {
				t.Errorf("note %q at version 4 for an engine private=%v", s.Note, tc.private)
			}
		})
	}
}
