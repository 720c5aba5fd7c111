package host

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
)

// stampTime is the fixtures' moment: nvidia-smi.txt was taken at 22:53:56.
var stampTime = time.Date(2026, 11, 29, 22, 53, 56, 0, time.UTC)

// result is what fakeRunner answers for one command line.
type result struct {
	out  string
	err  error
	hang bool // block until the context ends, then return out and its error
	// started, if set, is closed when a hanging command starts.
	started chan struct{}
}

// fakeRunner answers fixed command lines. Any other line fails the test:
// the tools must run exactly the commands they document.
type fakeRunner struct {
	t       *testing.T
	mu      sync.Mutex
	results map[string]result
	missing map[string]bool
	calls   []string
}

func newFakeRunner(t *testing.T, results map[string]result) *fakeRunner {
	return &fakeRunner{t: t, results: results, missing: map[string]bool{}}
}

func (f *fakeRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	line := strings.Join(append([]string{name}, args...), " ")
	f.mu.Lock()
	f.calls = append(f.calls, line)
	r, ok := f.results[line]
	f.mu.Unlock()
	if !ok {
		f.t.Errorf("unexpected command %q", line)
		return nil, errors.New("unexpected command")
	}
	if r.hang {
		if r.started != nil {
			close(r.started)
		}
		<-ctx.Done()
		return []byte(r.out), ctx.Err()
	}
	return []byte(r.out), r.err
}

func (f *fakeRunner) LookPath(name string) (string, error) {
	if f.missing[name] {
		return "", fmt.Errorf("exec: %q: executable file not found in $PATH", name)
	}
	return "/usr/bin/" + name, nil
}

func (f *fakeRunner) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// exitError returns a real *exec.ExitError with the given status.
func exitError(t *testing.T, status int) error {
	t.Helper()
	err := exec.Command("sh", "-c", fmt.Sprintf("exit %d", status)).Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("no exit error from sh: %v", err)
	}
	return err
}

func fixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../testdata/h200/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func tool(t *testing.T, cfg Config, name string) Tool {
	t.Helper()
	for _, tl := range Tools(cfg) {
		if tl.Name == name {
			return tl
		}
	}
	t.Fatalf("no tool %q", name)
	return Tool{}
}

func call(t *testing.T, cfg Config, name string, a Args) string {
	t.Helper()
	out, err := tool(t, cfg, name).Run(context.Background(), a)
	if err != nil {
		t.Fatalf("%s(%+v): %v", name, a, err)
	}
	return out
}

