package overview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/shardstate"
)

// fakeRunner answers fixed commands with canned output. A command it does
// not know fails the test: the readers run only the commands they name.
type fakeRunner struct {
	t       *testing.T
	out     map[string]string // "name arg arg" -> output
	errs    map[string]error
	missing map[string]bool
	// hang blocks these commands until their context ends.
	hang map[string]bool

	mu    sync.Mutex
	calls []string
}

func (f *fakeRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	line := strings.Join(append([]string{name}, args...), " ")
	f.mu.Lock()
	f.calls = append(f.calls, line)
	f.mu.Unlock()
	if f.hang[line] {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	out, ok := f.out[line]
	if !ok && f.errs[line] == nil {
		f.t.Errorf("unexpected command %q", line)
		return nil, errors.New("unexpected command")
	}
	return []byte(out), f.errs[line]
}

func (f *fakeRunner) LookPath(name string) (string, error) {
	if f.missing[name] {
		return "", &exec.Error{Name: name, Err: exec.ErrNotFound}
	}
	return "/usr/bin/" + name, nil
}

func (f *fakeRunner) ran() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// fakeAPI answers paths with JSON values, or fails them all with err.
type fakeAPI struct {
	err     error
	answers map[string]any
	hang    bool

	mu    sync.Mutex
	addrs []string
}

func (a *fakeAPI) Get(ctx context.Context, addr, path string, into any) error {
	a.mu.Lock()
	a.addrs = append(a.addrs, addr)
	a.mu.Unlock()
	if a.hang {
		<-ctx.Done()
		return ctx.Err()
	}
	if a.err != nil {
		return a.err
	}
	v, ok := a.answers[path]
	if !ok {
		return fmt.Errorf("GET %s: HTTP 404", path)
	}
	if into == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, into)
}

// goneAPI is an agent that is not there.
var goneAPI = &fakeAPI{err: errors.New("dial tcp 127.0.0.1:7070: connect: connection refused")}

// goneLater is a pid that was a process and is none now: a child that
// ran and was reaped.
func gonePID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// newDataDir makes a data dir with node.json and, when alive is not nil,
// the agent's stamp.
func newDataDir(t *testing.T, name string, peers []string, alive *datadir.Alive) datadir.Dir {
	t.Helper()
	d := datadir.New(t.TempDir())
	if err := d.WriteIdentity(datadir.Identity{Name: name, Epoch: 1, Peers: peers}); err != nil {
		t.Fatal(err)
	}
	if alive != nil {
		if err := d.WriteAlive(*alive); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// saveShard writes a shard state file as the engine runner does.
func saveShard(t *testing.T, d datadir.Dir, shard, model string, gpus []int, port, pid int, started time.Time) {
	t.Helper()
	if err := os.MkdirAll(d.ShardsDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	st := shardstate.State{ShardID: shard, ReplicaID: shard, PID: pid, StartedAt: started,
		Spec: shardstate.Spec{Engine: "vllm", ServedModelName: model, Deployment: model, GPUIndices: gpus, HTTPPort: port,
			ReplicaID: shard, SpecVersion: "abc123", EngineID: shard + "-abc123", Runtime: "process"}}
	if err := shardstate.Save(d.ShardsDir(), st); err != nil {
		t.Fatal(err)
	}
}
