package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Limits of the log tools.
const (
	defaultLogLines = 200
	maxLogLines     = 5000
	maxFilterLen    = 512
	// maxLogScan bounds how far back read_log reads a file looking for
	// lines: a filter that matches nothing must not read a 50 GB log.
	maxLogScan  = 32 << 20
	logChunk    = 64 << 10
	maxLogLine  = 64 << 10 // longer lines keep their end (see tailLines)
	maxListed   = 2000
	maxLogDepth = 4
)

// percentEscape matches a %XX escape. Names arrive as JSON strings, never
// URL-encoded; an escape in one is either an attempt to smuggle "../"
// past a check that decodes later, or a mistake. Either way it is refused,
// not decoded.
var percentEscape = regexp.MustCompile(`%[0-9A-Fa-f]{2}`)

// checkLogName refuses names that could leave the log directory before the
// file system is touched. os.Root enforces the same at open time, and
// also refuses symlinks that point out; this check exists to give a clear
// answer and to refuse forms os.Root would treat as odd but legal names.
func checkLogName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: name a log file (list_logs lists them)", ErrBadArgs)
	case strings.ContainsAny(name, "\x00\\"):
		return fmt.Errorf("%w: log name %q holds a NUL or backslash", ErrBadArgs, name)
	case percentEscape.MatchString(name):
		return fmt.Errorf("%w: log name %q is percent-encoded; give it as list_logs shows it", ErrBadArgs, name)
	case filepath.IsAbs(name):
		return fmt.Errorf("%w: log name %q is an absolute path; give it relative to the log directory", ErrBadArgs, name)
	case !filepath.IsLocal(name) || slices.Contains(strings.Split(name, "/"), ".."):
		return fmt.Errorf("%w: log name %q leaves or climbs the log directory", ErrBadArgs, name)
	}
	return nil
}

func listLogsTool(c Config) Tool {
	return Tool{
		Name:        "list_logs",
		Description: "Files under the node's log directory (engine logs among them), with size and modification time (UTC), in path order.",
		Run: func(ctx context.Context, _ Args) (string, error) {
			if c.LogDir == "" {
				return c.stamp("list_logs", fmt.Sprintf("(no log directory is configured on %s)\n", c.Host)), nil
			}
			root, err := os.OpenRoot(c.LogDir)
			if err != nil {
				return c.stamp("ls "+c.LogDir, fmt.Sprintf("(log directory unreadable on %s: %v)\n", c.Host, err)), nil
			}
			defer root.Close()
			var b strings.Builder
			n := 0
			err = fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
				if cerr := ctx.Err(); cerr != nil {
					return cerr
				}
				if err != nil {
					fmt.Fprintf(&b, "%s: %v\n", p, err)
					return nil
				}
				if p == "." {
					return nil
				}
				if n++; n > maxListed {
					fmt.Fprintf(&b, "(stopped after %d entries)\n", maxListed)
					return fs.SkipAll
				}
				info, ierr := d.Info()
				if ierr != nil {
					fmt.Fprintf(&b, "%s: %v\n", p, ierr)
					return nil
				}
				name := p
				switch {
				case d.IsDir():
					name += "/"
				case d.Type()&fs.ModeSymlink != 0:
					name += " (symlink)"
				case !d.Type().IsRegular():
					name += " (not a regular file)"
				}
				fmt.Fprintf(&b, "%12d  %s  %s\n", info.Size(), info.ModTime().UTC().Format(time.RFC3339), name)
				if d.IsDir() && strings.Count(p, "/") >= maxLogDepth-1 {
					return fs.SkipDir
				}
				return nil
			})
			if err != nil && ctx.Err() != nil {
				return "", ctx.Err()
			}
			if b.Len() == 0 {
				b.WriteString("(empty)\n")
			}
			return c.stamp("ls -lR "+c.LogDir, capHead(b.String(), c.MaxOutput)), nil
		},
	}
}

func readLogTool(c Config) Tool {
	return Tool{
		Name: "read_log",
		Description: fmt.Sprintf("The last lines of one file under the log directory, optionally only lines "+
			"matching a regular expression (RE2 syntax). Names are relative to the log directory, as "+
			"list_logs shows them; nothing outside it can be read. Lines default to %d, at most %d; a filter "+
			"matches the log's own text (not llmgw's notes on cut lines) and searches at most the last %d MiB "+
			"of the file, for at most the tool timeout.", defaultLogLines, maxLogLines, maxLogScan>>20),
		Params: []Param{
			{Name: "name", Description: "file name relative to the log directory"},
			{Name: "filter", Description: "regular expression; only matching lines are shown"},
			{Name: "lines", Description: fmt.Sprintf("how many lines from the end (default %d, at most %d)", defaultLogLines, maxLogLines)},
		},
		Run: func(ctx context.Context, a Args) (string, error) {
			if err := checkLogName(a.Name); err != nil {
				return "", err
			}
			n := a.Lines
			switch {
			case n < 0:
				return "", fmt.Errorf("%w: lines must be positive, got %d", ErrBadArgs, n)
			case n == 0:
				n = defaultLogLines
			case n > maxLogLines:
				n = maxLogLines
			}
			var match func(string) bool
			if a.Filter != "" {
				if len(a.Filter) > maxFilterLen {
					return "", fmt.Errorf("%w: filter longer than %d bytes", ErrBadArgs, maxFilterLen)
				}
				re, err := regexp.Compile(a.Filter)
				if err != nil {
					return "", fmt.Errorf("%w: filter is not a valid regular expression: %v", ErrBadArgs, err)
				}
				match = re.MatchString
			}
			if c.LogDir == "" {
				return "", fmt.Errorf("%w: no log directory is configured on %s", ErrBadArgs, c.Host)
			}
			return c.readLog(ctx, a.Name, n, a.Filter, match)
		},
	}
}