func TestToolsRegistry(t *testing.T) {
	tools := Tools(Config{Host: "n1", Runner: newFakeRunner(t, nil), Root: fstest.MapFS{}})
	want := []string{"meminfo", "gpu", "processes", "network", "rdma_counters", "pci", "usb", "systemd_units", "containers",
		"list_logs", "read_log", "engine_stacks", "memory_accounting", "driver_faults"}
	var got []string
	for _, tl := range tools {
		got = append(got, tl.Name)
		if tl.Description == "" || tl.Run == nil {
			t.Errorf("%s: no description or Run", tl.Name)
		}
		for _, p := range tl.Params {
			if !slices.Contains([]string{"view", "name", "filter", "lines", "device", "rounds", "gap_s"}, p.Name) || p.Description == "" {
				t.Errorf("%s: param %+v is not an Args field or undocumented", tl.Name, p)
			}
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("tools = %v, want %v", got, want)
	}
}

// A tool refuses arguments it does not take, before running anything.
func TestToolsRefuseUnknownArgs(t *testing.T) {
	fr := newFakeRunner(t, nil)
	cfg := Config{Host: "n1", Runner: fr}
	for name, a := range map[string]Args{
		"pci":       {View: "x"},
		"gpu":       {Device: "mlx5_0"},
		"read_log":  {View: "default", Name: "a.log"},
		"processes": {Lines: 3},
	} {
		_, err := tool(t, cfg, name).Run(context.Background(), a)
		if !errors.Is(err, ErrBadArgs) {
			t.Errorf("%s(%+v): err = %v", name, a, err)
		}
	}
	if len(fr.Calls()) != 0 {
		t.Errorf("commands ran: %v", fr.Calls())
	}
}

// The nvidia-smi views, answered with the H200's real output.
func TestGPUViewsH200(t *testing.T) {
	topo := strings.Split(fixture(t, "topo-clocks.txt"), "----\n")
	views := map[string]struct{ line, out string }{
		"":        {"nvidia-smi", fixture(t, "nvidia-smi.txt")},
		"default": {"nvidia-smi", fixture(t, "nvidia-smi.txt")},
		"query": {"nvidia-smi --query-gpu=index,uuid,name,utilization.gpu,clocks.sm,temperature.gpu,power.draw," +
			"memory.total,memory.used,memory.free,pci.bus_id,mig.mode.current --format=csv", fixture(t, "query-gpu.csv")},
		"apps":   {"nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv", fixture(t, "query-apps.csv")},
		"topo":   {"nvidia-smi topo -m", topo[0]},
		"clocks": {"nvidia-smi -q -d CLOCK,PERFORMANCE", topo[1]},
	}
	results := map[string]result{}
	for _, v := range views {
		results[v.line] = result{out: v.out}
	}
	cfg := Config{Host: "h200-a", Runner: newFakeRunner(t, results), Clock: clock.NewFake(stampTime)}
	for view, v := range views {
		got := call(t, cfg, "gpu", Args{View: view})
		want := "[h200-a 2026-11-29T22:53:56Z] " + v.line + "\n" + v.out
		if !strings.HasSuffix(v.out, "\n") {
			want += "\n"
		}
		if got != want {
			t.Errorf("view %q:\n got %q\nwant %q", view, got, want)
		}
	}
	if !strings.Contains(call(t, cfg, "gpu", Args{View: "apps"}), "448, python3, 21482 MiB") {
		t.Error("apps view lost the process line")
	}

	_, err := tool(t, cfg, "gpu").Run(context.Background(), Args{View: "nvlink; rm -rf /"})
	if !errors.Is(err, ErrBadArgs) || !strings.Contains(err.Error(), "valid views: default, query, apps, topo, clocks") {
		t.Errorf("unknown view: %v", err)
	}
}

func TestMissingTool(t *testing.T) {
	fr := newFakeRunner(t, nil)
	fr.missing["nvidia-smi"] = true
	out := call(t, Config{Host: "cpu-node-3", Runner: fr, Clock: clock.NewFake(stampTime)}, "gpu", Args{})
	if !strings.Contains(out, "(nvidia-smi is not installed on cpu-node-3:") {
		t.Errorf("out = %q", out)
	}
	if len(fr.Calls()) != 0 {
		t.Errorf("ran %v", fr.Calls())
	}
}

// On this machine, with the real runner: a tool that is not installed says
// so and names the host.
func TestMissingToolHere(t *testing.T) {
	for _, name := range []string{"lspci", "lsusb"} {
		if _, err := exec.LookPath(name); err == nil {
			continue
		}
		tl := map[string]string{"lspci": "pci", "lsusb": "usb"}[name]
		out := call(t, Config{Host: "this-host"}, tl, Args{})
		if !strings.Contains(out, "("+name+" is not installed on this-host:") {
			t.Errorf("%s: %q", tl, out)
		}
	}
}

// The command's timeout runs on the configured clock: the command is
// stopped when the clock passes it, not before.
func TestCommandTimeout(t *testing.T) {
	started := make(chan struct{})
	fr := newFakeRunner(t, map[string]result{"lspci -nnk": {out: "00:00.0 Host bridge", hang: true, started: started}})
	clk := clock.NewFake(stampTime)
	cfg := Config{Host: "n1", Runner: fr, Clock: clk, Timeout: 20 * time.Millisecond}
	done := make(chan string)
	go func() {
		out, err := tool(t, cfg, "pci").Run(context.Background(), Args{})
		if err != nil {
			t.Errorf("pci: %v", err)
		}
		done <- out
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clk.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("the command's timeout never armed: %v", err)
	}
	clk.Advance(19 * time.Millisecond)
	select {
	case out := <-done:
		t.Fatalf("stopped before its timeout: %q", out)
	default:
	}
	clk.Advance(time.Millisecond)
	out := <-done
	want := "00:00.0 Host bridge\n(lspci -nnk did not finish within 20ms and was stopped; above is what it printed until then)\n"
	if !strings.HasSuffix(out, want) {
		t.Errorf("out = %q", out)
	}
}

// The default Sleep (engine_stacks' gap between rounds, the interconnect
// read's gap) waits on the configured clock, and ends early with the
// caller's context.
func TestDefaultSleepWaitsOnTheClock(t *testing.T) {
	clk := clock.NewFake(stampTime)
	sleep := Config{Clock: clk}.withDefaults().Sleep
	done := make(chan error, 1)
	go func() { done <- sleep(context.Background(), time.Minute) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clk.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("the sleep never waited on the clock: %v", err)
	}
	clk.Advance(time.Minute)
	if err := <-done; err != nil {
		t.Errorf("a full sleep: %v", err)
	}
	gone, stop := context.WithCancel(context.Background())
	stop()
	if err := sleep(gone, time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled sleep: %v", err)
	}
}

// A cancelled call is an error, not a note about the host.
func TestCommandCancelled(t *testing.T) {
	started := make(chan struct{})
	fr := newFakeRunner(t, map[string]result{"lsusb -t": {hang: true, started: started}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := tool(t, Config{Host: "n1", Runner: fr}, "usb").Run(ctx, Args{})
		done <- err
	}()
	<-started
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v", err)
	}
}

func TestCommandExitStatus(t *testing.T) {
	fr := newFakeRunner(t, map[string]result{
		"ps -eww -o pid,ppid,rss,pcpu,etime,nlwp,comm,args --sort=-rss": {out: "error: unsupported option\n", err: exitError(t, 3)},
	})
	out := call(t, Config{Host: "n1", Runner: fr}, "processes", Args{})
	if !strings.HasSuffix(out, "error: unsupported option\n(ps -eww -o pid,ppid,rss,pcpu,etime,nlwp,comm,args --sort=-rss exited with status 3)\n") {
		t.Errorf("out = %q", out)
	}
}

func TestOutputCap(t *testing.T) {
	var b strings.Builder
	for i := 0; b.Len() < 200<<10; i++ {
		fmt.Fprintf(&b, "line %06d ü\n", i)
	}
	big := b.String()
	fr := newFakeRunner(t, map[string]result{"lspci -nnk": {out: big}})
	out := call(t, Config{Host: "n1", Runner: fr}, "pci", Args{})
	header, body, _ := strings.Cut(out, "\n")
	if !strings.HasPrefix(header, "[n1 ") {
		t.Errorf("header = %q", header)
	}
	if len(body) > DefaultMaxOutput+200 {
		t.Errorf("body is %d bytes", len(body))
	}
	kept, note, ok := strings.Cut(body, "\n[output cut: showing the first ")
	if !ok || !strings.HasPrefix(big, kept) || !strings.HasSuffix(kept, "\n") {
		t.Fatalf("cut badly: note %q", note)
	}
	if !strings.Contains(note, fmt.Sprintf("of %d bytes; %d bytes left out]", len(big), len(big)-len(kept))) {
		t.Errorf("note = %q", note)
	}

	tail := capTail(big, 1000)
	if !strings.HasPrefix(tail, "[output cut: showing the last ") || !strings.HasSuffix(tail, big[len(big)-500:]) {
		t.Errorf("capTail = %q", tail[:100])
	}
	if capHead("short", 10) != "short" || capTail("short", 10) != "short" {
		t.Error("short text changed")
	}
}

func TestMeminfo(t *testing.T) {
	root := fstest.MapFS{"proc/meminfo": {Data: []byte("MemTotal:       2113929216 kB\n")}}
	out := call(t, Config{Host: "n1", Root: root, Clock: clock.NewFake(stampTime)}, "meminfo", Args{})
	if out != "[n1 2026-11-29T22:53:56Z] /proc/meminfo\nMemTotal:       2113929216 kB\n" {
		t.Errorf("out = %q", out)
	}
	// This machine's.
	if out := call(t, Config{Host: "here"}, "meminfo", Args{}); !strings.Contains(out, "MemTotal:") {
		t.Errorf("real meminfo = %q", out)
	}
	if out := call(t, Config{Host: "n1", Root: fstest.MapFS{}}, "meminfo", Args{}); !strings.Contains(out, "unreadable on n1") {
		t.Errorf("missing meminfo = %q", out)
	}
}

// processes and network with the real runner, where the tools exist.
func TestProcessesAndNetworkHere(t *testing.T) {
	if _, err := exec.LookPath("ps"); err == nil {
		out := call(t, Config{Host: "here"}, "processes", Args{})
		if !strings.Contains(out, "PID") || !strings.Contains(out, "COMMAND") {
			t.Errorf("processes = %.300q", out)
		}
	}
	if _, err := exec.LookPath("ip"); err == nil {
		out := call(t, Config{Host: "here"}, "network", Args{})
		for _, want := range []string{"$ ip addr show\n", "$ ip -s link show\n", "$ rdma link show\n", "lo"} {
			if !strings.Contains(out, want) {
				t.Errorf("network lacks %q: %.500q", want, out)
			}
		}
	}
}

func TestNetworkFake(t *testing.T) {
	fr := newFakeRunner(t, map[string]result{
		"ip addr show":    {out: "1: lo: <LOOPBACK,UP>\n"},
		"ip -s link show": {out: "1: lo: <LOOPBACK,UP>\n    RX: bytes\n"},
	})
	fr.missing["rdma"] = true
	out := call(t, Config{Host: "n1", Runner: fr, Clock: clock.NewFake(stampTime)}, "network", Args{})
	want := "[n1 2026-11-29T22:53:56Z] ip addr show; ip -s link show; rdma link show\n" +
		"$ ip addr show\n1: lo: <LOOPBACK,UP>\n" +
		"$ ip -s link show\n1: lo: <LOOPBACK,UP>\n    RX: bytes\n" +
		"$ rdma link show\n(rdma is not installed on n1: exec: \"rdma\": executable file not found in $PATH)\n"
	if out != want {
		t.Errorf("out =\n%s\nwant\n%s", out, want)
	}
}

func TestRDMACounters(t *testing.T) {
	root := fstest.MapFS{
		"sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_data":            {Data: []byte("123456\n")},
		"sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data":           {Data: []byte("654321\n")},
		"sys/class/infiniband/mlx5_0/ports/1/hw_counters/out_of_buffer":         {Data: []byte("0\n")},
		"sys/class/infiniband/mlx5_1/ports/1/counters/port_rcv_data":            {Data: []byte("7\n")},
		"sys/class/infiniband/mlx5_1/ports/1/counters/symbol_error":             {Data: []byte("2\n")},
		"sys/class/infiniband/mlx5_1/ports/1/hw_counters/np_cnp_sent":           {Data: []byte("99\n")},
		"sys/class/infiniband/mlx5_1/ports/1/hw_counters/rp_cnp_handled":        {Data: []byte("98\n")},
		"sys/class/infiniband/mlx5_1/ports/1/hw_counters/roce_adp_retrans":      {Data: []byte("0\n")},
		"sys/class/infiniband/mlx5_1/ports/1/hw_counters/resp_local_length_err": {Data: []byte("0\n")},
	}
	cfg := Config{Host: "n1", Root: root, Clock: clock.NewFake(stampTime)}
	out := call(t, cfg, "rdma_counters", Args{})
	for _, want := range []string{
		"# mlx5_0 port 1 counters\nport_rcv_data = 123456\nport_xmit_data = 654321\n",
		"# mlx5_0 port 1 hw_counters\nout_of_buffer = 0\n",
		"# mlx5_1 port 1 counters\nport_rcv_data = 7\nsymbol_error = 2\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	out = call(t, cfg, "rdma_counters", Args{Device: "mlx5_1"})
	if strings.Contains(out, "mlx5_0") || !strings.Contains(out, "np_cnp_sent = 99") {
		t.Errorf("device filter: %s", out)
	}
	_, err := tool(t, cfg, "rdma_counters").Run(context.Background(), Args{Device: "../../../etc"})
	if !errors.Is(err, ErrBadArgs) || !strings.Contains(err.Error(), "devices: mlx5_0, mlx5_1") {
		t.Errorf("bad device: %v", err)
	}
	out = call(t, Config{Host: "n1", Root: fstest.MapFS{}}, "rdma_counters", Args{})
	if !strings.Contains(out, "(no RDMA devices on n1:") {
		t.Errorf("no devices: %q", out)
	}
}

func TestContainers(t *testing.T) {
	cfg := Config{Host: "n1", Clock: clock.NewFake(stampTime)}
	if out := call(t, cfg, "containers", Args{}); !strings.Contains(out, "no container runtime is configured on n1") {
		t.Errorf("nil callback: %q", out)
	}
	cfg.Containers = func(context.Context) (string, error) {
		return "llmgw-shard-a  running  vllm/vllm-openai:v0.11.0\n", nil
	}
	if out := call(t, cfg, "containers", Args{}); out != "[n1 2026-11-29T22:53:56Z] container runtime\nllmgw-shard-a  running  vllm/vllm-openai:v0.11.0\n" {
		t.Errorf("out = %q", out)
	}
	cfg.Containers = func(context.Context) (string, error) { return "", errors.New("containerd socket: permission denied") }
	if out := call(t, cfg, "containers", Args{}); !strings.Contains(out, "listing containers on n1 failed: containerd socket: permission denied") {
		t.Errorf("failing callback: %q", out)
	}
}

// The real runner kills the whole process group on timeout, so a command
// whose children hold the output pipe still returns promptly.
func TestExecRunnerTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	out, err := ExecRunner{}.Run(ctx, "sh", "-c", "echo started; sleep 30 & sleep 30; wait")
	if err == nil || time.Since(start) > 10*time.Second {
		t.Errorf("err = %v after %s", err, time.Since(start))
	}
	if string(out) != "started\n" {
		t.Errorf("out = %q", out)
	}
	out, err = ExecRunner{}.Run(context.Background(), "sh", "-c", "echo out; echo err >&2; exit 4")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 4 || string(out) != "out\nerr\n" {
		t.Errorf("out = %q, err = %v", out, err)
	}
}
