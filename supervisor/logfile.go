package supervisor

import (
	"errors"
	"fmt"
	"io"
	"sync"
)

// Reading engine log files for the logs endpoint (endpoint_logs.go): where
// the last lines start, and how many streams may follow a file at once.

// Limits of the log endpoint.
const (
	// maxTail bounds how many lines a log request returns at once.
	maxTail = 10000
	// maxLogBytes bounds what one request reads back from the file before
	// following it: an engine that logs without newlines (a progress bar)
	// must not make "tail=1" send the whole file.
	maxLogBytes = 32 << 20
	// maxFollowers bounds the open follow=1 streams per node, and
	// maxFollowersPerCaller those of one caller (one address), so that one
	// caller (a script gone wrong) cannot take every slot from the rest.
	maxFollowers          = 64
	maxFollowersPerCaller = 16
)

// followSlots counts the open follow=1 streams, per node and per caller.
// The zero value is ready.
type followSlots struct {
	mu       sync.Mutex
	total    int
	byCaller map[string]int
}

// take holds a slot for caller until release is called; the error says
// which limit is reached.
func (s *followSlots) take(caller string) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.total >= maxFollowers:
		return nil, fmt.Errorf("%d log streams already follow here; try again later", maxFollowers)
	case s.byCaller[caller] >= maxFollowersPerCaller:
		return nil, fmt.Errorf("%d log streams from %s already follow here, the most one caller may hold; stop one or try again later", maxFollowersPerCaller, caller)
	}
	if s.byCaller == nil {
		s.byCaller = map[string]int{}
	}
	s.total++
	s.byCaller[caller]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.total--
		if s.byCaller[caller]--; s.byCaller[caller] == 0 {
			delete(s.byCaller, caller)
		}
	}, nil
}

// tailOffset finds where the last n lines of the first size bytes of f
// start, reading backwards in blocks so a multi-gigabyte engine log costs
// only its tail. It reads at most limit bytes back; cut says it stopped
// there, short of n lines.
func tailOffset(f io.ReaderAt, size int64, n int, limit int64) (off int64, cut bool, err error) {
	if n == 0 {
		return size, false, nil
	}
	const block = 64 << 10
	end := size
	lines := 0
	buf := make([]byte, block)
	// A final newline ends the last line rather than starting an empty one.
	if size > 0 {
		if _, err := f.ReadAt(buf[:1], size-1); err == nil && buf[0] == '\n' {
			end--
		}
	}
	floor := max(0, size-limit)
	for pos := end; pos > floor; {
		start := max(floor, pos-block)
		chunk := buf[:pos-start]
		if _, err := f.ReadAt(chunk, start); err != nil && !errors.Is(err, io.EOF) {
			return 0, false, err
		}
		for i := len(chunk) - 1; i >= 0; i-- {
			if chunk[i] == '\n' {
				lines++
				if lines == n {
					return start + int64(i) + 1, false, nil
				}
			}
		}
		pos = start
	}
	return floor, floor > 0, nil
}
