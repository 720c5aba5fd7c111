package host

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// ExecRunner runs commands as child processes.
//
// Each command gets its own process group, and a cancelled or timed-out
// command is killed as a group: a tool that forks (nvidia-smi helpers,
// journalctl's pager guard) must not leave children running, nor keep the
// output pipe open so that the wait never ends. WaitDelay bounds that wait
// in any case.
//
// LC_ALL=C keeps output in the form the parsers here expect (dmesg -T
// prints weekday and month names in the locale's language otherwise).
type ExecRunner struct{}

var _ Runner = ExecRunner{}

// Run runs name with args and returns stdout and stderr together.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.Stdin = nil
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		// The negative PID names the process group.
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = 2 * time.Second
	err := cmd.Run()
	return out.Bytes(), err
}

// LookPath finds name in PATH.
func (ExecRunner) LookPath(name string) (string, error) { return exec.LookPath(name) }
