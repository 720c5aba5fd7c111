package overview

import (
	"context"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/status"
)

var t0 = time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)

const systemctlShow = "systemctl show llmgw -p LoadState,ActiveState,SubState,ActiveEnterTimestamp"

func TestAgentServiceActive(t *testing.T) {
	run := &fakeRunner{t: t, out: map[string]string{
		systemctlShow: "LoadState=loaded\nActiveState=active\nSubState=running\nActiveEnterTimestamp=Tue 2026-12-01 19:40:00 UTC\n",
	}}
	api := &fakeAPI{answers: map[string]any{"/healthz": "ok"}}
	d := newDataDir(t, "gpu-1", nil, &datadir.Alive{At: t0.Add(-2 * time.Second), PID: os.Getpid(), API: "127.0.0.1:7071", Version: "v1.2"})
	st := readStamp(d)
	s := AgentReader{Run: run, API: api, Version: "dev", DataDir: d.Root()}.Read(context.Background(), st, t0)
	if s.ActiveState != "active" || s.SubState != "running" || s.ServiceNote != "" {
		t.Fatalf("service = %+v", s)
	}
	if want := time.Date(2026, 12, 1, 19, 40, 0, 0, time.UTC); !s.ActiveSince.Equal(want) {
		t.Errorf("since = %v, want %v", s.ActiveSince, want)
	}
	if s.APIErr != "" || s.APIAddr != "127.0.0.1:7071" {
		t.Errorf("API = %q %q, want the stamp's address answering", s.APIAddr, s.APIErr)
	}
	if s.Stamp == nil || s.Stamp.Version != "v1.2" || s.PIDGone {
		t.Errorf("stamp = %+v gone=%v", s.Stamp, s.PIDGone)
	}
	if got := run.ran(); !slices.Equal(got, []string{systemctlShow}) {
		t.Errorf("ran %q", got)
	}
}

func TestAgentNotAService(t *testing.T) {
	run := &fakeRunner{t: t, out: map[string]string{systemctlShow: "LoadState=not-found\nActiveState=inactive\nSubState=dead\nActiveEnterTimestamp=\n"}}
	s := AgentReader{Run: run, API: goneAPI}.Read(context.Background(), stamp{}, t0)
	if !strings.Contains(s.ServiceNote, "not installed as a service") {
		t.Errorf("note = %q", s.ServiceNote)
	}
	if s.APIAddr != DefaultAPI || s.APIErr == "" {
		t.Errorf("API = %q %q", s.APIAddr, s.APIErr)
	}
	if !strings.Contains(s.StampNote, "no agent has run") {
		t.Errorf("stamp note = %q", s.StampNote)
	}
}

func TestAgentWithoutSystemd(t *testing.T) {
	run := &fakeRunner{t: t, missing: map[string]bool{"systemctl": true}}
	s := AgentReader{Run: run, API: goneAPI}.Read(context.Background(), stamp{}, t0)
	if !strings.Contains(s.ServiceNote, "no systemd") || len(run.ran()) != 0 {
		t.Errorf("note = %q, ran %q", s.ServiceNote, run.ran())
	}
	// systemctl present but systemd not running (a container).
	run = &fakeRunner{t: t, out: map[string]string{systemctlShow: "System has not been booted with systemd as init system (PID 1). Can't operate.\n"},
		errs: map[string]error{systemctlShow: errors.New("exit status 1")}}
	s = AgentReader{Run: run, API: goneAPI}.Read(context.Background(), stamp{}, t0)
	if !strings.Contains(s.ServiceNote, "not been booted with systemd") {
		t.Errorf("note = %q", s.ServiceNote)
	}
}

