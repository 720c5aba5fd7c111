package containerd

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/llmgw/llmgw/supervisor/runtime"
)

func TestContainerID(t *testing.T) {
	for _, id := range []string{"llama-0-abc123def456", "a", "x.y_z-1"} {
		got, err := ContainerID(id)
		if err != nil || got != id {
			t.Errorf("ContainerID(%q) = %q, %v; want it unchanged", id, got, err)
		}
	}
	long := strings.Repeat("d", 60) + "-999-s12-abc123def456"
	got, err := ContainerID(long)
	if err != nil || len(got) > maxIdentifier || !identifier.MatchString(got) {
		t.Fatalf("ContainerID(long) = %q (%d chars), %v", got, len(got), err)
	}
	if again, _ := ContainerID(long); again != got {
		t.Fatal("ContainerID is not deterministic")
	}
	other, _ := ContainerID(long[:len(long)-1] + "7")
	if other == got {
		t.Fatal("two long IDs share a container ID")
	}
	// A cut that lands on a separator must not leave two in a row.
	sep := strings.Repeat("a", maxIdentifier-14) + "-" + strings.Repeat("b", 20)
	if got, err := ContainerID(sep); err != nil || !identifier.MatchString(got) {
		t.Fatalf("ContainerID(cut at '-') = %q, %v", got, err)
	}
	for _, bad := range []string{"", "a/b", "a..b", "-a", "a-", "a b"} {
		if _, err := ContainerID(bad); err == nil {
			t.Errorf("ContainerID(%q) succeeded", bad)
		}
	}
}

