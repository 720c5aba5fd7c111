package containerd

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/llmgw/llmgw/supervisor/runtime"
)

// containerd's identifier rule (pkg/identifiers): alphanumeric runs joined
// by single '.', '_' or '-', at most 76 characters.
var (
	identifier    = regexp.MustCompile(`^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$`)
	maxIdentifier = 76
)

// ContainerID is the container (and snapshot) ID of engine id. Engine IDs
// are "<shard>-<spec version>" and may outgrow containerd's 76 characters;
// long ones are cut and suffixed with a hash of the whole, which keeps the
// mapping deterministic, so no lookup table is needed after a restart.
func ContainerID(id string) (string, error) {
	if !identifier.MatchString(id) {
		return "", fmt.Errorf("containerd runtime: engine id %q: want letters and digits joined by single '.', '_' or '-'", id)
	}
	if len(id) <= maxIdentifier {
		return id, nil
	}
	sum := sha256.Sum256([]byte(id))
	// The cut may end on a separator; two in a row are not an identifier.
	head := strings.TrimRight(id[:maxIdentifier-13], "._-")
	return head + "-" + hex.EncodeToString(sum[:])[:12], nil
}

// Start implements runtime.Runtime. The image must be present (EnsureImage
// or ImportImage first): a silent multi-gigabyte pull inside Start would
// hold the supervisor for minutes. The engine does not depend on ctx once
// Start returns.
func (r *Runtime) Start(ctx context.Context, spec runtime.EngineSpec) (runtime.Engine, error) {
	cid, err := ContainerID(spec.ID)
	if err != nil {
		return runtime.Engine{}, err
	}
	switch {
	case spec.Image == "":
		return runtime.Engine{}, fmt.Errorf("containerd runtime: engine %q: no image", spec.ID)
	case len(spec.Command) == 0:
		return runtime.Engine{}, fmt.Errorf("containerd runtime: engine %q: empty command", spec.ID)
	case !filepath.IsAbs(spec.LogPath):
		return runtime.Engine{}, fmt.Errorf("containerd runtime: engine %q: log path %q is not absolute", spec.ID, spec.LogPath)
	case spec.WeightsDir != "" && !filepath.IsAbs(spec.WeightsDir):
		return runtime.Engine{}, fmt.Errorf("containerd runtime: engine %q: weights dir %q is not absolute", spec.ID, spec.WeightsDir)
	case spec.CacheDir != "" && !filepath.IsAbs(spec.CacheDir):
		return runtime.Engine{}, fmt.Errorf("containerd runtime: engine %q: cache dir %q is not absolute", spec.ID, spec.CacheDir)
	}
	// GPUs first: a node without CDI specs fails here, before anything is
	// created, with the command that fixes it.
	gpus, err := r.gpuSpecOpt(spec.GPUUUIDs)
	if err != nil {
		return runtime.Engine{}, fmt.Errorf("containerd runtime: engine %q: %w", spec.ID, err)
	}
	ctx = r.nsCtx(ctx)

	ref, err := normalizeRef(spec.Image)
	if err != nil {
		return runtime.Engine{}, fmt.Errorf("containerd runtime: engine %q: %w", spec.ID, err)
	}
	img, err := r.c.GetImage(ctx, ref)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return runtime.Engine{}, fmt.Errorf("containerd runtime: engine %q: image %s is not in namespace %s (pull or import it first): %w", spec.ID, ref, r.ns, err)
		}
		return runtime.Engine{}, fmt.Errorf("containerd runtime: engine %q: %w", spec.ID, err)
	}
	if ok, err := img.IsUnpacked(ctx, r.snapshotter); err != nil || !ok {
		if err := img.Unpack(ctx, r.snapshotter); err != nil {
			return runtime.Engine{}, fmt.Errorf("containerd runtime: engine %q: unpack %s: %w", spec.ID, ref, err)
		}
	}

	if err := r.replaceExited(ctx, cid); err != nil {
		return runtime.Engine{}, fmt.Errorf("containerd runtime: engine %q: %w", spec.ID, err)
	}
	// The shim opens the log file; its directory has to exist. So does a
	// bind mount's source (an empty weights cache is filled by the engine).
	for _, dir := range []string{filepath.Dir(spec.LogPath), spec.WeightsDir, spec.CacheDir} {
		if dir == "" {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return runtime.Engine{}, fmt.Errorf("containerd runtime: engine %q: %w", spec.ID, err)
		}
	}

	specOpts := []oci.SpecOpts{
		// Image config first: later options override what it sets.
		oci.WithImageConfig(img),
		oci.WithProcessArgs(spec.Command...),
		oci.WithEnv(spec.Env),
		oci.WithHostNamespace(specs.NetworkNamespace),
		oci.WithHostHostsFile,
		oci.WithHostResolvconf,
		oci.WithDevShmSize(r.shmSize >> 10),
		withRlimits(probeDaemonLimits(r.socket).rlimits()),
	}
	// The weights and the compile caches outlive the container, at the
	// same paths inside as outside (the profile names host paths).
	for _, dir := range []string{spec.WeightsDir, spec.CacheDir} {
		if dir == "" {
			continue
		}
		specOpts = append(specOpts, oci.WithMounts([]specs.Mount{{
			Type: "bind", Source: dir, Destination: dir,
			Options: []string{"rbind", "rw"},
		}}))
	}
	specOpts = append(specOpts, fabricSpecOpts(spec, InfinibandDir, r.log)...)
	if gpus != nil {
		specOpts = append(specOpts, gpus)
	}

	// Creating and starting run to the end once begun, whatever the
	// caller's ctx does: the daemon goes on with a request the client gave
	// up on, so a cancel half-way leaves a lease, a half-made task, or a
	// running container reported as failed (whose every restart then
	// fails with "already runs"). The caller learns of the engine and
	// stops it if it is no longer wanted.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createTimeout)
	defer cancel()
	ctr, err := r.c.NewContainer(ctx, cid,
		client.WithImage(img),
		client.WithSnapshotter(r.snapshotter),
		client.WithNewSnapshot(cid, img),
		client.WithContainerLabels(spec.Labels()),
		client.WithNewSpec(specOpts...),
	)
	if err != nil {
		return runtime.Engine{}, fmt.Errorf("containerd runtime: engine %q: create container: %w", spec.ID, err)
	}
	// From here a failure must not leave a half-made container behind; the
	// cleanup outlives a cancelled ctx.
	fail := func(step string, err error) (runtime.Engine, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if t, terr := ctr.Task(cctx, nil); terr == nil {
			_, _ = t.Delete(cctx, client.WithProcessKill)
		}
		if derr := ctr.Delete(cctx, client.WithSnapshotCleanup); derr != nil {
			r.log.Warn("cleanup after failed start", "container", cid, "err", derr)
		}
		return runtime.Engine{}, fmt.Errorf("containerd runtime: engine %q: %s: %w", spec.ID, step, err)
	}
	task, err := ctr.NewTask(ctx, cio.LogFile(spec.LogPath))
	if err != nil {
		return fail("create task", err)
	}
	if err := task.Start(ctx); err != nil {
		return fail("start task", err)
	}
	e, err := r.engine(ctx, ctr)
	if err != nil {
		// It runs: say so, rather than report a failure for a live engine.
		r.log.Warn("engine started; reading its state failed", "container", cid, "err", err)
		return runtime.Engine{ID: spec.ID, Labels: spec.Labels(), State: runtime.StateRunning, PID: int(task.Pid()), StartedAt: r.clk.Now(), ContainerID: cid}, nil
	}
	return e, nil
}