// The agent is down: its stamp says since when, and its pid is gone.
func TestAgentDownSince(t *testing.T) {
	pid := gonePID(t)
	at := t0.Add(-90 * time.Second)
	d := newDataDir(t, "gpu-1", nil, &datadir.Alive{At: at, PID: pid, API: "127.0.0.1:7070"})
	run := &fakeRunner{t: t, out: map[string]string{systemctlShow: "LoadState=loaded\nActiveState=failed\nSubState=failed\nActiveEnterTimestamp=n/a\n"}}
	s := AgentReader{Run: run, API: goneAPI}.Read(context.Background(), readStamp(d), t0)
	if !s.PIDGone || s.APIErr == "" || s.ActiveState != "failed" || !s.ActiveSince.IsZero() {
		t.Fatalf("section = %+v", s)
	}
	out := Render(Frame{At: t0, Agent: s}, 0, Plain())
	want := "agent does not answer since " + at.Local().Format("15:04:05") + " (1m30s ago"
	if !strings.Contains(out, want) || !strings.Contains(out, "gone") || !strings.Contains(out, "failed (failed)") {
		t.Errorf("frame lacks %q or the gone pid:\n%s", want, out)
	}
}

func TestStampValidated(t *testing.T) {
	d := datadir.New(t.TempDir())
	if err := os.WriteFile(d.AliveFile(), []byte(`{"alive_at":"2026-12-01T20:00:00Z","pid":1,"log_file":"../../etc/shadow"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	st := readStamp(d)
	if st.found || !strings.Contains(st.err, "log_file") {
		t.Errorf("stamp = %+v, want refused naming log_file", st)
	}
	if err := d.WriteAlive(datadir.Alive{API: "nohostport"}); err == nil || !strings.Contains(err.Error(), "api") {
		t.Errorf("WriteAlive bad api: %v", err)
	}
}

func TestParseSystemdTime(t *testing.T) {
	for in, ok := range map[string]bool{"Tue 2026-12-01 19:40:00 UTC": true, "Tue 2026-12-01 19:40:00 CET": true, "n/a": false, "": false} {
		if got := parseSystemdTime(in); got.IsZero() == ok {
			t.Errorf("%q -> %v", in, got)
		}
	}
}

func TestPeersFromAgentWithReachability(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	api := &fakeAPI{answers: map[string]any{"/v1/cluster": status.ClusterInfo{Self: "gpu-1", Members: []status.MemberInfo{
		{Name: "gpu-1", State: "alive", Gossip: "127.0.0.1:1"},
		{Name: "gpu-2", State: "alive", Gossip: ln.Addr().String()},
		{Name: "gpu-3", State: "dead", Gossip: closedAddr},
		{Name: "gpu-4", State: "alive", Gossip: "not an address"},
	}}}}
	d := newDataDir(t, "gpu-1", nil, nil)
	s := PeersReader{API: api}.Read(context.Background(), d, stamp{})
	if !s.FromAgent || s.Self != "gpu-1" || len(s.Peers) != 3 {
		t.Fatalf("peers = %+v", s)
	}
	if s.Peers[0].Name != "gpu-2" || s.Peers[0].DialErr != "" {
		t.Errorf("gpu-2 = %+v, want reachable", s.Peers[0])
	}
	if s.Peers[1].State != "dead" || !strings.Contains(s.Peers[1].DialErr, "refused") {
		t.Errorf("gpu-3 = %+v, want refused", s.Peers[1])
	}
	if s.Peers[2].DialErr != "not a host:port address" {
		t.Errorf("gpu-4 = %+v: a bad address must not be dialled", s.Peers[2])
	}
}

func TestPeersRememberedWhenAgentDown(t *testing.T) {
	d := newDataDir(t, "gpu-1", []string{"10.0.0.2:7946", "10.0.0.3:7946"}, nil)
	r := PeersReader{API: goneAPI, Dial: func(ctx context.Context, addr string) error { return errors.New("i/o timeout") }}
	s := r.Read(context.Background(), d, stamp{})
	if s.FromAgent || len(s.Peers) != 2 || s.Peers[0].Addr != "10.0.0.2:7946" || s.Peers[0].DialErr != "i/o timeout" {
		t.Fatalf("peers = %+v", s)
	}
	out := Render(Frame{At: t0, Peers: s}, 0, Plain())
	if !strings.Contains(out, "remembered in node.json") || !strings.Contains(out, "without their gossip states") {
		t.Errorf("frame:\n%s", out)
	}
}
