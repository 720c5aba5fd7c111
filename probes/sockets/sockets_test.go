package sockets

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"testing"
)

func listen(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// This test process listens; asked from its parent's tree it is found, by
// its own pid.
func TestOwnerFindsTheListenerInTheTree(t *testing.T) {
	port := listen(t)
	pid, found, err := Host().Owner(port, os.Getppid())
	if err != nil || !found || pid != os.Getpid() {
		t.Fatalf("Owner(%d, parent) = %d, %v, %v; want %d, true, nil", port, pid, found, err, os.Getpid())
	}
}

// A listener outside the tree asked about is someone else's.
func TestOwnerRefusesAnotherProcess(t *testing.T) {
	port := listen(t)
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep binary:", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid, found, err := Host().Owner(port, cmd.Process.Pid)
	if err != nil || found {
		t.Fatalf("Owner(%d, sleep) = %d, %v, %v; want not found, no error", port, pid, found, err)
	}
}

// A pid whose descriptors cannot be read is "cannot tell", an error, not
// "someone else's".
func TestOwnerCannotTellForAnInvisiblePid(t *testing.T) {
	port := listen(t)
	if _, found, err := Host().Owner(port, 1<<22+12345); err == nil || found {
		t.Fatalf("Owner for a pid that does not exist: found=%v err=%v, want an error", found, err)
	}
}

func TestOwnerSaysWhenNothingListens(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	if _, _, err := Host().Owner(port, os.Getpid()); !errors.Is(err, ErrNoListener) {
		t.Fatalf("closed port: err = %v, want ErrNoListener", err)
	}
}

func TestParent(t *testing.T) {
	if got := Host().Parent(os.Getpid()); got != os.Getppid() {
		t.Fatalf("Parent(self) = %d, want %d", got, os.Getppid())
	}
	if got := (FS{Root: t.TempDir()}).Parent(1); got != 0 {
		t.Fatalf("Parent in an empty tree = %d, want 0", got)
	}
}
