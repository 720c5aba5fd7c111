package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
)

// logDir builds:
//
//	outside/secret.txt            (next to the log dir, must stay unreadable)
//	logs/engine.log               (10 lines)
//	logs/shards/shard-a.log
//	logs/inside-link -> engine.log            (allowed: stays inside)
//	logs/abs-link -> <outside>/secret.txt     (refused)
//	logs/rel-link -> ../outside/secret.txt    (refused)
//	logs/dir-link -> ../outside               (refused)
//	logs/pipe                                  (a FIFO: refused, not waited on)
func logDir(t *testing.T) (dir, outside string) {
	t.Helper()
	base := t.TempDir()
	dir, outside = filepath.Join(base, "logs"), filepath.Join(base, "outside")
	for _, d := range []string{dir, outside, filepath.Join(dir, "shards")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var b strings.Builder
	for i := 1; i <= 10; i++ {
		level := "INFO"
		if i%3 == 0 {
			level = "ERROR"
		}
		fmt.Fprintf(&b, "2026-11-29 22:00:%02d %s line %d\n", i, level, i)
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "engine.log"), b.String())
	write(filepath.Join(dir, "shards", "shard-a.log"), "shard a started\n")
	write(filepath.Join(outside, "secret.txt"), "SECRET\n")
	for link, target := range map[string]string{
		"inside-link": "engine.log",
		"abs-link":    filepath.Join(outside, "secret.txt"),
		"rel-link":    "../outside/secret.txt",
		"dir-link":    "../outside",
	} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, outside
}

func TestListLogs(t *testing.T) {
	dir, _ := logDir(t)
	out := call(t, Config{Host: "n1", LogDir: dir, Clock: clock.NewFake(stampTime)}, "list_logs", Args{})
	for _, want := range []string{" engine.log\n", " shards/\n", " shards/shard-a.log\n", " abs-link (symlink)\n", " pipe (not a regular file)\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("list_logs lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "secret") {
		t.Errorf("list_logs followed a link out:\n%s", out)
	}
	if out := call(t, Config{Host: "n1"}, "list_logs", Args{}); !strings.Contains(out, "no log directory is configured on n1") {
		t.Errorf("no dir: %q", out)
	}
}

func TestReadLog(t *testing.T) {
	dir, _ := logDir(t)
	cfg := Config{Host: "n1", LogDir: dir, Clock: clock.NewFake(stampTime)}

	out := call(t, cfg, "read_log", Args{Name: "engine.log", Lines: 3})
	want := "[n1 2026-11-29T22:53:56Z] engine.log: last 3 lines\n" +
		"2026-11-29 22:00:08 INFO line 8\n2026-11-29 22:00:09 ERROR line 9\n2026-11-29 22:00:10 INFO line 10\n"
	if out != want {
		t.Errorf("tail:\n%s", out)
	}
	out = call(t, cfg, "read_log", Args{Name: "engine.log", Filter: "ERROR", Lines: 2})
	if !strings.HasSuffix(out, `engine.log: last 2 lines matching "ERROR"`+"\n2026-11-29 22:00:06 ERROR line 6\n2026-11-29 22:00:09 ERROR line 9\n") {
		t.Errorf("filter:\n%s", out)
	}
	if out := call(t, cfg, "read_log", Args{Name: "engine.log"}); strings.Count(out, "\n") != 11 {
		t.Errorf("default lines:\n%s", out)
	}
	if out := call(t, cfg, "read_log", Args{Name: "engine.log", Filter: "nothing matches"}); !strings.HasSuffix(out, "(no lines)\n") {
		t.Errorf("no match:\n%s", out)
	}
	if out := call(t, cfg, "read_log", Args{Name: "shards/shard-a.log"}); !strings.HasSuffix(out, "\nshard a started\n") {
		t.Errorf("subdir:\n%s", out)
	}
	if out := call(t, cfg, "read_log", Args{Name: "inside-link", Lines: 1}); !strings.HasSuffix(out, "\n2026-11-29 22:00:10 INFO line 10\n") {
		t.Errorf("inside link:\n%s", out)
	}

	_, err := tool(t, cfg, "read_log").Run(context.Background(), Args{Name: "engine.log", Filter: "(unclosed"})
	if !errors.Is(err, ErrBadArgs) || !strings.Contains(err.Error(), "not a valid regular expression") {
		t.Errorf("bad regex: %v", err)
	}
	_, err = tool(t, cfg, "read_log").Run(context.Background(), Args{Name: "engine.log", Lines: -1})
	if !errors.Is(err, ErrBadArgs) {
		t.Errorf("negative lines: %v", err)
	}
	_, err = tool(t, cfg, "read_log").Run(context.Background(), Args{Name: "nope.log"})
	if !errors.Is(err, ErrBadArgs) || !strings.Contains(err.Error(), `no log file "nope.log"`) {
		t.Errorf("missing file: %v", err)
	}
}

