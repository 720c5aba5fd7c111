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
	"strings"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/supervisor/engine"
	"github.com/llmgw/llmgw/supervisor/status"
)

// logPather is a Runner that keeps its engines' logs as files.
type logPather interface {
	// LogPath is the log file of the newest engine of shard here.
	LogPath(shard string) (string, bool)
}

var _ logPather = (*engine.Runner)(nil)

// followPoll is how often a follow=1 stream looks for more of the file.
const followPoll = 250 * time.Millisecond

// handleLogs serves a shard's engine log: from this node's file when the
// shard runs here, else by proxying to the node that holds it, so any node
// answers for the whole cluster. It needs the cluster token: engine logs
// can hold prompts.
func (s *apiServer) handleLogs(w http.ResponseWriter, r *http.Request) {
	caller, ok := s.logsCaller(w, r)
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
	if lp, ok := s.shards.(logPather); ok {
		if path, ok := lp.LogPath(shard); ok {
			s.streamLog(w, r, shard, path, tail, follow, caller)
			return
		}
	}
	if r.Header.Get(forwardedHeader) != "" {
		writeError(w, http.StatusNotFound, fmt.Sprintf("shard %q does not run on %s", shard, s.conf.name))
		return
	}
	holder, api := holderOf(s.gossip.Members(), s.conf.name, shard)
	if holder == "" {
		writeError(w, http.StatusNotFound, noLogWhy(s.node.Status().Shards(s.clock.Now()), shard, s.conf.name, s.conf.runtime))
		return
	}
	target, err := url.Parse("http://" + api)
	if err != nil {
		writeError(w, http.StatusBadGateway, err.Error())
		return
	}
	proxy := &httputil.ReverseProxy{
		// The caller's token is never handed to an address that came
		// from gossip: the hop is signed instead (see hops.sign), over
		// exactly the request that goes out.
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			s.hops.sign(pr.Out, "logs", caller, nil)
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
func (s *apiServer) logsCaller(w http.ResponseWriter, r *http.Request) (string, bool) {
	if r.Header.Get(hopHeader) != "" {
		caller, err := s.hops.verify(r, "logs", nil)
		if err != nil {
			writeError(w, http.StatusForbidden, err.Error())
			return "", false
		}
		return caller, true
	}
	if !s.checkToken(w, r) {
		return "", false
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return host, true
}

// holderOf is a live member other than self that holds shard, and its API
// address ("" when none does).
func holderOf(members []gossip.Member, self, shard string) (node, api string) {
	for _, m := range members {
		if m.Record == nil || m.Name == self || (m.State != gossip.StateAlive && m.State != gossip.StateSuspect) {
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

func (s *apiServer) streamLog(w http.ResponseWriter, r *http.Request, shard, path string, tail int, follow bool, caller string) {
	if follow {
		release, err := s.follows.take(caller)
		if err != nil {
			writeError(w, http.StatusTooManyRequests, fmt.Sprintf("%s: %v", s.conf.name, err))
			return
		}
		defer release()
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		writeError(w, http.StatusNotFound, noFileWhy(s.shards.Shards(), shard, s.conf.name))
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
	tick := s.clock.NewTicker(followPoll)
	defer tick.Stop()
	for {
		if fl != nil {
			fl.Flush()
		}
		select {
		case <-r.Context().Done():
			return
		case <-s.closed:
			return
		case <-tick.Chan():
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

// noLogWhy says in one line why a shard has no log to show: it is placed
// nowhere (with placement's reason), planned on a node that has not
// started it yet, or unknown. Asked on self, with these rows of its
// /v1/shards, where no live node holds the shard.
func noLogWhy(rows []status.ShardInfo, shard, self, runtime string) string {
	for _, s := range rows {
		if s.ShardID != shard {
			continue
		}
		switch {
		case s.Node == "" && s.Reason != "":
			return fmt.Sprintf("shard %q never started: placement put it on no node: %s", shard, s.Reason)
		case s.Node == "":
			return fmt.Sprintf("shard %q never started: placement put it on no node", shard)
		case s.Node == self:
			if runtime == "" {
				runtime = "none"
			}
			return fmt.Sprintf("shard %q has no engine log on %s: no engine of it has started here (runtime %s)", shard, s.Node, runtime)
		default:
			return fmt.Sprintf("shard %q has not started yet: it is planned on %s, which does not hold it (status %s)", shard, s.Node, s.Status)
		}
	}
	var known []string
	for _, s := range rows {
		known = append(known, s.ShardID)
	}
	if len(known) > 8 {
		known = append(known[:8], "...")
	}
	if len(known) == 0 {
		return fmt.Sprintf("no shard %q: no deployment has shards (see llmgw models)", shard)
	}
	return fmt.Sprintf("no shard %q (shards: %s)", shard, strings.Join(known, ", "))
}

// noFileWhy says in one line why a shard self holds (held) has no log
// file: its engine never started (with the start error, when there is
// one).
func noFileWhy(held []gossip.ShardRecord, shard, self string) string {
	for _, s := range held {
		if s.ShardID != shard {
			continue
		}
		why := fmt.Sprintf("shard %q has no log on %s: its engine never started (status %s", shard, self, s.Status)
		if s.Error != "" {
			why += ", start error: " + s.Error
		}
		return why + ")"
	}
	return fmt.Sprintf("shard %q has no log on %s: its engine never started", shard, self)
}