func (c Config) readLog(ctx context.Context, name string, n int, filter string, match func(string) bool) (string, error) {
	root, err := os.OpenRoot(c.LogDir)
	if err != nil {
		return c.stamp("read_log", fmt.Sprintf("(log directory unreadable on %s: %v)\n", c.Host, err)), nil
	}
	defer root.Close()
	// O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
	// writer, forever. It changes nothing for regular files.
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%w: no log file %q on %s (list_logs lists them)", ErrBadArgs, name, c.Host)
		}
		return "", fmt.Errorf("%w: log file %q refused: %v", ErrBadArgs, name, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("log file %q: %w", name, err)
	}
	if !info.Mode().IsRegular() {
		return "", fmt.Errorf("%w: %q is not a regular file", ErrBadArgs, name)
	}
	// A filter can be slow on a large log; the call has the same budget
	// as a command, and answers with what it found in that time.
	deadline := c.Clock.Now().Add(c.Timeout)
	inBudget := func() bool { return c.Clock.Now().Before(deadline) }
	lines, scanned, outOfTime, err := tailLines(ctx, f, info.Size(), n, match, inBudget)
	if err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return "", fmt.Errorf("log file %q: %w", name, err)
	}
	source := fmt.Sprintf("%s: last %d lines", name, n)
	if filter != "" {
		source = fmt.Sprintf("%s: last %d lines matching %q", name, n, filter)
	}
	var b strings.Builder
	switch {
	case outOfTime:
		fmt.Fprintf(&b, "(searched only the last %d of %d bytes: the %s time budget ran out)\n", scanned, info.Size(), c.Timeout)
	case scanned < info.Size() && len(lines) < n:
		fmt.Fprintf(&b, "(searched only the last %d of %d bytes)\n", scanned, info.Size())
	}
	if len(lines) == 0 {
		b.WriteString("(no lines)\n")
	}
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return c.stamp(source, capTail(b.String(), c.MaxOutput)), nil
}

// tailLines returns up to n lines (matching match, if set) from the end of
// f, oldest first, reading backwards in chunks so that a large file costs
// only the part that is shown. scanned is how many bytes were read. Before
// each chunk it asks inBudget (nil: no budget) whether there is time left;
// outOfTime says the search stopped there.
//
// A line longer than maxLogLine keeps only its last maxLogLine bytes, after
// a note of how much was cut: the output is capped far below that anyway,
// and carrying a whole newline-free file from chunk to chunk would copy it
// over and over (quadratic in its size). match sees the log's own text,
// never the note: a filter for "line cut" or "^\[" must not match every
// long line.
func tailLines(ctx context.Context, f io.ReaderAt, size int64, n int, match func(string) bool, inBudget func() bool) (lines []string, scanned int64, outOfTime bool, err error) {
	var (
		carry []byte // the end of a line whose start is in an earlier chunk
		cut   int64  // bytes of that line dropped in front of carry
	)
	emit := func(line []byte, note string) {
		s := string(line)
		if match != nil && !match(s) {
			return
		}
		lines = append(lines, note+s)
	}
	cutNote := func(cut int64) string {
		if cut == 0 {
			return ""
		}
		return fmt.Sprintf("[line cut: first %d bytes not shown]…", cut)
	}
	end := size
	buf := make([]byte, logChunk)
	for end > 0 && len(lines) < n && scanned < maxLogScan {
		if err := ctx.Err(); err != nil {
			return nil, scanned, false, err
		}
		if inBudget != nil && !inBudget() {
			outOfTime = true
			break
		}
		start := max(end-logChunk, 0)
		chunk := buf[:end-start]
		if _, err := f.ReadAt(chunk, start); err != nil && !errors.Is(err, io.EOF) {
			return nil, scanned, false, err
		}
		scanned += end - start
		if end == size && len(chunk) > 0 && chunk[len(chunk)-1] == '\n' {
			chunk = chunk[:len(chunk)-1] // the file's final newline ends no extra line
		}
		// Walk the chunk's lines from the last; the first one may go on in
		// the previous chunk.
		for len(lines) < n {
			i := bytes.LastIndexByte(chunk, '\n')
			if i < 0 {
				break
			}
			line := joinCapped(chunk[i+1:], carry, &cut)
			emit(line, cutNote(cut))
			carry, cut, chunk = nil, 0, chunk[:i]
		}
		if len(lines) >= n {
			break
		}
		carry = joinCapped(chunk, carry, &cut)
		if start == 0 {
			emit(carry, cutNote(cut))
			carry = nil
		}
		end = start
	}
	if len(lines) < n && len(carry) > 0 {
		// The scan limit ended the search inside a line: show its end
		// rather than nothing, with what is known of the cut (at least
		// cut bytes, and it began somewhere in the end bytes not read).
		emit(carry, fmt.Sprintf("[line cut: it starts more than %d bytes before its end, beyond the part searched]…", int64(len(carry))+cut))
	}
	slices.Reverse(lines)
	return lines, scanned, outOfTime, nil
}

// joinCapped returns head+tail, keeping at most maxLogLine bytes from the
// end; what it drops is added to *cut.
func joinCapped(head, tail []byte, cut *int64) []byte {
	if len(tail) >= maxLogLine {
		*cut += int64(len(head))
		return tail
	}
	if over := len(head) + len(tail) - maxLogLine; over > 0 {
		*cut += int64(over)
		head = head[over:]
	}
	out := make([]byte, 0, len(head)+len(tail))
	return append(append(out, head...), tail...)
}
