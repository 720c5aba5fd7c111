package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/runtime"
)

// imageRuntime is a real runtime dressed as a container runtime: it pulls
// images (runtime.ImagePuller) and reports a container ID of its own
// making, so a test sees the runner use what the runtime returns rather
// than what it knows of the runtime.
type imageRuntime struct {
	runtime.Runtime
	pullErr error
	// pulled, when set, runs inside EnsureImage (a test's clock moves
	// there, as a long pull's would).
	pulled func()
	mu     sync.Mutex
	calls  []string
}

var _ runtime.ImagePuller = (*imageRuntime)(nil)

func (f *imageRuntime) EnsureImage(_ context.Context, ref string, _ func(done, total int64)) error {
	f.mu.Lock()
	f.calls = append(f.calls, "pull "+ref)
	f.mu.Unlock()
	if f.pulled != nil {
		f.pulled()
	}
	return f.pullErr
}

func (f *imageRuntime) Start(ctx context.Context, spec runtime.EngineSpec) (runtime.Engine, error) {
	f.mu.Lock()
	f.calls = append(f.calls, "start "+spec.ID)
	f.mu.Unlock()
	e, err := f.Runtime.Start(ctx, spec)
	e.ContainerID = "ctr-" + spec.ID
	return e, err
}

func (f *imageRuntime) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// The image is pulled before the engine starts, and the record and the
// state file carry the container ID the runtime returned.
func TestRunnerPullsFirstAndRecordsTheRuntimesContainer(t *testing.T) {
	env := newRunnerEnv(t)
	var f *imageRuntime
	r := env.openWith(func(c *Config) {
		f = &imageRuntime{Runtime: c.Runtime}
		c.Runtime = f
	})
	defer func() {
		r.Reconcile(context.Background(), nil)
		waitShard(t, r, "stopped", func(s []string) bool { return len(s) == 0 })
		r.Close()
	}()
	d := desired("chat")
	d.Spec.Image = "example.invalid/fake:1"
	id := placement.EngineID(d.ShardID, d.SpecVersion)
	r.Reconcile(context.Background(), []Desired{d})
	waitShard(t, r, "ready", func([]string) bool { return readyPID(r, "chat-0") > 0 })
	if got, want := f.Calls(), []string{"pull " + d.Spec.Image, "start " + id}; !slices.Equal(got, want) {
		t.Fatalf("runtime calls %q, want %q", got, want)
	}
	if s, _ := shardOf(r); s.Container != "ctr-"+id {
		t.Fatalf("record container %q, want the runtime's %q", s.Container, "ctr-"+id)
	}
	states, bad := env.dir.ReadShardStates()
	if len(states) != 1 || len(bad) != 0 || states[0].Spec.ContainerID != "ctr-"+id {
		t.Fatalf("state files %+v (bad %v), want container %q", states, bad, "ctr-"+id)
	}
}

// A failed pull is a failed start: the engine is not started, and the
// record says why.
func TestFailedPullIsAFailedStart(t *testing.T) {
	env := newRunnerEnv(t)
	var f *imageRuntime
	r := env.openWith(func(c *Config) {
		f = &imageRuntime{Runtime: c.Runtime, pullErr: errors.New("manifest unknown")}
		c.Runtime = f
	})
	defer r.Close()
	d := desired("chat")
	d.Spec.Image = "example.invalid/missing:1"
	r.Reconcile(context.Background(), []Desired{d})
	testwait.Until(t, 10*time.Second, "the pull failure in the record", func() (bool, string) {
		s, ok := shardOf(r)
		return ok && strings.Contains(s.Error, "manifest unknown") && s.Restarts >= 1, fmt.Sprintf("%+v", s)
	})
	for _, c := range f.Calls() {
		if strings.HasPrefix(c, "start ") {
			t.Fatalf("started after a failed pull: %q", f.Calls())
		}
	}
}

// A runtime that is no ImagePuller is not asked to pull, and one without
// containers reports none. The injected clock stamps the claim and the start.
func TestProcessEngineHasNoContainerAndClockStampsIt(t *testing.T) {
	env := newRunnerEnv(t)
	r, f := env.openFake(func(*Config) {})
	at := f.clk.Now()
	defer func() {
		f.stopAll(r)
		r.Close()
	}()
	if _, ok := any(r.cfg.Runtime).(runtime.ImagePuller); ok {
		t.Fatal("the process runtime claims to pull images")
	}
	d := desired("chat")
	d.Spec.Image = "ignored/by-processes:1"
	r.Reconcile(context.Background(), []Desired{d})
	// The start needs no tick of the clock: it is stamped before the
	// clock moves for the polls that find the engine ready.
	waitShard(t, r, "started", func([]string) bool { s, ok := shardOf(r); return ok && s.PID > 0 })
	f.waitShard(r, "ready", func([]string) bool { return readyPID(r, "chat-0") > 0 })
	s, _ := shardOf(r)
	if s.Container != "" {
		t.Errorf("a process engine reports container %q", s.Container)
	}
	if s.ClaimStamp != at.UnixNano() || !s.StartedAt.Equal(at) {
		t.Errorf("claim stamp %d, started %v; want both from the injected clock (%v)", s.ClaimStamp, s.StartedAt, at)
	}
}