// Every way out of the log directory is refused, and none reads the
// secret next to it.
func TestReadLogPathGuard(t *testing.T) {
	dir, outside := logDir(t)
	cfg := Config{Host: "n1", LogDir: dir}
	for _, name := range []string{
		"",
		"../outside/secret.txt",
		"shards/../../outside/secret.txt",
		"shards/../engine.log", // inside, but climbing is refused outright
		"..",
		filepath.Join(outside, "secret.txt"),
		"/etc/passwd",
		"%2e%2e/outside/secret.txt",
		"%2E%2E%2Foutside%2Fsecret.txt",
		"%252e%252e/outside/secret.txt", // encoded twice
		"..%2foutside%2fsecret.txt",
		`..\outside\secret.txt`,
		"engine.log\x00.txt",
		"abs-link",
		"rel-link",
		"dir-link/secret.txt",
		"pipe",
		"shards",
	} {
		out, err := tool(t, cfg, "read_log").Run(context.Background(), Args{Name: name})
		t.Logf("%q: %v", name, err)
		if !errors.Is(err, ErrBadArgs) {
			t.Errorf("%q: err = %v, out = %q", name, err, out)
		}
		if strings.Contains(out, "SECRET") || (err != nil && strings.Contains(err.Error(), "SECRET")) {
			t.Errorf("%q: read outside the log directory", name)
		}
	}
}

func TestCheckLogNameAllowsPlainNames(t *testing.T) {
	for _, name := range []string{"engine.log", "shards/a.log", "100%.log", "a..b.log", ".hidden"} {
		if err := checkLogName(name); err != nil {
			t.Errorf("%q: %v", name, err)
		}
	}
}

// Tails across chunk boundaries, with and without a final newline, match
// what a forward read gives.
func TestTailLines(t *testing.T) {
	var b bytes.Buffer
	for i := 0; b.Len() < 3*logChunk+100; i++ {
		fmt.Fprintf(&b, "%d %s\n", i, strings.Repeat("x", i%97))
	}
	for _, text := range []string{b.String(), strings.TrimSuffix(b.String(), "\n"), "", "one", "\n\n", "a\n\nb\n"} {
		all := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
		if text == "" {
			all = nil
		}
		for _, n := range []int{1, 5, 1000, 100000} {
			got, _, _, err := tailLines(context.Background(), strings.NewReader(text), int64(len(text)), n, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := all[max(len(all)-n, 0):]
			if strings.Join(got, "\n") != strings.Join(want, "\n") || len(got) != len(want) {
				t.Errorf("text of %d bytes, n=%d: got %d lines, want %d", len(text), n, len(got), len(want))
			}
		}
	}
	odd := func(s string) bool { return strings.HasSuffix(strings.Fields(s)[0], "7") }
	var matching []string
	for _, l := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		if odd(l) {
			matching = append(matching, l)
		}
	}
	got, _, _, _ := tailLines(context.Background(), strings.NewReader(b.String()), int64(b.Len()), 3, odd, nil)
	if strings.Join(got, "|") != strings.Join(matching[len(matching)-3:], "|") {
		t.Errorf("filtered tail = %q", got)
	}
}

