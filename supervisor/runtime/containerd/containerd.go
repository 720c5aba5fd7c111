// Package containerd runs engines as containerd containers. It is the only
// llmgw package that imports containerd.
//
// An engine is one container with one task:
//   - host networking (and the host's /etc/hosts and resolv.conf), so the
//     engine's port is the node's port and NCCL sees the real interfaces;
//   - the spec's Command as the whole argv (it replaces the image's
//     entrypoint and cmd), the image's environment plus the spec's;
//   - a large /dev/shm, which PyTorch's data loaders and NCCL need;
//   - the weights cache bind-mounted read-write at the same path;
//   - GPUs injected through CDI as nvidia.com/gpu=<uuid>, from the specs
//     nvidia-ctk writes to /etc/cdi or /var/run/cdi;
//   - stdout and stderr appended to spec.LogPath by containerd's shim, so
//     logging goes on while the agent is down;
//   - llmgw's labels, by which a restarted agent finds what an earlier one
//     started (see runtime.EngineSpec.Labels).
//
// Containers and tasks live in the daemon, not in the agent: after an agent
// restart the runtime reattaches with LoadContainer and Task(ctx, nil) (a nil
// attach, because the task's output goes to a file, not to FIFOs the agent
// would have to read).
//
// The client is verified against Debian's containerd 1.6.20 with runc 1.1.5
// and uses only services that daemon has.
package containerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/supervisor/runtime"
)

// Name is what Runtime.Name returns.
const Name = "containerd"

// Defaults for the options.
const (
	DefaultSocket      = "/run/containerd/containerd.sock"
	DefaultNamespace   = "llmgw"
	DefaultSnapshotter = "overlayfs"
	// DefaultShmSize is the /dev/shm of each engine. It is a tmpfs limit,
	// not a reservation: memory is used only as engines write to it.
	DefaultShmSize = 16 << 30
)

// Runtime is the containerd runtime. Create it with New, Close it when done.
type Runtime struct {
	c            *client.Client
	socket       string
	ns           string
	snapshotter  string
	shmSize      int64
	cdiDirs      []string
	log          *slog.Logger
	clk          clock.Clock
	progressTick time.Duration
	pollTick     time.Duration
	killTimeout  time.Duration
}

var (
	_ runtime.Runtime     = (*Runtime)(nil)
	_ runtime.ImagePuller = (*Runtime)(nil)
)

type options struct {
	socket       string
	ns           string
	snapshotter  string
	shmSize      int64
	cdiDirs      []string
	log          *slog.Logger
	clk          clock.Clock
	progressTick time.Duration
	dialTimeout  time.Duration
}

// Option configures New.
type Option func(*options)

// WithSocket is the daemon's gRPC socket (default DefaultSocket).
func WithSocket(path string) Option { return func(o *options) { o.socket = path } }

// WithNamespace is the containerd namespace llmgw's containers and images
// live in (default "llmgw"), which keeps them apart from Docker's ("moby")
// and Kubernetes' ("k8s.io").
func WithNamespace(ns string) Option { return func(o *options) { o.ns = ns } }

// WithSnapshotter names the snapshotter images are unpacked into and
// containers' root file systems are made by (default overlayfs).
func WithSnapshotter(name string) Option { return func(o *options) { o.snapshotter = name } }

// WithShmSize sets each engine's /dev/shm size in bytes (default 16 GiB).
func WithShmSize(bytes int64) Option { return func(o *options) { o.shmSize = bytes } }

// WithCDISpecDirs sets where CDI specs are read (default /etc/cdi and
// /var/run/cdi, where nvidia-ctk writes them).
func WithCDISpecDirs(dirs ...string) Option {
	return func(o *options) { o.cdiDirs = append([]string(nil), dirs...) }
}

// WithLogger receives image pull progress and cleanup warnings (default:
// discarded).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithClock sets the clock that stamps a start whose state could not be
// read back, times the pull progress reports and the waits of Stop (the
// grace period, the bound after SIGKILL). Default: the real clock.
func WithClock(c clock.Clock) Option { return func(o *options) { o.clk = c } }

// WithProgressInterval sets how often EnsureImage logs pull progress
// (default 5s).
func WithProgressInterval(d time.Duration) Option { return func(o *options) { o.progressTick = d } }

// New makes a client for the daemon. The connection is lazy: New succeeds
// while the daemon is down; call Ping to find out.
func New(opts ...Option) (*Runtime, error) {
	o := options{
		socket:       DefaultSocket,
		ns:           DefaultNamespace,
		snapshotter:  DefaultSnapshotter,
		shmSize:      DefaultShmSize,
		cdiDirs:      append([]string(nil), cdi.DefaultSpecDirs...),
		log:          slog.New(slog.DiscardHandler),
		clk:          clock.Real(),
		progressTick: 5 * time.Second,
		dialTimeout:  10 * time.Second,
	}
	for _, f := range opts {
		f(&o)
	}
	if o.ns == "" {
		return nil, errors.New("containerd runtime: empty namespace")
	}
	if o.shmSize < 1<<20 {
		return nil, fmt.Errorf("containerd runtime: /dev/shm size %d bytes is under 1 MiB", o.shmSize)
	}
	c, err := client.New(o.socket, client.WithDefaultNamespace(o.ns), client.WithTimeout(o.dialTimeout))
	if err != nil {
		return nil, fmt.Errorf("containerd runtime: client for %s: %w", o.socket, err)
	}
	return &Runtime{
		c: c, socket: o.socket, ns: o.ns, snapshotter: o.snapshotter, shmSize: o.shmSize,
		cdiDirs: o.cdiDirs, log: o.log, clk: o.clk, progressTick: o.progressTick,
		pollTick: 50 * time.Millisecond, killTimeout: 10 * time.Second,
	}, nil
}

// Close closes the client connection. Engines keep running.
func (r *Runtime) Close() error { return r.c.Close() }

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return Name }

// Client is the underlying containerd client, for tools and tests that need
// more than the runtime offers. Its default namespace is the runtime's.
func (r *Runtime) Client() *client.Client { return r.c }

// Ping asks the daemon for its version. Without a deadline on ctx it waits
// at most 5 seconds: gRPC would otherwise keep trying to connect.
func (r *Runtime) Ping(ctx context.Context) error {
	// A missing socket is the common case (no daemon installed); say so at
	// once instead of letting gRPC retry until the deadline.
	if _, err := os.Stat(r.socket); err != nil {
		return fmt.Errorf("containerd runtime: no daemon at %s: %w", r.socket, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	v, err := r.c.Version(r.nsCtx(ctx))
	if err != nil {
		return fmt.Errorf("containerd runtime: no daemon answers at %s: %w", r.socket, err)
	}
	r.log.Debug("containerd answers", "socket", r.socket, "version", v.Version)
	return nil
}

// nsCtx puts the runtime's namespace on ctx (the client's default applies
// only where a call does not find one there).
func (r *Runtime) nsCtx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, r.ns)
}
