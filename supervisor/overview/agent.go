package overview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// DefaultAPI is where the agent's API is dialled when its stamp does not
// say (the default of `node up --api`, on loopback).
const DefaultAPI = "127.0.0.1:7070"

// API reads the agent's HTTP API on this machine. addr is host:port;
// what answers is decoded into into.
type API interface {
	Get(ctx context.Context, addr, path string, into any) error
}

// HTTPAPI is API over plain HTTP. The reads it makes need no token.
type HTTPAPI struct{ Client *http.Client }

// maxBody caps what one API answer may take: the cluster of a few hundred
// nodes is well under it, and a runaway answer must not hold the screen.
const maxBody = 16 << 20

// Get implements API.
func (h HTTPAPI) Get(ctx context.Context, addr, path string, into any) error {
	c := h.Client
	if c == nil {
		c = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d", path, resp.StatusCode)
	}
	if into == nil {
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(into); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}

// AgentReader reads the agent: what systemd says of its service, whether
// its API answers, and its last-alive stamp.
type AgentReader struct {
	// Run runs systemctl.
	Run Runner
	// API reaches the agent; Addr overrides the address its stamp gives.
	API  API
	Addr string
	// Version is this binary's version, shown beside the agent's.
	Version string
	// DataDir is shown as it was given.
	DataDir string
	// Alive tells whether a pid runs (PIDAlive).
	Alive func(pid int) bool
}

// AgentSection is what the Agent section shows.
type AgentSection struct {
	// Service is systemd's word: ActiveState, SubState and since when.
	// ServiceNote replaces them when systemd cannot say (not installed as
	// a service, no systemd here).
	ActiveState, SubState string
	ActiveSince           time.Time
	ServiceNote           string
	// APIAddr is the address asked; APIErr why it did not answer (empty:
	// it answered).
	APIAddr string
	APIErr  string
	// Stamp is the agent's last-alive stamp; StampNote says why there is
	// none to show.
	Stamp     *stampView
	StampNote string
	// PIDGone is set when the stamp's agent process is no longer there.
	PIDGone bool
	Version string
	DataDir string
	// NeedsRoot names what only root could read here.
	NeedsRoot []string
	// Note replaces the whole section when it did not answer in time.
	Note string
}

// stampView is what a frame shows of agent.json.
type stampView struct {
	At, StartedAt time.Time
	PID           int
	Version       string
	LogFile       string
}

// Read reads the agent section.
func (r AgentReader) Read(ctx context.Context, st stamp, now time.Time) AgentSection {
	s := AgentSection{Version: r.Version, DataDir: r.DataDir}
	// A share of the bound each for systemd and the API, so that one
	// hanging still leaves the other's answer on the screen.
	sctx, cancel := part(ctx, 0.6)
	s.ActiveState, s.SubState, s.ActiveSince, s.ServiceNote = r.service(sctx)
	cancel()

	switch {
	case st.found:
		a := st.alive
		s.Stamp = &stampView{At: a.At, StartedAt: a.StartedAt, PID: a.PID, Version: a.Version, LogFile: a.LogFile}
		alive := r.Alive
		if alive == nil {
			alive = PIDAlive
		}
		s.PIDGone = a.PID > 0 && !alive(a.PID)
	case st.root:
		s.NeedsRoot = append(s.NeedsRoot, "the agent's stamp in the data dir")
		s.StampNote = st.err
	case st.err != "":
		s.StampNote = st.err
	default:
		s.StampNote = "no agent has run with this data dir (no agent.json)"
	}

	s.APIAddr = apiAddr(r.Addr, st)
	if r.API == nil {
		s.APIErr = "no API client"
	} else {
		actx, cancel := part(ctx, 0.75)
		defer cancel()
		if err := r.API.Get(actx, s.APIAddr, "/healthz", nil); err != nil {
			s.APIErr = shortErr(err)
		}
	}
	return s
}

// apiAddr is the address to ask: the one given, else the stamp's, else
// the default.
func apiAddr(given string, st stamp) string {
	switch {
	case given != "":
		return given
	case st.alive.API != "":
		return st.alive.API
	}
	return DefaultAPI
}

// service asks systemd about the llmgw unit.
func (r AgentReader) service(ctx context.Context) (active, sub string, since time.Time, note string) {
	if r.Run == nil {
		return "", "", time.Time{}, "systemd not asked"
	}
	if _, err := r.Run.LookPath("systemctl"); err != nil {
		return "", "", time.Time{}, "no systemd on this machine (systemctl not found)"
	}
	out, err := r.Run.Run(ctx, "systemctl", "show", ServiceName, "-p", "LoadState,ActiveState,SubState,ActiveEnterTimestamp")
	if ctx.Err() != nil {
		return "", "", time.Time{}, "systemd does not answer (systemctl show ran past its bound)"
	}
	if err != nil && len(out) == 0 {
		return "", "", time.Time{}, "systemd does not answer: " + shortErr(err)
	}
	kv := map[string]string{}
	for line := range strings.SplitSeq(string(out), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			kv[k] = v
		}
	}
	switch {
	case kv["LoadState"] == "not-found":
		return "", "", time.Time{}, "not installed as a service (llmgw node install makes it one)"
	case kv["ActiveState"] == "":
		// systemctl prints this when systemd is not PID 1 (a container).
		msg := strings.TrimSpace(string(out))
		if msg == "" && err != nil {
			msg = err.Error()
		}
		return "", "", time.Time{}, "systemd does not say: " + firstLine(msg)
	}
	return kv["ActiveState"], kv["SubState"], parseSystemdTime(kv["ActiveEnterTimestamp"]), ""
}

// parseSystemdTime reads systemd's "Tue 2026-12-01 20:05:54 UTC"; zero
// when empty or "n/a". A zone abbreviation Go does not know is read as
// local time.
func parseSystemdTime(v string) time.Time {
	v = strings.TrimSpace(v)
	if v == "" || v == "n/a" {
		return time.Time{}
	}
	for _, layout := range []string{"Mon 2006-01-02 15:04:05 MST", "Mon 2006-01-02 15:04:05 -0700", "Mon 2006-01-02 15:04:05"} {
		if t, err := time.ParseInLocation(layout, v, time.Local); err == nil {
			return t
		}
	}
	if i := strings.LastIndexByte(v, ' '); i > 0 {
		if t, err := time.ParseInLocation("Mon 2006-01-02 15:04:05", v[:i], time.Local); err == nil {
			return t
		}
	}
	return time.Time{}
}

// shortErr is an error without the URL net/http repeats in front of it.
func shortErr(err error) string {
	var ne *net.OpError
	if errors.As(err, &ne) && ne.Err != nil {
		return ne.Err.Error()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer within the bound"
	}
	return err.Error()
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return l
}
