package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/shardstate"
)

// A user who is not root, on a node whose data dir is root's (0700), is
// told what needs sudo, in place of the sections it cannot read, and is
// not told there are no engines.
func TestOverviewWithoutRootSaysWhatNeedsSudo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run the overview as another user against root's data dir")
	}
	tmp := t.TempDir()
	// The binary and the path to it must be readable by that user.
	for _, d := range []string{filepath.Dir(tmp), tmp} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := buildLlmgw(t, tmp)
	dir := filepath.Join(tmp, "data")
	d := datadir.New(dir)
	if err := os.MkdirAll(d.ShardsDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteIdentity(datadir.Identity{Name: "gpu-1", Epoch: 1, Peers: []string{"10.0.0.2:7946"}}); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteAlive(datadir.Alive{At: time.Now(), PID: os.Getpid(), API: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	st := shardstate.State{ShardID: "chat-0", PID: os.Getpid(), Spec: shardstate.Spec{Engine: "fake", ServedModelName: "chat", SpecVersion: "v1", EngineID: "chat-0-v1"}}
	if err := shardstate.Save(d.ShardsDir(), st); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "overview", "--once", "--data-dir", dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("overview as nobody: %v\n%s", err, out)
	}
	frame := string(out)
	for _, want := range []string{"run with sudo to read the shard state files", "Run with sudo to read", "node.json", "the data dir is root's"} {
		if !strings.Contains(frame, want) {
			t.Errorf("frame lacks %q:\n%s", want, frame)
		}
	}
	if strings.Contains(frame, "none on this machine") || strings.Contains(frame, "chat-0") {
		t.Errorf("nobody read root's engines, or was told there are none:\n%s", frame)
	}
}