func TestNormalizeRef(t *testing.T) {
	for in, want := range map[string]string{
		"vllm/vllm-openai":                       "docker.io/vllm/vllm-openai:latest",
		"vllm/vllm-openai:v0.11.0":               "docker.io/vllm/vllm-openai:v0.11.0",
		"ubuntu":                                 "docker.io/library/ubuntu:latest",
		"ghcr.io/ggml-org/llama.cpp:server-cuda": "ghcr.io/ggml-org/llama.cpp:server-cuda",
		"registry.local:5000/team/engine@sha256:" + strings.Repeat("a", 64): "registry.local:5000/team/engine@sha256:" + strings.Repeat("a", 64),
	} {
		got, err := normalizeRef(in)
		if err != nil || got != want {
			t.Errorf("normalizeRef(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := normalizeRef("has space"); err == nil {
		t.Error("normalizeRef accepted an invalid reference")
	}
}

// newOffline is a runtime whose daemon is never reached: New is lazy.
func newOffline(t *testing.T, opts ...Option) *Runtime {
	t.Helper()
	r, err := New(append([]Option{WithSocket(filepath.Join(t.TempDir(), "none.sock"))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestGPUsWithoutCDISpecNameTheFix(t *testing.T) {
	r := newOffline(t, WithCDISpecDirs(t.TempDir()))
	spec := runtime.EngineSpec{
		ID: "g-0-v1", Image: "x", Command: []string{"x"}, LogPath: "/tmp/x.log",
		GPUUUIDs: []string{"GPU-0b3f"},
	}
	_, err := r.Start(context.Background(), spec)
	if err == nil || !strings.Contains(err.Error(), CDIGenerateCommand) || !strings.Contains(err.Error(), "GPU-0b3f") {
		t.Fatalf("Start = %v, want an error naming %q and the GPU", err, CDIGenerateCommand)
	}
}

// fakeCDISpec writes a CDI spec like nvidia-ctk's, with an environment edit
// in place of device nodes (those must exist on the host to be injected).
func fakeCDISpec(t *testing.T, dir string, uuids ...string) {
	t.Helper()
	var devs []string
	for _, u := range uuids {
		devs = append(devs, `{"name":"`+u+`","containerEdits":{"env":["FAKE_GPU_`+strings.ReplaceAll(u, "-", "_")+`=1"]}}`)
	}
	spec := `{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[` + strings.Join(devs, ",") + `],"containerEdits":{"env":["NVIDIA_CTK_SPEC=1"]}}`
	if err := os.WriteFile(filepath.Join(dir, "nvidia.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestGPUsInjectedThroughCDI(t *testing.T) {
	dir := t.TempDir()
	fakeCDISpec(t, dir, "GPU-aaa", "GPU-bbb", "0", "1")
	r := newOffline(t, WithCDISpecDirs(dir))
	opt, err := r.gpuSpecOpt([]string{"GPU-bbb"})
	if err != nil {
		t.Fatal(err)
	}
	s := &oci.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}}
	if err := opt(context.Background(), nil, nil, s); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(s.Process.Env, "FAKE_GPU_GPU_bbb=1") || !slices.Contains(s.Process.Env, "NVIDIA_CTK_SPEC=1") || slices.Contains(s.Process.Env, "FAKE_GPU_GPU_aaa=1") {
		t.Fatalf("env after injection: %v", s.Process.Env)
	}

	_, err = r.gpuSpecOpt([]string{"GPU-aaa", "GPU-ccc"})
	if err == nil || !strings.Contains(err.Error(), "nvidia.com/gpu=GPU-ccc") || !strings.Contains(err.Error(), "device-name-strategy") {
		t.Fatalf("missing UUID: %v", err)
	}
	if opt, err := r.gpuSpecOpt(nil); opt != nil || err != nil {
		t.Fatalf("no GPUs: %v, %v", opt, err)
	}
}

func TestStartRejectsBadSpecsBeforeTheDaemon(t *testing.T) {
	r := newOffline(t)
	good := runtime.EngineSpec{ID: "a-0-v1", Image: "x", Command: []string{"x"}, LogPath: "/tmp/a.log"}
	for name, mutate := range map[string]func(*runtime.EngineSpec){
		"bad id":           func(s *runtime.EngineSpec) { s.ID = "a/b" },
		"no image":         func(s *runtime.EngineSpec) { s.Image = "" },
		"no command":       func(s *runtime.EngineSpec) { s.Command = nil },
		"relative log":     func(s *runtime.EngineSpec) { s.LogPath = "a.log" },
		"relative weights": func(s *runtime.EngineSpec) { s.WeightsDir = "weights" },
	} {
		s := good
		mutate(&s)
		if _, err := r.Start(context.Background(), s); err == nil {
			t.Errorf("%s: Start succeeded", name)
		}
	}
	if _, err := r.Status(context.Background(), "a/b"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Status(a/b) = %v, want ErrNotFound", err)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := New(WithNamespace("")); err == nil {
		t.Error("empty namespace accepted")
	}
	if _, err := New(WithShmSize(1024)); err == nil {
		t.Error("1 KiB /dev/shm accepted")
	}
}

func TestDaemonLimits(t *testing.T) {
	limits := `Limit                     Soft Limit           Hard Limit           Units
Max open files            20000                20000                files
Max locked memory         8388608              8388608              bytes
`
	// A daemon without CAP_SYS_RESOURCE: the wanted limits are cut.
	d := parseDaemonLimits("Name:\tcontainerd\nCapEff:\t000001fffeffffff\n", limits)
	if !d.known || d.canRaise {
		t.Fatalf("parsed %+v", d)
	}
	got := d.rlimits()
	if got[0] != (specs.POSIXRlimit{Type: "RLIMIT_MEMLOCK", Hard: 8388608, Soft: 8388608}) ||
		got[1] != (specs.POSIXRlimit{Type: "RLIMIT_NOFILE", Hard: 20000, Soft: 20000}) {
		t.Fatalf("cut limits %+v", got)
	}
	// Full root: the wanted limits stand.
	d = parseDaemonLimits("CapEff:\t000001ffffffffff\n", limits)
	if !d.canRaise || !slices.Equal(d.rlimits(), wantRlimits) {
		t.Fatalf("root daemon: %+v -> %+v", d, d.rlimits())
	}
	// Unknown daemon: wanted limits.
	if !slices.Equal((daemonLimits{}).rlimits(), wantRlimits) {
		t.Fatal("unknown daemon limits changed the wanted ones")
	}
	// withRlimits replaces containerd's default open-file limit.
	s := &oci.Spec{Process: &specs.Process{Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}}}}
	if err := withRlimits(wantRlimits)(context.Background(), nil, nil, s); err != nil {
		t.Fatal(err)
	}
	if len(s.Process.Rlimits) != 2 || !slices.Contains(s.Process.Rlimits, wantRlimits[1]) {
		t.Fatalf("rlimits %+v", s.Process.Rlimits)
	}
}

// A gang member on a node with RDMA devices gets the device nodes and
// CAP_IPC_LOCK (and, as every engine, an unlimited memlock); a
// single-node engine, and a gang member on a node without RDMA devices,
// get neither.
func TestGangOnRDMANodeGetsTheFabric(t *testing.T) {
	// /dev/null stands for /dev/infiniband: a device node every host has
	// (WithDevices takes one device as it takes a directory of them).
	const devDir = "/dev/null"
	apply := func(spec runtime.EngineSpec) *oci.Spec {
		t.Helper()
		s := &oci.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}, Linux: &specs.Linux{Resources: &specs.LinuxResources{}}}
		opts := append(fabricSpecOpts(spec, devDir, slog.New(slog.DiscardHandler)), withRlimits(daemonLimits{}.rlimits()))
		for _, o := range opts {
			if err := o(context.Background(), nil, nil, s); err != nil {
				t.Fatal(err)
			}
		}
		return s
	}
	hasFabric := func(s *oci.Spec) (dev, ipcLock bool) {
		dev = slices.ContainsFunc(s.Linux.Devices, func(d specs.LinuxDevice) bool { return d.Path == devDir })
		ipcLock = slices.Contains(s.Process.Capabilities.Effective, "CAP_IPC_LOCK") && slices.Contains(s.Process.Capabilities.Bounding, "CAP_IPC_LOCK")
		return dev, ipcLock
	}
	base := runtime.EngineSpec{ID: "g-0-v1", Image: "x", Command: []string{"x"}, LogPath: "/tmp/g.log"}
	member := base
	member.Gang, member.RDMADevices = true, []string{"mlx5_0"}
	s := apply(member)
	if dev, lock := hasFabric(s); !dev || !lock {
		t.Fatalf("gang member on an RDMA node: device %v, CAP_IPC_LOCK %v; devices %+v caps %+v", dev, lock, s.Linux.Devices, s.Process.Capabilities)
	}
	if !slices.ContainsFunc(s.Process.Rlimits, func(l specs.POSIXRlimit) bool { return l.Type == "RLIMIT_MEMLOCK" && l.Hard == ^uint64(0) }) {
		t.Fatalf("memlock not unlimited: %+v", s.Process.Rlimits)
	}
	noRDMA := base
	noRDMA.Gang = true
	single := base
	single.RDMADevices = []string{"mlx5_0"}
	for name, spec := range map[string]runtime.EngineSpec{"gang without RDMA": noRDMA, "single node": single} {
		if dev, lock := hasFabric(apply(spec)); dev || lock {
			t.Errorf("%s: device %v, CAP_IPC_LOCK %v; want neither", name, dev, lock)
		}
	}
	// Device nodes missing: the capability still, no device.
	missing := member
	s = &oci.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}, Linux: &specs.Linux{Resources: &specs.LinuxResources{}}}
	for _, o := range fabricSpecOpts(missing, filepath.Join(t.TempDir(), "infiniband"), slog.New(slog.DiscardHandler)) {
		if err := o(context.Background(), nil, nil, s); err != nil {
			t.Fatalf("missing device dir: %v", err)
		}
	}
}
