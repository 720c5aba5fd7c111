package supervisor

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/supervisor/engine"
)

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

// logPather is a Runner that keeps its engines' logs as files.
type logPather interface {
	// LogPath is the log file of the newest engine of shard here.
	LogPath(shard string) (string, bool)
}

var _ logPather = (*engine.Runner)(nil)

// handleLogs serves a shard's engine log: from this node's file when the
// shard runs here, else by proxying to the node that holds it, so any node
// answers for the whole cluster. It needs the cluster token: engine logs
// can hold prompts.
func (n *Node) handleLogs(w http.ResponseWriter, r *http.Request) {
	caller, ok := n.logsCaller(w, r)
	if !ok {
		return
	}
	shard := r.PathValue("shard")
	tail := 100
	if v := r.URL.Query().Get("tail"); v != "" {
		t, err := strconv.Atoi(v)
		if err != nil || t < 0 || t > maxTail {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("tail %q: want 0-%d lines", v, maxTail))
			return
		}
		tail = t
	}
	follow := false
	if v := r.URL.Query().Get("follow"); v != "" {
		f, err := strconv.ParseBool(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("follow %q: want 1 or true (0 or false: no)", v))
			return
		}
		follow = f
	}
	if lp, ok := n.runner.(logPather); ok {
		if path, ok := lp.LogPath(shard); ok {
			n.streamLog(w, r, shard, path, tail, follow, caller)
			return
		}
	}
	if r.Header.Get(forwardedHeader) != "" {
		writeError(w, http.StatusNotFound, fmt.Sprintf("shard %q does not run on %s", shard, n.cfg.Name))
		return
	}
	holder, api := n.holderOf(shard)
	if holder == "" {
		writeError(w, http.StatusNotFound, n.noLogWhy(shard))
		return
	}
	target, err := url.Parse("http://" + api)
	if err != nil {
		writeError(w, http.StatusBadGateway, err.Error())
		return
	}
	proxy := &httputil.ReverseProxy{
		// The caller's token is never handed to an address that came
		// from gossip: the hop is signed instead (see signHop), over
		// exactly the request that goes out.
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			n.signHop(pr.Out, "logs", caller, nil)
		},
		FlushInterval: -1,
	}
	proxy.ServeHTTP(w, r)
}

// logsCaller lets a logs request through if it carries the cluster token,
// or was forwarded by a node that checked it (a signed hop), and names the
// caller its follow slot counts against: the address it came from or, for
// a forwarded request, the address the forwarding node saw. Otherwise it
// writes the error.
func (n *Node) logsCaller(w http.ResponseWriter, r *http.Request) (string, bool) {
	if r.Header.Get(hopHeader) != "" {
		caller, err := n.verifyHop(r, "logs", nil)
		if err != nil {
			writeError(w, http.StatusForbidden, err.Error())
			return "", false
		}
		return caller, true
	}
	if !n.checkToken(w, r) {
		return "", false
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return host, true
}

func (n *Node) holderOf(shard string) (node, api string) {
	for _, m := range n.cluster.Members() {
		if m.Record == nil || m.Name == n.cfg.Name || (m.State != gossip.StateAlive && m.State != gossip.StateSuspect) {
			continue
		}
		for _, s := range m.Record.Shards {
			if s.ShardID == shard {
				return m.Name, m.Record.API
			}
		}
	}
	return "", ""
}

func (n *Node) streamLog(w http.ResponseWriter, r *http.Request, shard, path string, tail int, follow bool, caller string) {
	if follow {
		release, err := n.follows.take(caller)
		if err != nil {
			writeError(w, http.StatusTooManyRequests, fmt.Sprintf("%s: %v", n.cfg.Name, err))
			return
		}
		defer release()
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		writeError(w, http.StatusNotFound, n.noFileWhy(shard))
		return
	}
	if err != nil {
		writeError(w, http.StatusNotFound, "engine log: "+err.Error())
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	off, cut, err := tailOffset(f, st.Size(), tail, maxLogBytes)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if cut {
		fmt.Fprintf(w, "[llmgw: fewer than %d lines in the last %d MiB of the log; showing those bytes]\n", tail, maxLogBytes>>20)
	}
	// What the file held when asked, not what it grows to meanwhile: the
	// rest is for follow.
	if _, err := io.CopyN(w, f, st.Size()-off); (err != nil && !errors.Is(err, io.EOF)) || !follow {
		return
	}
	fl, _ := w.(http.Flusher)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		if fl != nil {
			fl.Flush()
		}
		select {
		case <-r.Context().Done():
			return
		case <-n.closed:
			return
		case <-tick.C:
		}
		// Capped (emptied) since the last read: start over at its top.
		if pos, err := f.Seek(0, io.SeekCurrent); err == nil {
			if st, err := f.Stat(); err == nil && st.Size() < pos {
				_, _ = f.Seek(0, io.SeekStart)
			}
		}
		if _, err := io.Copy(w, f); err != nil {
			return
		}
	}
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
