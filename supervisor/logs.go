package supervisor

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/llmgw/llmgw/gossip"
)

// maxTail bounds how many lines a log request returns at once.
const maxTail = 10000

// LogPath returns the log file of the newest engine of shard on this node.
func (r *Runner) LogPath(shard string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var best *engine
	for _, e := range r.engines {
		if e.state.ShardID == shard && (best == nil || e.state.StartedAt.After(best.state.StartedAt)) {
			best = e
		}
	}
	if best == nil {
		return "", false
	}
	return r.logDir + "/" + best.id + ".log", true
}

// handleLogs serves a shard's engine log: from this node's file when the
// shard runs here, else by proxying to the node that holds it, so any node
// answers for the whole cluster.
func (n *Node) handleLogs(w http.ResponseWriter, r *http.Request) {
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
	follow := r.URL.Query().Get("follow") == "1" || r.URL.Query().Get("follow") == "true"
	if lp, ok := n.engines.(interface{ LogPath(string) (string, bool) }); ok {
		if path, ok := lp.LogPath(shard); ok {
			n.streamLog(w, r, path, tail, follow)
			return
		}
	}
	if r.Header.Get("X-Llmgw-Forwarded") != "" {
		writeError(w, http.StatusNotFound, fmt.Sprintf("shard %q does not run on %s", shard, n.cfg.Name))
		return
	}
	holder, api := n.holderOf(shard)
	if holder == "" {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no live node holds shard %q (see llmgw shards)", shard))
		return
	}
	target, err := url.Parse("http://" + api)
	if err != nil {
		writeError(w, http.StatusBadGateway, err.Error())
		return
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1
	// Logs need no token; never hand the caller's credentials to an
	// address that came from gossip.
	r.Header.Del("Authorization")
	r.Header.Set("X-Llmgw-Forwarded", n.cfg.Name)
	proxy.ServeHTTP(w, r)
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

func (n *Node) streamLog(w http.ResponseWriter, r *http.Request, path string, tail int, follow bool) {
	f, err := os.Open(path)
	if err != nil {
		writeError(w, http.StatusNotFound, "engine log: "+err.Error())
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	off, err := tailOffset(f, tail)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if _, err := io.Copy(w, f); err != nil || !follow {
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
		if _, err := io.Copy(w, f); err != nil {
			return
		}
	}
}

// tailOffset finds where the last n lines of f start, reading backwards in
// blocks so a multi-gigabyte engine log costs only its tail.
func tailOffset(f *os.File, n int) (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size := st.Size()
	if n == 0 {
		return size, nil
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
	for pos := end; pos > 0; {
		start := max(0, pos-block)
		chunk := buf[:pos-start]
		if _, err := f.ReadAt(chunk, start); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		for i := len(chunk) - 1; i >= 0; i-- {
			if chunk[i] == '\n' {
				lines++
				if lines == n {
					return start + int64(i) + 1, nil
				}
			}
		}
		pos = start
	}
	return 0, nil
}
