// Package process runs engines as plain host processes: engines installed on
// the host and llmgw's own fake engine. It implements runtime.Runtime.
//
// Engines outlive the agent. Each runs in its own process group, writes its
// own stdout and stderr to spec.LogPath (the child holds the file, not the
// agent), and is not tied to the agent by context or parent-death signal. A
// small record per engine, <dir>/<id>.json, lets a later agent process find
// it again: the pid plus the process start time from /proc (and the boot
// ID), so that a recycled pid is never mistaken for the engine.
//
// Children of the current agent are reaped by a goroutine that records the
// exit code, also into the record, so an agent restarted later still knows
// it. An engine whose exit nobody saw (it died while no agent ran) reports
// StateExited with ExitCode -1.
//
// Exit codes: the process's own code, or 128+signal when a signal killed it,
// as shells report it.
package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/llmgw/llmgw/internal/atomicfile"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/supervisor/runtime"
)

// Name is what Runtime.Name returns.
const Name = "process"

// recordVersion is the layout version of <dir>/<id>.json.
const recordVersion = 1

// record is what survives the agent about one engine.
type record struct {
	Version int    `json:"version"`
	ID      string `json:"id"`
	PID     int    `json:"pid"`
	// PGID is the engine's process group (its pid: it is the leader).
	PGID int `json:"pgid"`
	// StartTicks is /proc/<pid>/stat field 22 and BootID the boot it counts
	// from; together with PID they identify the process.
	StartTicks uint64            `json:"start_ticks"`
	BootID     string            `json:"boot_id,omitempty"`
	Labels     map[string]string `json:"labels"`
	StartedAt  time.Time         `json:"started_at"`
	Command    []string          `json:"command"`
	LogPath    string            `json:"log_path"`
	// Exited is set by the agent that reaped the engine.
	Exited   bool      `json:"exited,omitempty"`
	ExitCode int       `json:"exit_code,omitempty"`
	ExitedAt time.Time `json:"exited_at,omitzero"`
}

// child is an engine started by this Runtime value; its reaper goroutine
// closes done after filling in the exit.
type child struct {
	pid  int
	done chan struct{}
	// reaped is closed once reap has written the exit into the record:
	// Stop waits for it, so nothing touches the directory after Stop.
	reaped   chan struct{}
	exitCode int
	exitedAt time.Time
}

// Runtime is the process runtime. Create it with New.
type Runtime struct {
	dir     string
	proc    string
	clk     clock.Clock
	baseEnv []string
	poll    time.Duration
	killTO  time.Duration
	boot    string

	mu       sync.Mutex
	children map[string]*child
}

var _ runtime.Runtime = (*Runtime)(nil)

// Option configures New.
type Option func(*Runtime)

// WithClock sets the clock for StartedAt and ExitedAt stamps and for
// Stop's waits (the grace period, the bound after SIGKILL, the polls of
// /proc between them). The default is the real clock. With a fake one a
// Stop of a live engine waits until the test advances it: the kernel's
// processes die on real time, and only a poll sees it.
func WithClock(c clock.Clock) Option { return func(r *Runtime) { r.clk = c } }

// WithBaseEnv sets the environment every engine starts from, before the
// spec's variables. The default is the agent's environment without
// llmgw's own LLMGW_* variables (which may carry the cluster token) and
// systemd's per-service sockets.
func WithBaseEnv(env []string) Option {
	return func(r *Runtime) { r.baseEnv = slices.Clone(env) }
}

// New returns a runtime that keeps its records in dir, creating it.
func New(dir string, opts ...Option) (*Runtime, error) {
	r := &Runtime{
		dir:      dir,
		proc:     "/proc",
		clk:      clock.Real(),
		poll:     20 * time.Millisecond,
		killTO:   10 * time.Second,
		children: map[string]*child{},
	}
	r.baseEnv = defaultEnv(os.Environ())
	for _, o := range opts {
		o(r)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("process runtime: %w", err)
	}
	// Temp files of record writes a crash interrupted: the record itself
	// is intact (atomicfile renames last), so they are noise. Under the
	// directory lock: another runtime on this dir may be mid-write.
	if unlock, err := r.lockDir(); err == nil {
		tmps, _ := filepath.Glob(filepath.Join(dir, ".*.json.tmp-*"))
		for _, t := range tmps {
			_ = os.Remove(t)
		}
		unlock()
	}
	r.boot = bootID(r.proc)
	return r, nil
}

func defaultEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "LLMGW_"), k == "NOTIFY_SOCKET", k == "LISTEN_FDS", k == "LISTEN_PID", k == "LISTEN_FDNAMES":
			continue
		}
		out = append(out, kv)
	}
	return out
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return Name }

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$`)

func checkID(id string) error {
	if !idPattern.MatchString(id) || strings.Contains(id, "..") {
		return fmt.Errorf("process runtime: engine id %q: want letters, digits, '.', '_' or '-', no '..'", id)
	}
	return nil
}

// lockDir takes an exclusive flock on the record directory for a
// read-modify-write of records. r.mu orders this process's goroutines; the
// flock orders runtime values and processes sharing the directory (an old
// agent's reaper finishing while a new agent stops the engine), so a removed
// record is never written back.
func (r *Runtime) lockDir() (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(r.dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("process runtime: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("process runtime: lock %s: %w", r.dir, err)
	}
	// Closing the descriptor releases the lock.
	return func() { f.Close() }, nil
}

func (r *Runtime) recordPath(id string) string { return filepath.Join(r.dir, id+".json") }

func (r *Runtime) readRecord(id string) (record, error) {
	b, err := os.ReadFile(r.recordPath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return record{}, fmt.Errorf("process runtime: engine %q: %w", id, runtime.ErrNotFound)
	}
	if err != nil {
		return record{}, fmt.Errorf("process runtime: %w", err)
	}
	var rec record
	bad := json.Unmarshal(b, &rec)
	if bad == nil && (rec.ID != id || rec.PID <= 0) {
		bad = fmt.Errorf("id %q pid %d", rec.ID, rec.PID)
	}
	if bad != nil {
		// A record that cannot be read would block its engine ID for
		// good (every Start and Stop failing on it). Move it aside and
		// treat the engine as unknown; what it ran, if anything, is an
		// orphan for the agent to find by its labels or its port.
		aside := r.recordPath(id) + ".corrupt"
		if err := os.Rename(r.recordPath(id), aside); err != nil {
			return record{}, fmt.Errorf("process runtime: record %s unusable (%v) and not moved aside: %w", r.recordPath(id), bad, err)
		}
		return record{}, fmt.Errorf("process runtime: engine %q: record unusable (%v), moved to %s: %w", id, bad, aside, runtime.ErrNotFound)
	}
	return rec, nil
}

func (r *Runtime) writeRecord(rec record) error {
	rec.Version = recordVersion
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(r.recordPath(rec.ID), append(b, '\n'), 0o600)
}

// alive reports whether the record's process still runs: same pid, same
// start time, same boot, not a zombie.
func (r *Runtime) alive(rec record) bool {
	if rec.Exited {
		return false
	}
	if rec.BootID != "" && r.boot != "" && rec.BootID != r.boot {
		return false
	}
	st, err := readStat(r.proc, rec.PID)
	if err != nil {
		return false
	}
	return st.startTime == rec.StartTicks && !st.dead()
}

// engine reports rec as runtime.Engine. Caller holds r.mu.
func (r *Runtime) engine(rec record) runtime.Engine {
	e := runtime.Engine{
		ID: rec.ID, Labels: cloneLabels(rec.Labels), StartedAt: rec.StartedAt,
	}
	if c, ok := r.children[rec.ID]; ok && c.pid == rec.PID {
		select {
		case <-c.done:
			e.State, e.ExitCode, e.ExitedAt = runtime.StateExited, c.exitCode, c.exitedAt
		default:
			e.State, e.PID = runtime.StateRunning, rec.PID
		}
		return e
	}
	switch {
	case rec.Exited:
		e.State, e.ExitCode, e.ExitedAt = runtime.StateExited, rec.ExitCode, rec.ExitedAt
	case r.alive(rec):
		e.State, e.PID = runtime.StateRunning, rec.PID
	default:
		// It died while no agent was its parent: the code went to init.
		e.State, e.ExitCode = runtime.StateExited, -1
	}
	return e
}

// cloneLabels copies m so callers cannot change a record through an Engine.
func cloneLabels(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Start implements runtime.Runtime. The engine does not depend on ctx: it
// keeps running after ctx ends and after the agent exits.
func (r *Runtime) Start(ctx context.Context, spec runtime.EngineSpec) (runtime.Engine, error) {
	if err := checkID(spec.ID); err != nil {
		return runtime.Engine{}, err
	}
	if len(spec.Command) == 0 {
		return runtime.Engine{}, fmt.Errorf("process runtime: engine %q: empty command", spec.ID)
	}
	if !filepath.IsAbs(spec.LogPath) {
		return runtime.Engine{}, fmt.Errorf("process runtime: engine %q: log path %q is not absolute", spec.ID, spec.LogPath)
	}
	if err := ctx.Err(); err != nil {
		return runtime.Engine{}, err
	}
	prog, err := exec.LookPath(spec.Command[0])
	if err != nil {
		return runtime.Engine{}, fmt.Errorf("process runtime: engine %q: %w", spec.ID, err)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	unlock, err := r.lockDir()
	if err != nil {
		return runtime.Engine{}, err
	}
	defer unlock()
	if old, err := r.readRecord(spec.ID); err == nil {
		if r.engine(old).State == runtime.StateRunning {
			return runtime.Engine{}, fmt.Errorf("process runtime: engine %q already runs as pid %d", spec.ID, old.PID)
		}
		// An exited engine of the same ID is replaced. Its leader is gone,
		// but workers it forked may linger in its group holding GPU memory:
		// they go first.
		if len(r.members(old)) > 0 {
			r.signal(old, syscall.SIGKILL)
			if !r.waitGone(ctx, old, r.killTO) {
				return runtime.Engine{}, fmt.Errorf("process runtime: engine %q: processes of the exited engine (pgid %d) survive SIGKILL", spec.ID, old.PGID)
			}
		}
		delete(r.children, spec.ID)
	} else if !errors.Is(err, runtime.ErrNotFound) {
		return runtime.Engine{}, err
	}

	if err := os.MkdirAll(filepath.Dir(spec.LogPath), 0o755); err != nil {
		return runtime.Engine{}, fmt.Errorf("process runtime: engine %q: %w", spec.ID, err)
	}
	logf, err := os.OpenFile(spec.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return runtime.Engine{}, fmt.Errorf("process runtime: engine %q: %w", spec.ID, err)
	}
	// The child gets its own descriptor of the file; the agent's copy is
	// closed below, so the log never depends on the agent being alive.
	defer logf.Close()

	cmd := &exec.Cmd{
		Path:   prog,
		Args:   slices.Clone(spec.Command),
		Env:    r.env(spec),
		Stdout: logf,
		Stderr: logf,
		// Its own group, so Stop reaches the engine's workers too (vLLM
		// forks one per GPU). No Pdeathsig: the engine must survive us.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	fmt.Fprintf(logf, "llmgw: starting engine %s: %q\n", spec.ID, redactAPIKey(spec.Command))
	if err := cmd.Start(); err != nil {
		return runtime.Engine{}, fmt.Errorf("process runtime: engine %q: %w", spec.ID, err)
	}
	pid := cmd.Process.Pid
	// The child is not reaped until Wait below, so even if it already
	// exited its /proc entry (a zombie) still tells its start time.
	st, err := readStat(r.proc, pid)
	if err != nil {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return runtime.Engine{}, fmt.Errorf("process runtime: engine %q: read start time: %w", spec.ID, err)
	}
	rec := record{
		ID: spec.ID, PID: pid, PGID: pid, StartTicks: st.startTime, BootID: r.boot,
		Labels: spec.Labels(), StartedAt: r.clk.Now(), Command: slices.Clone(spec.Command), LogPath: spec.LogPath,
	}
	if err := r.writeRecord(rec); err != nil {
		// An engine no later agent could find must not keep running.
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return runtime.Engine{}, fmt.Errorf("process runtime: engine %q: write record: %w", spec.ID, err)
	}
	c := &child{pid: pid, done: make(chan struct{}), reaped: make(chan struct{})}
	r.children[spec.ID] = c
	go r.reap(spec.ID, cmd, c)
	return r.engine(rec), nil
}

// env is the base environment, then the spec's, then the GPU selection.
// Later entries win (exec keeps the last value of a duplicated name).
// redactAPIKey is argv with the value of --api-key (the engine's key, in
// either spelling: --api-key=K, or --api-key K) replaced, for the start
// line written to the engine's log: the log is served to others than those
// who may call the engine.
func redactAPIKey(argv []string) []string {
	out := slices.Clone(argv)
	for i, a := range out {
		switch {
		case strings.HasPrefix(a, "--api-key="):
			out[i] = "--api-key=[redacted]"
		case a == "--api-key" && i+1 < len(out):
			out[i+1] = "[redacted]"
		}
	}
	return out
}

func (r *Runtime) env(spec runtime.EngineSpec) []string {
	idx := make([]string, len(spec.GPUIndices))
	for i, g := range spec.GPUIndices {
		idx[i] = strconv.Itoa(g)
	}
	env := slices.Concat(r.baseEnv, spec.Env)
	// CUDA numbers devices fastest-first by default; llmgw's indices are
	// NVML's, which follow the PCI bus order. An empty list hides every GPU
	// from an engine that was given none.
	return append(env, "CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES="+strings.Join(idx, ","), engineEnv+"="+spec.ID)
}

// engineEnv marks an engine's environment with its engine ID, so that an
// engine whose record was lost can still be told from a stranger that got
// its pid (see StopStray).
const engineEnv = "LLMGW_ENGINE_ID"

var _ runtime.StrayStopper = (*Runtime)(nil)

// StopStray implements runtime.StrayStopper: the process s.PID is ours if
// its environment names s.ID (or, for an engine started before the mark,
// its command line is s.Command) and it leads its own process group, as
// every engine this runtime starts does. Its group then gets SIGTERM, up to
// grace, and SIGKILL. A pid that is gone or is someone else's is not found.
func (r *Runtime) StopStray(ctx context.Context, s runtime.Stray, grace time.Duration) (bool, error) {
	if s.PID <= 1 {
		return false, nil
	}
	st, err := readStat(r.proc, s.PID)
	if err != nil || st.dead() || st.pgrp != s.PID || !r.isEngine(s) {
		return false, nil
	}
	rec := record{ID: s.ID, PID: s.PID, PGID: s.PID, StartTicks: st.startTime, BootID: r.boot}
	if r.signal(rec, syscall.SIGTERM) && !r.waitGone(ctx, rec, grace) {
		r.signal(rec, syscall.SIGKILL)
		if !r.waitGone(context.Background(), rec, r.killTO) {
			return true, fmt.Errorf("process runtime: stray engine %q (pid %d) survives SIGKILL", s.ID, s.PID)
		}
	}
	return true, nil
}

// isEngine reports whether the process s.PID is the engine s describes.
func (r *Runtime) isEngine(s runtime.Stray) bool {
	dir := filepath.Join(r.proc, strconv.Itoa(s.PID))
	if env, err := os.ReadFile(filepath.Join(dir, "environ")); err == nil {
		if slices.Contains(strings.Split(string(env), "\x00"), engineEnv+"="+s.ID) {
			return true
		}
	}
	argv, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	return err == nil && len(s.Command) > 0 && slices.Equal(strings.Split(strings.TrimRight(string(argv), "\x00"), "\x00"), s.Command)
}

// reap waits for a child of this agent, so it does not linger as a zombie,
// and records how it ended.
func (r *Runtime) reap(id string, cmd *exec.Cmd, c *child) {
	defer close(c.reaped) // after the unlocks below (defers run last first)
	_ = cmd.Wait()
	code := exitCode(cmd.ProcessState)
	r.mu.Lock()
	defer r.mu.Unlock()
	c.exitCode, c.exitedAt = code, r.clk.Now()
	close(c.done)
	// Keep the code for a later agent, unless Stop removed the record or a
	// new engine took the ID. Best effort: without it a later agent reports
	// exit code -1.
	unlock, err := r.lockDir()
	if err != nil {
		return
	}
	defer unlock()
	if rec, err := r.readRecord(id); err == nil && rec.PID == c.pid {
		rec.Exited, rec.ExitCode, rec.ExitedAt = true, code, c.exitedAt
		_ = r.writeRecord(rec)
	}
}

func exitCode(ps *os.ProcessState) int {
	if ps == nil {
		return -1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// Status implements runtime.Runtime.
func (r *Runtime) Status(ctx context.Context, id string) (runtime.Engine, error) {
	if err := checkID(id); err != nil {
		return runtime.Engine{}, fmt.Errorf("%w: %w", err, runtime.ErrNotFound)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, err := r.readRecord(id)
	if err != nil {
		return runtime.Engine{}, err
	}
	return r.engine(rec), nil
}

// List implements runtime.Runtime. An empty node lists every engine of the
// directory. Records that cannot be read are skipped: List is a view, and
// one bad file must not hide the other engines.
func (r *Runtime) List(ctx context.Context, node string) ([]runtime.Engine, error) {
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		return nil, fmt.Errorf("process runtime: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []runtime.Engine
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(e.Name(), ".") || checkID(id) != nil {
			continue
		}
		rec, err := r.readRecord(id)
		if err != nil {
			continue
		}
		if node != "" && rec.Labels[runtime.LabelNode] != node {
			continue
		}
		out = append(out, r.engine(rec))
	}
	slices.SortFunc(out, func(a, b runtime.Engine) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Stop implements runtime.Runtime: SIGTERM to the engine's process group,
// up to grace for the whole group to exit, then SIGKILL, then the record is
// removed. If ctx ends during the grace period Stop escalates to SIGKILL at
// once. If the group survives SIGKILL (a process stuck in the kernel, e.g.
// the GPU driver) Stop fails and keeps the record, so a later Stop retries.
func (r *Runtime) Stop(ctx context.Context, id string, grace time.Duration) error {
	if err := checkID(id); err != nil {
		return fmt.Errorf("%w: %w", err, runtime.ErrNotFound)
	}
	r.mu.Lock()
	rec, err := r.readRecord(id)
	r.mu.Unlock()
	if err != nil {
		return err
	}

	if r.signal(rec, syscall.SIGTERM) {
		if !r.waitGone(ctx, rec, grace) {
			r.signal(rec, syscall.SIGKILL)
			if !r.waitGone(context.Background(), rec, r.killTO) {
				return fmt.Errorf("process runtime: engine %q (pgid %d) still has processes %s after SIGKILL", id, rec.PGID, r.killTO)
			}
		}
	}

	// If this runtime started the engine, its reaper records the exit;
	// let it finish first, so the record is not written after Stop.
	r.mu.Lock()
	c, ok := r.children[id]
	r.mu.Unlock()
	if ok && c.pid == rec.PID {
		t := r.clk.NewTimer(r.killTO)
		select {
		case <-c.reaped:
		case <-t.Chan():
		}
		t.Stop()
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	unlock, err := r.lockDir()
	if err != nil {
		return err
	}
	defer unlock()
	// Start may have replaced an exited engine meanwhile; remove only ours.
	if cur, err := r.readRecord(id); err == nil && cur.PID == rec.PID && cur.StartTicks == rec.StartTicks {
		if err := os.Remove(r.recordPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("process runtime: %w", err)
		}
		if c, ok := r.children[id]; ok && c.pid == rec.PID {
			delete(r.children, id)
		}
	}
	return nil
}

// members lists what is left of the engine: the leader while it is the
// same process, and any other live process of its group born after it.
//
// The kernel does not hand out a number while it is still in use as a pid
// or a process group ID. So if another process now has the leader's pid,
// the engine's group is empty and gone. If nobody has it, the group may
// still hold workers whose leader died; those are found by group ID, and
// the start-time bound keeps out older processes. (One case stays open: a
// stranger recycled the pid after the group emptied, formed a group of its
// own, and died leaving children. It would take a pid wrap-around within
// one Stop; cgroups would close it, at the cost of privileges.)
func (r *Runtime) members(rec record) []int {
	if rec.BootID != "" && r.boot != "" && rec.BootID != r.boot {
		return nil
	}
	if st, err := readStat(r.proc, rec.PID); err == nil && st.startTime != rec.StartTicks {
		return nil
	}
	pids, err := groupMembers(r.proc, rec.PGID, rec.StartTicks)
	if err != nil {
		return nil
	}
	return pids
}

// signal sends sig to the engine's process group if anything of it is left
// and reports whether it did. The group ID cannot be recycled while any
// member lives, and members() checked start times, so the signal only
// reaches the engine's processes.
func (r *Runtime) signal(rec record, sig syscall.Signal) bool {
	if len(r.members(rec)) == 0 {
		return false
	}
	err := syscall.Kill(-rec.PGID, sig)
	return err == nil
}

// waitGone polls until the group is empty, d passes or ctx ends.
func (r *Runtime) waitGone(ctx context.Context, rec record, d time.Duration) bool {
	deadline := r.clk.NewTimer(d)
	defer deadline.Stop()
	tick := r.clk.NewTicker(r.poll)
	defer tick.Stop()
	for {
		if len(r.members(rec)) == 0 {
			return true
		}
		select {
		case <-tick.Chan():
		case <-deadline.Chan():
			return len(r.members(rec)) == 0
		case <-ctx.Done():
			return len(r.members(rec)) == 0
		}
	}
}
