package host

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/gpu"
)

func status(name string, rssKB, anonKB, fileKB, shmemKB string) *fstest.MapFile {
	return &fstest.MapFile{Data: []byte("Name:\t" + name + "\nUmask:\t0022\nState:\tS (sleeping)\nPid:\t1\n" +
		"VmRSS:\t" + rssKB + " kB\nRssAnon:\t" + anonKB + " kB\nRssFile:\t" + fileKB + " kB\nRssShmem:\t" + shmemKB + " kB\nThreads:\t4\n")}
}

// The H200 node: pid 448 holds 21482 MiB on the GPU (the fixture's figure)
// and a few GiB of host memory; pid 9999 holds GPU memory but is not in
// this /proc (another PID namespace).
func h200Snapshot() gpu.Snapshot {
	const mib = 1 << 20
	return gpu.Snapshot{
		Available: true,
		Driver:    "580.159.04",
		GPUs: []placement.GPU{{Index: 0, UUID: "GPU-8b38414a-24cf-3fdb-ca7d-672639ff58e5", Name: "NVIDIA H200",
			MemoryTotal: 150754820096, MemoryUsed: 21491 * mib}},
		Processes: []gpu.GPUProcess{
			{PID: 448, GPUIndex: 0, GPUUUID: "GPU-8b38414a-24cf-3fdb-ca7d-672639ff58e5", UsedBytes: 21482 * mib},
		},
	}
}

func TestMemoryAccounting(t *testing.T) {
	meminfo, err := os.ReadFile("testdata/meminfo.txt")
	if err != nil {
		t.Fatal(err)
	}
	root := fstest.MapFS{
		"proc/meminfo":    {Data: meminfo},
		"proc/448/status": status("python3", "4194304", "3145728", "1048576", "0"),
		"proc/12/status":  {Data: []byte("Name:\tkworker/0:1\nState:\tI (idle)\n")}, // kernel thread: no VmRSS
		"proc/77/status":  status("sshd", "8192", "2048", "6144", "0"),
		"proc/self":       {Data: []byte("not a pid dir")},
	}
	snap := h200Snapshot()
	cfg := Config{Host: "h200-a", Root: root, Clock: clock.NewFake(stampTime),
		GPU: func(context.Context) (gpu.Snapshot, error) { return snap, nil }}
	out := call(t, cfg, "memory_accounting", Args{})
	for _, want := range []string{
		"[h200-a 2026-11-29T22:53:56Z] /proc/meminfo + /proc/*/status + NVML\n",
		"  1200.00 GiB  free (MemFree)\n",
		"   320.00 GiB  anonymous",
		"   450.00 GiB  file cache",
		// The parts leave exactly 1 GiB, which is what the fixture was
		// built to leave: the totals close.
		"     1.00 GiB  in none of the above",
		"  2016.00 GiB  = MemTotal\n",
		"     448       4.00 GiB       3.00 GiB       1.00 GiB       0.00 GiB      20.98 GiB  python3\n",
		"      77       0.01 GiB",
		"all 2 processes",
		"  GPU 0 NVIDIA H200 (GPU-8b38414a-24cf-3fdb-ca7d-672639ff58e5)\n",
		"    20.98 GiB  pid 448 python3\n",
		"     0.01 GiB  used but charged to no process",
		"     20.99 GiB  = used\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "kworker") || strings.Contains(out, "negative") {
		t.Errorf("unexpected line in\n%s", out)
	}

	// A GPU process this /proc cannot see is still counted.
	snap.Processes = append(snap.Processes, gpu.GPUProcess{PID: 9999, GPUIndex: 0, UsedBytes: 1 << 30})
	out = call(t, cfg, "memory_accounting", Args{})
	if !strings.Contains(out, "    9999       0.00 GiB       0.00 GiB       0.00 GiB       0.00 GiB       1.00 GiB  (not in this /proc)") ||
		!strings.Contains(out, "all 3 processes") {
		t.Errorf("foreign pid:\n%s", out)
	}
}

func TestMemoryAccountingWithoutGPUs(t *testing.T) {
	root := fstest.MapFS{"proc/meminfo": {Data: []byte("MemTotal: 1024 kB\nMemFree: 512 kB\n")}}
	cases := map[string]func(context.Context) (gpu.Snapshot, error){
		"(no GPU probe is configured)": nil,
		"(no NVIDIA GPUs: the NVML library is not installed)": func(context.Context) (gpu.Snapshot, error) {
			return gpu.Snapshot{}, nil
		},
		"(reading the GPUs failed: nvml: driver not loaded)": func(context.Context) (gpu.Snapshot, error) {
			return gpu.Snapshot{}, errors.New("nvml: driver not loaded")
		},
	}
	for want, fn := range cases {
		out := call(t, Config{Host: "n1", Root: root, GPU: fn}, "memory_accounting", Args{})
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}

// This machine's /proc: the report must come out whole.
func TestMemoryAccountingHere(t *testing.T) {
	out := call(t, Config{Host: "here"}, "memory_accounting", Args{})
	for _, want := range []string{"= MemTotal", "all ", "(no GPU probe is configured)"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%.2000s", want, out)
		}
	}
}