// A line longer than maxLogLine keeps its end, after a note of how much was
// cut, and lines around it are whole.
func TestTailLinesCutsLongLines(t *testing.T) {
	long := make([]byte, 5*logChunk+123)
	for i := range long {
		long[i] = 'a' + byte(i%26)
	}
	text := "first\n" + string(long) + "\nlast\n"
	got, _, _, err := tailLines(context.Background(), strings.NewReader(text), int64(len(text)), 3, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != "first" || got[2] != "last" {
		t.Fatalf("got %d lines, first %q, last %q", len(got), firstN(got, 0), firstN(got, len(got)-1))
	}
	want := fmt.Sprintf("[line cut: first %d bytes not shown]…%s", len(long)-maxLogLine, long[len(long)-maxLogLine:])
	if got[1] != want {
		t.Errorf("long line = %q… (%d bytes), want %q… (%d bytes)", got[1][:60], len(got[1]), want[:60], len(want))
	}
}

func firstN(lines []string, i int) string {
	if i < 0 || i >= len(lines) {
		return ""
	}
	return lines[i][:min(len(lines[i]), 40)]
}

// BenchmarkTailNewlineFree reads the tail of a file without a single
// newline as large as read_log will scan: the worst case for a backward
// line reader.
func BenchmarkTailNewlineFree(b *testing.B) {
	text := bytes.Repeat([]byte("x"), maxLogScan)
	r := bytes.NewReader(text)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		got, _, _, err := tailLines(context.Background(), r, int64(len(text)), 10, nil, nil)
		if err != nil || len(got) != 1 {
			b.Fatalf("%d lines, %v", len(got), err)
		}
	}
}

// A last line longer than the whole scan is still shown (its end), not
// "(no lines)".
func TestTailLinesShowsALineLongerThanTheScan(t *testing.T) {
	text := "old\n" + strings.Repeat("y", maxLogScan+logChunk)
	got, _, _, err := tailLines(context.Background(), strings.NewReader(text), int64(len(text)), 1, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !strings.HasPrefix(got[0], "[line cut:") || !strings.HasSuffix(got[0], strings.Repeat("y", 100)) {
		t.Fatalf("got %d lines: %.80q", len(got), got)
	}
}

// read_log's filter runs on the log's own text, not on the note llmgw puts
// in front of a cut line. Before, the note was matched too: a filter for
// "line cut" or for lines starting with "[" matched every long line.
func TestReadLogFilterSeesTheLogNotTheNotes(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("x", maxLogLine+1000)
	if err := os.WriteFile(filepath.Join(dir, "engine.log"), []byte("[first] line\n"+long+"\nlast\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Host: "n1", LogDir: dir, Clock: clock.NewFake(stampTime), MaxOutput: 1 << 20}
	for _, filter := range []string{"line cut", "bytes not shown", `^\[line`, "…"} {
		if out := call(t, cfg, "read_log", Args{Name: "engine.log", Filter: filter}); !strings.HasSuffix(out, "(no lines)\n") {
			t.Errorf("filter %q matched llmgw's note:\n%.200s", filter, out)
		}
	}
	// The log's own text still matches, and the answer still says the
	// line was cut.
	out := call(t, cfg, "read_log", Args{Name: "engine.log", Filter: `^\[first|x{100}$`})
	want := "\n[first] line\n[line cut: first 1000 bytes not shown]…" + long[1000:] + "\n"
	if !strings.HasSuffix(out, want) {
		t.Errorf("filter on the log's text: %.300q", out)
	}
}

// stepClock is a fake clock that moves on by step each time it is read,
// so a test can run a time budget out without waiting.
type stepClock struct {
	*clock.Fake
	step time.Duration
}

func (c *stepClock) Now() time.Time {
	c.Advance(c.step)
	return c.Fake.Now()
}

// A read_log search stops when the call's time budget (the tool timeout)
// runs out, and answers with what it searched, saying so. Before, a
// filter searched the whole 32 MiB scan window however long it took.
func TestReadLogSearchStopsAtTheTimeBudget(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	for i := 0; b.Len() < 40*logChunk; i++ {
		fmt.Fprintf(&b, "2026-11-29 22:00:00 INFO request %d done\n", i)
	}
	if err := os.WriteFile(filepath.Join(dir, "engine.log"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// Every chunk read costs one second of the clock's time; the budget
	// is five.
	cfg := Config{Host: "n1", LogDir: dir, Clock: &stepClock{Fake: clock.NewFake(stampTime), step: time.Second}, Timeout: 5 * time.Second}
	out := call(t, cfg, "read_log", Args{Name: "engine.log", Filter: "ERROR"})
	size := b.Len()
	if !strings.Contains(out, fmt.Sprintf(" of %d bytes: the 5s time budget ran out)", size)) || strings.Contains(out, fmt.Sprintf("last %d of", size)) {
		t.Errorf("out of time: %.300s", out)
	}
	// Within the budget the search goes on to the scan limit as before.
	cfg.Timeout = time.Hour
	if out := call(t, cfg, "read_log", Args{Name: "engine.log", Filter: "ERROR"}); strings.Contains(out, "time budget") || !strings.HasSuffix(out, "(no lines)\n") {
		t.Errorf("in time: %.300s", out)
	}
}
