package overview

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/probes/host"
)

// problemLines is how many of the agent's warnings a frame keeps (the
// newest), and how many kernel driver faults.
const problemLines = 12

// logTail is how much of the end of a --log-file is read for the last
// hour's warnings.
const logTail = 1 << 20

// ProblemsReader reads the agent's warnings and errors of the last hour:
// from the journal when it logs there (a service), or from the file
// `node up --log-file` writes, which its stamp names.
type ProblemsReader struct {
	Run Runner
	// LogFile overrides the stamp's log file.
	LogFile string
	// Root: the reader runs as root, so an empty journal is really empty.
	Root bool
}

// ProblemsSection is what the Recent problems section shows.
type ProblemsSection struct {
	// Source is where the agent's lines came from.
	Source string
	Lines  []string
	// Faults are the kernel's NVIDIA driver lines in the fault window.
	Faults      []string
	FaultWindow time.Duration
	FaultSource string
	FaultNote   string
	NeedsRoot   []string
	Note        string
}

// Read reads the agent's side of the section; the kernel's faults are
// added from their own reader (addFaults).
func (r ProblemsReader) Read(ctx context.Context, st stamp, now time.Time) ProblemsSection {
	var s ProblemsSection
	file := r.LogFile
	if file == "" {
		file = st.alive.LogFile
	}
	if file != "" {
		s.Source = file
		lines, err := logFileProblems(file, now)
		switch {
		case errors.Is(err, fs.ErrPermission):
			s.NeedsRoot = append(s.NeedsRoot, "the agent's log "+file)
		case err != nil:
			s.Note = "the agent's log cannot be read: " + err.Error()
		}
		s.Lines = lines
		return s
	}
	s.Source = "journalctl -u " + ServiceName
	if r.Run == nil {
		s.Note = "the journal was not asked"
		return s
	}
	if _, err := r.Run.LookPath("journalctl"); err != nil {
		s.Note = "no journal on this machine (journalctl not found), and the agent names no --log-file"
		return s
	}
	out, err := r.Run.Run(ctx, "journalctl", "-u", ServiceName, "-p", "warning", "--since", "-1h", "-o", "cat", "--no-pager", "-n", fmt.Sprint(problemLines))
	lines, denied := journalLines(string(out))
	switch {
	case denied || (err == nil && len(lines) == 0 && !r.Root):
		s.NeedsRoot = append(s.NeedsRoot, "the agent's journal")
	case err != nil:
		// What it printed is its complaint, not the agent's lines.
		s.Note = "the journal cannot be read: " + firstLine(strings.TrimSpace(string(out))+" ("+err.Error()+")")
	default:
		s.Lines = lines
	}
	return s
}

// journalLines keeps journalctl's message lines, without its own remarks;
// denied is set when it said this user may not read the journal.
func journalLines(out string) (lines []string, denied bool) {
	for l := range strings.SplitSeq(out, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "":
		case strings.HasPrefix(l, "-- "), strings.HasPrefix(l, "Hint: "):
		case strings.Contains(l, "insufficient permissions"), strings.Contains(l, "not seeing messages from other users"):
			denied = true
		default:
			lines = append(lines, tidyLogLine(l))
		}
	}
	return keepLast(lines, problemLines), denied
}

// logFileProblems reads the end of the agent's log file and keeps its
// warnings and errors of the last hour.
func logFileProblems(path string, now time.Time) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > logTail {
		if _, err := f.Seek(fi.Size()-logTail, io.SeekStart); err != nil {
			return nil, err
		}
	}
	b, err := io.ReadAll(io.LimitReader(f, logTail))
	if err != nil {
		return nil, err
	}
	var out []string
	for l := range strings.SplitSeq(string(b), "\n") {
		if !strings.Contains(l, " level=WARN ") && !strings.Contains(l, " level=ERROR ") {
			continue
		}
		if t, ok := logTime(l); ok && now.Sub(t) > time.Hour {
			continue
		}
		out = append(out, tidyLogLine(l))
	}
	return keepLast(out, problemLines), nil
}

// logTime reads slog's time=... at the start of a text line.
func logTime(l string) (time.Time, bool) {
	v, ok := strings.CutPrefix(l, "time=")
	if !ok {
		return time.Time{}, false
	}
	v, _, _ = strings.Cut(v, " ")
	t, err := time.Parse(time.RFC3339Nano, v)
	return t, err == nil
}

// tidyLogLine shortens slog's "time=2026-12-01T20:05:54.123Z level=WARN"
// to "20:05:54 WARN", local time, for the screen.
func tidyLogLine(l string) string {
	t, ok := logTime(l)
	if !ok {
		return l
	}
	_, rest, _ := strings.Cut(l, " ")
	if lv, r, ok := strings.Cut(rest, " "); ok && strings.HasPrefix(lv, "level=") {
		rest = strings.TrimPrefix(lv, "level=") + " " + r
	}
	return t.Local().Format("15:04:05") + " " + rest
}

func keepLast(lines []string, n int) []string {
	if len(lines) > n {
		return lines[len(lines)-n:]
	}
	return lines
}

// FaultsReader reads the kernel's NVIDIA driver lines (probes/host), for
// the GPUs' Xid counts and the problems.
type FaultsReader struct {
	Run   Runner
	Clock clock.Clock
	// Root is the host's file system, for /proc/stat (default "/").
	Root fs.FS
	// AsRoot: the reader runs as root (the kernel log may be restricted).
	AsRoot bool
}

// faultReading is what one read of the kernel log found.
type faultReading struct {
	faults host.DriverFaults
	err    string
	root   bool
}

// Read reads the kernel log.
func (r FaultsReader) Read(ctx context.Context) faultReading {
	if r.Run == nil {
		return faultReading{err: "the kernel log was not asked"}
	}
	d, err := host.ReadDriverFaults(ctx, host.Config{Host: "-", Runner: r.Run, Clock: r.Clock, Root: r.Root})
	if err != nil {
		return faultReading{err: "the kernel log cannot be read: " + err.Error(), root: !r.AsRoot}
	}
	// dmesg refused (kernel.dmesg_restrict) and a journal that showed
	// nothing: most likely this user may not read either.
	if !r.AsRoot && d.Total == 0 && strings.HasPrefix(d.Source, "journalctl") {
		return faultReading{faults: d, err: "the kernel log is root's", root: true}
	}
	return faultReading{faults: d}
}

// addFaults adds the kernel's driver lines of the fault window.
func (s *ProblemsSection) addFaults(f faultReading, now time.Time) {
	s.FaultWindow, s.FaultSource = f.faults.Window, f.faults.Source
	if f.err != "" {
		if f.root {
			s.NeedsRoot = append(s.NeedsRoot, "the kernel log")
		} else {
			s.FaultNote = f.err
		}
		return
	}
	for _, x := range f.faults.Faults {
		if recentFault(x.Time, now, f.faults.Window) {
			s.Faults = append(s.Faults, x.Time.Local().Format("15:04:05")+" "+x.Message)
		}
	}
	s.Faults = keepLast(s.Faults, problemLines)
}
