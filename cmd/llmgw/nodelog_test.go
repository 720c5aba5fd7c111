package main

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/datadir"
)

func TestJournalPrefixesEachLineWithItsPriority(t *testing.T) {
	var b bytes.Buffer
	log := slog.New(newJournalHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug})).With("node", "n1")
	log.Debug("d")
	log.Info("i")
	log.Warn("w", "multi", "line\nvalue")
	log.Error("e")
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	want := []string{"<7>", "<6>", "<4>", "<3>"}
	if len(lines) != len(want) {
		t.Fatalf("lines = %q", lines)
	}
	for i, l := range lines {
		if !strings.HasPrefix(l, want[i]+"time=") || !strings.Contains(l, "node=n1") {
			t.Errorf("line %d = %q, want prefix %s and the logger's attrs", i, l, want[i])
		}
	}
}

func TestJournalStreamMustBeStderrItself(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "stream")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if !isJournalStream(f, fmt.Sprintf("%d:%d", st.Dev, st.Ino)) {
		t.Error("the stream JOURNAL_STREAM names was not recognised")
	}
	// Inherited by a process whose stderr goes elsewhere, or malformed.
	for _, env := range []string{fmt.Sprintf("%d:%d", st.Dev, st.Ino+1), "", "x:y", "12"} {
		if isJournalStream(f, env) {
			t.Errorf("JOURNAL_STREAM=%q taken for this file", env)
		}
	}
}

// A node with --log-file logs there, and keeps a last-alive stamp in its
// data dir that names its API, pid and log file, refreshed while it runs.
func TestNodeLogFileAndAliveStamp(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "n1")
	logFile := filepath.Join(t.TempDir(), "node.log")
	n := startNode(t, "n1", dir, "--log-file", logFile)
	d := datadir.New(dir)
	var first datadir.Alive
	testwait.Until(t, 10*time.Second, "agent.json written", func() (bool, string) {
		a, found, err := d.ReadAlive()
		first = a
		return found && err == nil, fmt.Sprint(found, err)
	})
	if first.PID != os.Getpid() || "http://"+first.API != n.api || first.LogFile != logFile || first.Name != "n1" || first.SimulatedGPUs != "1xH100-80GB" {
		t.Errorf("stamp = %+v (api %s)", first, n.api)
	}
	testwait.Until(t, 3*aliveEvery, "the stamp is refreshed", func() (bool, string) {
		a, _, err := d.ReadAlive()
		return err == nil && a.At.After(first.At), fmt.Sprint(a.At, err)
	})
	b, err := os.ReadFile(logFile)
	if err != nil || !strings.Contains(string(b), "level=") {
		t.Errorf("log file: %v %q", err, b)
	}
	if strings.Contains(n.out.String(), "level=INFO") {
		t.Errorf("with --log-file the log still went to stderr:\n%s", n.out)
	}
}

func TestLocalAddr(t *testing.T) {
	for in, want := range map[string]string{"0.0.0.0:7070": "127.0.0.1:7070", ":7070": "127.0.0.1:7070", "[::]:7070": "[::1]:7070", "10.0.0.1:7070": "10.0.0.1:7070", "bad": ""} {
		if got := localAddr(in); got != want {
			t.Errorf("localAddr(%q) = %q, want %q", in, got, want)
		}
	}
}

// Under systemd (stderr is the stream JOURNAL_STREAM names) node up's
// logger marks each line's priority; elsewhere it writes plain lines.
func TestNodeLoggerMarksPrioritiesOnlyForTheJournal(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino))
	log, path, closeLog, err := nodeLogger(f, "", slog.LevelInfo)
	if err != nil || path != "" {
		t.Fatal(err, path)
	}
	log.Warn("disk low")
	closeLog()
	b, _ := os.ReadFile(f.Name())
	if !strings.HasPrefix(string(b), "<4>time=") {
		t.Errorf("journal line = %q", b)
	}
	var plain bytes.Buffer
	log, _, _, _ = nodeLogger(&plain, "", slog.LevelInfo)
	log.Warn("disk low")
	if !strings.HasPrefix(plain.String(), "time=") {
		t.Errorf("plain line = %q", plain.String())
	}
	if _, _, _, err := nodeLogger(&plain, filepath.Join(t.TempDir(), "no", "such", "dir", "x.log"), slog.LevelInfo); err == nil || !strings.Contains(err.Error(), "--log-file") {
		t.Errorf("bad --log-file: %v", err)
	}
}
