package engine

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/runtime"
	"github.com/llmgw/llmgw/supervisor/runtime/containerd"
	"github.com/llmgw/llmgw/supervisor/runtime/containerd/ctrtest"
)

// TestRunnerOverContainerd runs the whole engine lifecycle through a real
// containerd: an image holding llmgw is imported, a fake-engine shard starts
// as a container and becomes ready, the runner (the agent) restarts and
// adopts the same container and task untouched, an orphan container
// labelled ours is stopped, and an unplanned shard is removed. It skips
// only where no containerd answers (CI starts one with .ci/containerd.sh).
// containerdWithImage connects to the test daemon in namespace ns (and
// skips the test where none answers) and imports an image tagged tag that
// holds a static llmgw as /llmgw: the fake profile runs `<self> engine
// fake ...`, and self is that path inside the image. open makes another
// connection, as a restarted agent would.
func containerdWithImage(t *testing.T, ns, tag string) (open func() *containerd.Runtime) {
	t.Helper()
	sock := os.Getenv("LLMGW_TEST_CONTAINERD_SOCKET")
	if sock == "" {
		sock = "/run/containerd/containerd.sock"
	}
	open = func() *containerd.Runtime {
		rt, err := containerd.New(containerd.WithSocket(sock), containerd.WithNamespace(ns), containerd.WithShmSize(64<<20))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if err := rt.Ping(ctx); err != nil {
			rt.Close()
			t.Skipf("no containerd answers at %s (run `eval \"$(.ci/containerd.sh start)\"` as root): %v", sock, err)
		}
		t.Cleanup(func() { rt.Close() })
		return rt
	}
	rt := open()
	dir := t.TempDir()
	bin := filepath.Join(dir, "llmgw")
	root, _ := filepath.Abs("../..") // the module root, from supervisor/engine
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := ctrtest.BuildStatic(ctx, root, "./cmd/llmgw", bin); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var tarball bytes.Buffer
	if err := ctrtest.WriteDockerArchive(&tarball, ctrtest.Image{RepoTag: tag, Entrypoint: []string{"/llmgw"},
		Files: []ctrtest.File{{Path: "/llmgw", Mode: 0o755, Data: data}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.ImportImage(ctx, &tarball); err != nil {
		t.Fatal(err)
	}
	return open
}

func TestRunnerOverContainerd(t *testing.T) {
	open := containerdWithImage(t, "llmgw-runner-test", "llmgw/runner-test:1")
	rt := open()

	dataDir := datadir.New(t.TempDir())
	newRunner := func(rt runtime.Runtime) *Runner {
		r, err := NewRunner(context.Background(), Config{
			Node: "n1", Runtime: rt, DataDir: dataDir, Host: "127.0.0.1", Self: "/llmgw", SimulatedGPUs: true,
			PortMin: 21100, PortMax: 21999, Poll: 100 * time.Millisecond, Grace: 2 * time.Second,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		r.Settle()
		return r
	}
	spec := placement.Deployment{Name: "chat", Model: "m/tiny", Engine: "fake", Image: "llmgw/runner-test:1", Replicas: 1}
	d := Desired{Assignment: placement.Assignment{ShardID: "chat-0", ReplicaID: "chat-0", Deployment: "chat",
		SpecVersion: spec.SpecVersion(), GPUs: []int{0}}, Spec: spec}

	r := newRunner(rt)
	r.Reconcile(context.Background(), []Desired{d})
	waitShard(t, r, "container ready", func([]string) bool { return readyPID(r, "chat-0") > 0 })
	pid := readyPID(r, "chat-0")
	// The record names the container the runtime reports, not the
	// engine ID (they differ where the ID outgrows containerd's limit).
	cid, err := containerd.ContainerID(placement.EngineID(d.ShardID, d.SpecVersion))
	if err != nil {
		t.Fatal(err)
	}
	if s := r.Shards()[0]; s.Container == "" || s.Container != cid {
		t.Fatalf("container not reported: %+v, want %q", s, cid)
	}

	// An orphan: ours by label, in no state file and no plan.
	orphan := runtime.EngineSpec{ID: "ghost-0-x", Node: "n1", ShardID: "ghost-0", SpecVersion: "x", Image: "llmgw/runner-test:1",
		Command: []string{"/llmgw", "engine", "fake", "--model", "ghost", "--port", "21099"}, LogPath: filepath.Join(dataDir.Root(), "ghost.log")}
	if _, err := rt.Start(context.Background(), orphan); err != nil {
		t.Fatal(err)
	}

	// The agent restarts, with a new client connection.
	r.Close()
	rt2 := open()
	r2 := newRunner(rt2)
	r2.Reconcile(context.Background(), []Desired{d})
	waitShard(t, r2, "same container adopted, orphan gone", func([]string) bool {
		if readyPID(r2, "chat-0") != pid || len(r2.Shards()) != 1 {
			return false
		}
		engines, err := rt2.List(context.Background(), "n1")
		return err == nil && len(engines) == 1
	})
	if s := r2.Shards()[0]; s.Restarts != 0 {
		t.Fatalf("adopted engine was restarted: %+v", s)
	}

	r2.Reconcile(context.Background(), nil)
	waitShard(t, r2, "unplanned container removed", func(s []string) bool {
		engines, err := rt2.List(context.Background(), "n1")
		return len(s) == 0 && err == nil && len(engines) == 0
	})
	r2.Close()
}
