package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// nodeLogger is the agent's log: to --log-file when one is given (an agent
// that is not a service, so `llmgw overview` can read its warnings), or to
// stderr, each line marked with its priority for journald when stderr is
// the journal's stream.
//
// Why the marks: journald files a service's plain stderr lines at info,
// whatever they say, so `journalctl -p warning` (what the overview asks)
// would find nothing. sd-daemon's convention is a "<N>" prefix on each
// line, which journald strips and takes as the line's priority.
func nodeLogger(stderr io.Writer, logFile string, level slog.Level) (log *slog.Logger, path string, closeFn func(), err error) {
	opts := &slog.HandlerOptions{Level: level}
	if logFile != "" {
		if path, err = filepath.Abs(logFile); err != nil {
			return nil, "", nil, fmt.Errorf("--log-file: %w", err)
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, "", nil, fmt.Errorf("--log-file: %w", err)
		}
		return slog.New(slog.NewTextHandler(f, opts)), path, func() { f.Close() }, nil
	}
	if f, ok := stderr.(*os.File); ok && isJournalStream(f, os.Getenv("JOURNAL_STREAM")) {
		return slog.New(newJournalHandler(f, opts)), "", func() {}, nil
	}
	return slog.New(slog.NewTextHandler(stderr, opts)), "", func() {}, nil
}

// isJournalStream reports whether f is the stream JOURNAL_STREAM names
// ("<device>:<inode>"): systemd sets it for a service whose output goes to
// the journal, and a child that inherited the variable but writes
// elsewhere must not mark its lines.
func isJournalStream(f *os.File, env string) bool {
	dev, ino, ok := strings.Cut(env, ":")
	if !ok {
		return false
	}
	d, err1 := strconv.ParseUint(dev, 10, 64)
	i, err2 := strconv.ParseUint(ino, 10, 64)
	if err1 != nil || err2 != nil {
		return false
	}
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && uint64(st.Dev) == d && uint64(st.Ino) == i
}

// journalPriority is sd-daemon's prefix for a level.
func journalPriority(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "<3>"
	case l >= slog.LevelWarn:
		return "<4>"
	case l >= slog.LevelInfo:
		return "<6>"
	}
	return "<7>"
}

// journalHandler is a text handler whose every line starts with its
// priority. The text handler writes one record in one Write, so the
// prefix is set under the same lock that Write is called under.
type journalHandler struct {
	inner slog.Handler
	out   *prefixWriter
}

type prefixWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	if _, err := io.WriteString(p.w, p.prefix+string(b)); err != nil {
		return 0, err
	}
	return len(b), nil
}

func newJournalHandler(w io.Writer, opts *slog.HandlerOptions) journalHandler {
	out := &prefixWriter{w: w}
	return journalHandler{inner: slog.NewTextHandler(out, opts), out: out}
}

func (h journalHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h journalHandler) Handle(ctx context.Context, r slog.Record) error {
	h.out.mu.Lock()
	defer h.out.mu.Unlock()
	h.out.prefix = journalPriority(r.Level)
	return h.inner.Handle(ctx, r)
}

func (h journalHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return journalHandler{inner: h.inner.WithAttrs(as), out: h.out}
}

func (h journalHandler) WithGroup(name string) slog.Handler {
	return journalHandler{inner: h.inner.WithGroup(name), out: h.out}
}
