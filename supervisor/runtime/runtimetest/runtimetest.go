// Package runtimetest is the behaviour every runtime.Runtime shares, as a
// test suite each implementation runs against itself: the process runtime
// in its unit tests, the containerd runtime against a real daemon.
//
// It checks the contract of supervisor/runtime: labels, errors wrapping
// ErrNotFound, one running engine per ID, exited engines replaced, exit
// codes, and an engine found again, untouched, by a new runtime value (what
// an agent restart looks like).
package runtimetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmgw/llmgw/supervisor/runtime"
)

// Harness adapts one runtime to the suite.
type Harness struct {
	// New returns a runtime over the same backing state on every call (the
	// same record directory, the same daemon and namespace): a second call
	// is the agent after a restart. The harness cleans up what its engines
	// leave.
	New func(t *testing.T) runtime.Runtime
	// Spec returns the spec of an engine with id on node "n1" that serves
	// until stopped, or, when exitCode >= 0, exits at once with that code.
	// Each call may use fresh ports and log files.
	Spec func(t *testing.T, id string, exitCode int) runtime.EngineSpec
	// Grace is the Stop grace period the suite uses (default 10s).
	Grace time.Duration
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	if h.Grace == 0 {
		h.Grace = 10 * time.Second
	}
	t.Run("UnknownIDs", func(t *testing.T) { unknownIDs(t, h) })
	t.Run("StartFindStop", func(t *testing.T) { startFindStop(t, h) })
	t.Run("ExitCodeAndReplace", func(t *testing.T) { exitCodeAndReplace(t, h) })
}

func unknownIDs(t *testing.T, h Harness) {
	r := h.New(t)
	ctx := context.Background()
	if r.Name() == "" {
		t.Error("Name is empty")
	}
	if _, err := r.Status(ctx, "nope-0-v0"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Status(unknown) = %v, want ErrNotFound", err)
	}
	if err := r.Stop(ctx, "nope-0-v0", time.Second); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Stop(unknown) = %v, want ErrNotFound", err)
	}
	if es, err := r.List(ctx, "no-such-node"); err != nil || len(es) != 0 {
		t.Errorf("List(no-such-node) = %v, %v", es, err)
	}
}

func startFindStop(t *testing.T, h Harness) {
	ctx := context.Background()
	r1 := h.New(t)
	spec := h.Spec(t, "conf-0-v1", -1)
	e, err := r1.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if e.ID != spec.ID || e.State != runtime.StateRunning || e.PID <= 0 || e.StartedAt.IsZero() {
		t.Fatalf("Start = %+v", e)
	}
	for k, v := range map[string]string{
		runtime.LabelNode: spec.Node, runtime.LabelShard: spec.ShardID,
		runtime.LabelSpec: spec.SpecVersion, runtime.LabelEngine: spec.ID,
	} {
		if e.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, e.Labels[k], v)
		}
	}
	if _, err := r1.Start(ctx, spec); err == nil {
		t.Error("a second Start of a running ID succeeded")
	}

	r2 := h.New(t)
	got, err := r2.Status(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != runtime.StateRunning || got.PID != e.PID {
		t.Fatalf("after restart Status = %+v, want running pid %d", got, e.PID)
	}
	// The container ID (empty for a runtime without containers) is the
	// same whoever asks: the supervisor records what Start returned.
	if got.ContainerID != e.ContainerID {
		t.Errorf("after restart Status container %q, Start said %q", got.ContainerID, e.ContainerID)
	}
	list, err := r2.List(ctx, spec.Node)
	if err != nil || len(list) != 1 || list[0].ID != spec.ID || list[0].PID != e.PID || list[0].ContainerID != e.ContainerID {
		t.Fatalf("List(%s) = %+v, %v", spec.Node, list, err)
	}
	if other, err := r2.List(ctx, spec.Node+"-other"); err != nil || len(other) != 0 {
		t.Fatalf("List(other node) = %+v, %v", other, err)
	}

	if err := r2.Stop(ctx, spec.ID, h.Grace); err != nil {
		t.Fatal(err)
	}
	if _, err := r2.Status(ctx, spec.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Status after Stop = %v, want ErrNotFound", err)
	}
	if list, _ := r2.List(ctx, spec.Node); len(list) != 0 {
		t.Fatalf("List after Stop = %+v", list)
	}
}

func exitCodeAndReplace(t *testing.T, h Harness) {
	ctx := context.Background()
	r1 := h.New(t)
	spec := h.Spec(t, "exit-0-v1", 3)
	if _, err := r1.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	var e runtime.Engine
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		e, err = r1.Status(ctx, spec.ID)
		if err == nil && e.State == runtime.StateExited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine did not exit: %+v, %v", e, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if e.ExitCode != 3 || e.PID != 0 {
		t.Fatalf("exited engine %+v, want exit code 3 and no pid", e)
	}
	// A later agent still knows how it ended, and lists it until removed.
	r2 := h.New(t)
	if e2, err := r2.Status(ctx, spec.ID); err != nil || e2.State != runtime.StateExited || e2.ExitCode != 3 {
		t.Fatalf("after restart %+v, %v; want exited with 3", e2, err)
	}
	if list, _ := r2.List(ctx, spec.Node); len(list) != 1 || list[0].State != runtime.StateExited {
		t.Fatalf("List = %+v, want the exited engine", list)
	}

	// Start replaces an exited engine of the same ID.
	serve := h.Spec(t, spec.ID, -1)
	e3, err := r2.Start(ctx, serve)
	if err != nil {
		t.Fatal(err)
	}
	if e3.State != runtime.StateRunning {
		t.Fatalf("replacement %+v", e3)
	}
	if err := r2.Stop(ctx, spec.ID, h.Grace); err != nil {
		t.Fatal(err)
	}
}