// createTimeout bounds creating and starting one container (the image is
// already in the content store by then).
const createTimeout = 2 * time.Minute

// replaceExited removes a stopped container that holds cid (the contract:
// an exited engine is replaced), and a snapshot left by a container deleted
// without cleanup. A running one is an error.
func (r *Runtime) replaceExited(ctx context.Context, cid string) error {
	ctr, err := r.c.LoadContainer(ctx, cid)
	switch {
	case errdefs.IsNotFound(err):
		if err := r.c.SnapshotService(r.snapshotter).Remove(ctx, cid); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("remove stale snapshot %s: %w", cid, err)
		}
		return nil
	case err != nil:
		return err
	}
	e, err := r.engine(ctx, ctr)
	if err != nil {
		return err
	}
	if e.State == runtime.StateRunning {
		return fmt.Errorf("container %s already runs (pid %d)", cid, e.PID)
	}
	return r.remove(ctx, ctr, 0)
}

// engine reads a container's labels and its task's state.
func (r *Runtime) engine(ctx context.Context, ctr client.Container) (runtime.Engine, error) {
	info, err := ctr.Info(ctx, client.WithoutRefreshedMetadata)
	if err != nil {
		return runtime.Engine{}, wrapNotFound(ctr.ID(), err)
	}
	e := runtime.Engine{
		ID:          info.ID,
		Labels:      info.Labels,
		StartedAt:   info.CreatedAt,
		ContainerID: info.ID,
	}
	if id := info.Labels[runtime.LabelEngine]; id != "" {
		e.ID = id
	}
	if e.Labels == nil {
		e.Labels = map[string]string{}
	}
	// nil attach: the task writes to a log file, and attaching FIFOs to a
	// file-backed task fails (containerd#6422).
	task, err := ctr.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		// Created but never started, or its task was deleted: nothing runs
		// and no exit code is known.
		e.State, e.ExitCode = runtime.StateExited, -1
		return e, nil
	}
	if err != nil {
		return runtime.Engine{}, wrapNotFound(e.ID, err)
	}
	st, err := task.Status(ctx)
	if err != nil {
		return runtime.Engine{}, wrapNotFound(e.ID, err)
	}
	switch st.Status {
	case client.Running:
		e.State, e.PID = runtime.StateRunning, int(task.Pid())
	case client.Stopped:
		e.State, e.ExitCode, e.ExitedAt = runtime.StateExited, int(st.ExitStatus), st.ExitTime
	default:
		// Created, paused, pausing, unknown: not serving, not finished.
		e.State, e.PID = runtime.StateUnknown, int(task.Pid())
	}
	return e, nil
}

