package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/charmbracelet/lipgloss"

	"github.com/llmgw/llmgw/internal/testlog"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/status"
)

// tmuxSession drives one full-screen command in a private tmux server,
// as a person at a terminal would: keys in, the screen read back.
type tmuxSession struct {
	t      *testing.T
	socket string
	name   string
}

func (s tmuxSession) tmux(args ...string) (string, error) {
	out, err := exec.Command("tmux", append([]string{"-S", s.socket}, args...)...).CombinedOutput()
	return string(out), err
}

func newTmux(t *testing.T, socket, name string, width, height int, command string) tmuxSession {
	t.Helper()
	s := tmuxSession{t: t, socket: socket, name: name}
	if out, err := s.tmux("new-session", "-d", "-s", name, "-x", fmt.Sprint(width), "-y", fmt.Sprint(height), command); err != nil {
		t.Fatalf("tmux new-session: %v: %s", err, out)
	}
	return s
}

// screen is what the pane shows now, one string per row.
func (s tmuxSession) screen() string {
	out, err := s.tmux("capture-pane", "-p", "-t", s.name)
	if err != nil {
		return "capture-pane: " + err.Error() + ": " + out
	}
	return out
}

// waitScreen polls the pane until it shows every one of want.
func (s tmuxSession) waitScreen(within time.Duration, what string, want ...string) string {
	s.t.Helper()
	var last string
	testwait.Until(s.t, within, what, func() (bool, string) {
		last = s.screen()
		for _, w := range want {
			if !strings.Contains(last, w) {
				return false, "no " + w + " on:\n" + last
			}
		}
		return true, ""
	})
	return last
}

// waitGone polls until the session has ended (its command exited).
func (s tmuxSession) waitGone(within time.Duration) {
	s.t.Helper()
	testwait.Until(s.t, within, s.name+" exits", func() (bool, string) {
		_, err := s.tmux("has-session", "-t", s.name)
		return err != nil, "still running:\n" + s.screen()
	})
}

// buildLlmgw builds this command into dir: tmux runs it as a program.
func buildLlmgw(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "llmgw")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// A real node (a child process, simulated GPUs, the fake engine) seen
// through tmux: the overview (a bare llmgw on the terminal) shows its engine and GPUs; with the agent
// killed, its engine still runs and the overview says so; q leaves. And
// `llmgw top` at 80 columns draws its header on one row.
func TestOverviewAndTopInTmux(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		if os.Getenv("LLMGW_SKIP_TMUX_TESTS") == "1" {
			t.Skip("tmux not installed; LLMGW_SKIP_TMUX_TESTS=1")
		}
		t.Fatal("tmux not installed: apt-get install -y tmux (or LLMGW_SKIP_TMUX_TESTS=1 to skip)")
	}
	tmp := t.TempDir()
	bin := buildLlmgw(t, tmp)
	dataDir := filepath.Join(tmp, "node-1")
	stopEngines(t, dataDir)
	api := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	node := exec.Command(bin, "node", "up", "--name", "node-1", "--data-dir", dataDir, "--bind", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"--api", api, "--gateway", "127.0.0.1:0", "--profile", "local", "--runtime", "process", "--engine-ports", "23300-23399",
		"--simulate-gpus", "2xH100-80GB", "--insecure-gossip", "--log-file", filepath.Join(tmp, "node-1.log"))
	out := &testlog.Buffer{}
	node.Stdout, node.Stderr = out, out
	node.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	nodeDone := make(chan struct{})
	go func() { _ = node.Wait(); close(nodeDone) }()
	t.Cleanup(func() {
		_ = node.Process.Kill()
		<-nodeDone
	})
	testwait.Until(t, 20*time.Second, "node-1 answers", func() (bool, string) {
		var info status.ClusterInfo
		err := getJSON("http://"+api+"/v1/cluster", &info)
		return err == nil, fmt.Sprint(err, out)
	})
	tok, err := os.ReadFile(filepath.Join(dataDir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	if o, err := run(t, "place", "chat", "--model", "demo/tiny", "--engine", "fake", "--addr", "http://"+api, "--token", strings.TrimSpace(string(tok))); err != nil {
		t.Fatalf("place: %v\n%s", err, o)
	}
	testwait.Until(t, 30*time.Second, "chat-0 is ready", func() (bool, string) {
		var shards []status.ShardInfo
		err := getJSON("http://"+api+"/v1/shards", &shards)
		return err == nil && len(shards) == 1 && shards[0].Lease == "valid", fmt.Sprint(shards, err)
	})

	socket := filepath.Join(tmp, "tmux.sock")
	t.Cleanup(func() { _ = exec.Command("tmux", "-S", socket, "kill-server").Run() })

	// llmgw top at 80 columns: the header is one row, nothing wraps.
	top := newTmux(t, socket, "top", 80, 40, bin+" top --interval 500ms --addr http://"+api)
	screen := top.waitScreen(20*time.Second, "top draws the cluster", "SHARD", "chat-0", "q quit")
	rows := strings.Split(screen, "\n")
	if !strings.HasPrefix(rows[0], "llmgw top") || !strings.Contains(rows[0], "shards 1/1 ready") || strings.TrimSpace(rows[1]) != "" {
		t.Errorf("top's header is not one row at 80 columns:\n%s", screen)
	}
	for _, r := range rows {
		if lipgloss.Width(r) > 80 {
			t.Errorf("row wider than the pane: %q", r)
		}
	}
	if _, err := top.tmux("send-keys", "-t", "top", "q"); err != nil {
		t.Fatal(err)
	}
	top.waitGone(10 * time.Second)

	// The overview of the node: its engine and its GPUs.
	// A bare llmgw on a terminal, with the node's data dir.
	ov := newTmux(t, socket, "overview", 120, 60, "LLMGW_DATA_DIR="+dataDir+" "+bin)
	ov.waitScreen(20*time.Second, "the overview shows the engine and the GPUs",
		"Engines", "chat-0", "alive", "valid", "H100 80GB", "simulated", "answers")

	// The agent dies (kill -9): the engine runs on, and the overview
	// says the agent does not answer, and since when.
	if err := node.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-nodeDone
	states, _ := datadir.New(dataDir).ReadShardStates()
	if len(states) != 1 || states[0].PID == 0 {
		t.Fatalf("shard state files after the agent died: %+v", states)
	}
	enginePID := states[0].PID
	screen = ov.waitScreen(20*time.Second, "the overview says the agent is down and the engine is not",
		"agent does not answer since", "chat-0", fmt.Sprintf("%d alive", enginePID), "leases not shown")
	for _, row := range strings.Split(screen, "\n") {
		if strings.Contains(row, "chat-0") && strings.Contains(row, "gone") {
			t.Errorf("the engine outlives its agent, but the overview says gone: %q", row)
		}
	}
	if !strings.Contains(screen, fmt.Sprintf("pid %d gone", node.Process.Pid)) {
		t.Errorf("the overview does not say the agent's pid is gone:\n%s", screen)
	}
	if _, err := ov.tmux("send-keys", "-t", "overview", "q"); err != nil {
		t.Fatal(err)
	}
	ov.waitGone(10 * time.Second)
}