func wrapNotFound(id string, err error) error {
	if errdefs.IsNotFound(err) {
		return fmt.Errorf("containerd runtime: engine %q: %w: %w", id, runtime.ErrNotFound, err)
	}
	return fmt.Errorf("containerd runtime: engine %q: %w", id, err)
}

// Status implements runtime.Runtime.
func (r *Runtime) Status(ctx context.Context, id string) (runtime.Engine, error) {
	cid, err := ContainerID(id)
	if err != nil {
		return runtime.Engine{}, fmt.Errorf("%w: %w", err, runtime.ErrNotFound)
	}
	ctx = r.nsCtx(ctx)
	ctr, err := r.c.LoadContainer(ctx, cid)
	if err != nil {
		return runtime.Engine{}, wrapNotFound(id, err)
	}
	return r.engine(ctx, ctr)
}

// List implements runtime.Runtime: every container of the namespace with
// llmgw's node label equal to node (any node when node is empty).
func (r *Runtime) List(ctx context.Context, node string) ([]runtime.Engine, error) {
	ctx = r.nsCtx(ctx)
	filter := fmt.Sprintf("labels.%q", runtime.LabelNode)
	if node != "" {
		filter += "==" + strconv.Quote(node)
	}
	ctrs, err := r.c.Containers(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("containerd runtime: list: %w", err)
	}
	out := make([]runtime.Engine, 0, len(ctrs))
	for _, ctr := range ctrs {
		e, err := r.engine(ctx, ctr)
		if errors.Is(err, runtime.ErrNotFound) {
			// Removed between the listing and the look.
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("containerd runtime: list: %w", err)
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b runtime.Engine) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Stop implements runtime.Runtime: SIGTERM to every process of the
// container, up to grace for the task to exit (less if ctx ends first),
// SIGKILL, then the task, the container and its snapshot are deleted.
func (r *Runtime) Stop(ctx context.Context, id string, grace time.Duration) error {
	cid, err := ContainerID(id)
	if err != nil {
		return fmt.Errorf("%w: %w", err, runtime.ErrNotFound)
	}
	ctx = r.nsCtx(ctx)
	ctr, err := r.c.LoadContainer(ctx, cid)
	if err != nil {
		return wrapNotFound(id, err)
	}
	return r.remove(ctx, ctr, grace)
}

// remove stops the container's task, if any, and deletes it all.
func (r *Runtime) remove(ctx context.Context, ctr client.Container, grace time.Duration) error {
	// Teardown continues past a cancelled ctx: a half-deleted engine would
	// hold its GPUs and port. It is bounded instead.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace+r.killTimeout+30*time.Second)
	defer cancel()
	task, err := ctr.Task(dctx, nil)
	switch {
	case errdefs.IsNotFound(err):
	case err != nil:
		return wrapNotFound(ctr.ID(), err)
	default:
		if err := r.stopTask(ctx, dctx, task, grace); err != nil {
			return fmt.Errorf("containerd runtime: engine %q: %w", ctr.ID(), err)
		}
		if _, err := task.Delete(dctx, client.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("containerd runtime: engine %q: delete task: %w", ctr.ID(), err)
		}
	}
	if err := ctr.Delete(dctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("containerd runtime: engine %q: delete container: %w", ctr.ID(), err)
	}
	return nil
}

// stopTask signals a running task and waits for it: SIGTERM, grace (cut
// short when ctx ends), SIGKILL, killTimeout.
func (r *Runtime) stopTask(ctx, dctx context.Context, task client.Task, grace time.Duration) error {
	st, err := task.Status(dctx)
	if err != nil {
		return err
	}
	if st.Status == client.Stopped {
		return nil
	}
	// Wait before Kill, or the exit may come before anyone listens.
	exited, err := task.Wait(dctx)
	if err != nil {
		return fmt.Errorf("wait: %w", err)
	}
	if err := task.Kill(dctx, syscall.SIGTERM, client.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("SIGTERM: %w", err)
	}
	timer := r.clk.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-exited:
		return nil
	case <-timer.Chan():
	case <-ctx.Done():
	}
	if err := task.Kill(dctx, syscall.SIGKILL, client.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("SIGKILL: %w", err)
	}
	kt := r.clk.NewTimer(r.killTimeout)
	defer kt.Stop()
	select {
	case <-exited:
		return nil
	case <-kt.Chan():
		return fmt.Errorf("task still runs %s after SIGKILL", r.killTimeout)
	}
}
