package host

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/llmgw/llmgw/probes/gpu"
)

// maxProcRows is how many processes memory_accounting lists by name.
const maxProcRows = 25

// parseMeminfo reads /proc/meminfo into bytes per field. HugePages_* are
// page counts, not sizes, and are kept as counts.
func parseMeminfo(b []byte) map[string]uint64 {
	m := make(map[string]uint64)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			v <<= 10
		}
		m[key] = v
	}
	return m
}

// procMem is one process's resident memory from /proc/<pid>/status.
type procMem struct {
	pid                    int
	name                   string
	rss, anon, file, shmem uint64
	gpu                    uint64
	visible                bool // found in /proc
}

func readProcs(ctx context.Context, root fs.FS) ([]procMem, error) {
	entries, err := fs.ReadDir(root, "proc")
	if err != nil {
		return nil, err
	}
	var out []procMem
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := fs.ReadFile(root, "proc/"+e.Name()+"/status")
		if err != nil {
			continue // exited since ReadDir
		}
		st := parseMeminfo(b) // same "Key:\tvalue kB" shape
		p := procMem{pid: pid, rss: st["VmRSS"], anon: st["RssAnon"], file: st["RssFile"], shmem: st["RssShmem"], visible: true}
		if _, hasRSS := st["VmRSS"]; !hasRSS {
			continue // a kernel thread
		}
		for _, line := range strings.SplitN(string(b), "\n", 2)[:1] {
			if n, ok := strings.CutPrefix(line, "Name:"); ok {
				p.name = strings.TrimSpace(n)
			}
		}
		out = append(out, p)
	}
	return out, nil
}

func gib(b uint64) string { return fmt.Sprintf("%9.2f GiB", float64(b)/(1<<30)) }

func sgib(b int64) string { return fmt.Sprintf("%9.2f GiB", float64(b)/(1<<30)) }

func memoryAccountingTool(c Config) Tool {
	return Tool{
		Name: "memory_accounting",
		Description: "Where this host's memory went, by owner, with totals that close: /proc/meminfo split " +
			"into disjoint parts that add up to MemTotal, the processes holding the most (resident memory " +
			"from /proc/<pid>/status next to GPU memory from NVML), and per GPU how much of the used memory " +
			"processes account for. Separate from meminfo because it needs all three sources: GPU " +
			"allocations never show in a process's resident memory, so ps alone can account for a small " +
			"fraction of a busy node.",
		Run: func(ctx context.Context, _ Args) (string, error) {
			var b strings.Builder
			mi, err := fs.ReadFile(c.Root, "proc/meminfo")
			if err != nil {
				fmt.Fprintf(&b, "(/proc/meminfo unreadable: %v)\n", err)
			} else {
				writeHostMemory(&b, parseMeminfo(mi))
			}

			procs, perr := readProcs(ctx, c.Root)
			if perr != nil && ctx.Err() != nil {
				return "", ctx.Err()
			}
			var snap gpu.Snapshot
			gpuNote := ""
			switch {
			case c.GPU == nil:
				gpuNote = "(no GPU probe is configured)"
			default:
				snap, err = c.GPU(ctx)
				switch {
				case err != nil && ctx.Err() != nil:
					return "", ctx.Err()
				case err != nil:
					gpuNote = fmt.Sprintf("(reading the GPUs failed: %v)", err)
				case !snap.Available:
					gpuNote = "(no NVIDIA GPUs: the NVML library is not installed)"
				}
			}
			procs = addGPUProcs(procs, snap)

			b.WriteString("\nProcesses (resident memory from /proc/<pid>/status; GPU memory from NVML)\n")
			if perr != nil {
				fmt.Fprintf(&b, "(/proc unreadable: %v)\n", perr)
			}
			writeProcs(&b, procs)

			b.WriteString("\nGPU memory (device memory, not part of MemTotal unless the GPU shares host memory)\n")
			if gpuNote != "" {
				b.WriteString(gpuNote + "\n")
			} else {
				writeGPUs(&b, snap, procs)
			}
			return c.stamp("/proc/meminfo + /proc/*/status + NVML", capHead(b.String(), c.MaxOutput)), nil
		},
	}
}

// writeHostMemory splits MemTotal into disjoint parts. Pages on the LRU
// lists (anon, file, unevictable) and the kernel's own uses do not overlap;
// what is left is memory drivers took straight from the page allocator.
// On a GPU that shares host memory (GB10, Grace Hopper) that is where GPU
// allocations land, which is why the last line matters.
func writeHostMemory(b *strings.Builder, m map[string]uint64) {
	huge := m["Hugetlb"]
	if huge == 0 {
		huge = m["HugePages_Total"] * m["Hugepagesize"]
	}
	type row struct {
		label string
		v     uint64
	}
	rows := []row{
		{"free (MemFree)", m["MemFree"]},
		{"anonymous: process heaps and stacks, tmpfs and /dev/shm (Active+Inactive(anon))", m["Active(anon)"] + m["Inactive(anon)"]},
		{"file cache: page cache and buffers (Active+Inactive(file))", m["Active(file)"] + m["Inactive(file)"]},
		{"unevictable: mlocked, ramfs (Unevictable)", m["Unevictable"]},
		{"kernel slab (Slab)", m["Slab"]},
		{"kernel stacks (KernelStack)", m["KernelStack"]},
		{"page tables (PageTables+SecPageTables)", m["PageTables"] + m["SecPageTables"]},
		{"per-CPU allocations (Percpu)", m["Percpu"]},
		{"vmalloc (VmallocUsed)", m["VmallocUsed"]},
		{"huge pages reserved (Hugetlb)", huge},
	}
	total := m["MemTotal"]
	var sum uint64
	b.WriteString("Host memory (/proc/meminfo)\n")
	for _, r := range rows {
		sum += r.v
		fmt.Fprintf(b, "  %s  %s\n", gib(r.v), r.label)
	}
	rest := int64(total) - int64(sum)
	fmt.Fprintf(b, "  %s  in none of the above: taken by drivers directly (GPU memory on a GPU that shares host memory)\n", sgib(rest))
	if rest < 0 {
		b.WriteString("             (negative: this kernel counts some pages in two of the lines above)\n")
	}
	fmt.Fprintf(b, "  %s  = MemTotal\n", gib(total))
	fmt.Fprintf(b, "  of which, already counted above: %s shared memory (Shmem), %s mapped anonymous (AnonPages), %s available (MemAvailable)\n",
		strings.TrimSpace(gib(m["Shmem"])), strings.TrimSpace(gib(m["AnonPages"])), strings.TrimSpace(gib(m["MemAvailable"])))
}

// addGPUProcs adds each process's GPU memory, and lists GPU processes /proc
// does not show (another PID namespace, or exited since).
func addGPUProcs(procs []procMem, snap gpu.Snapshot) []procMem {
	byPID := make(map[int]int, len(procs))
	for i, p := range procs {
		byPID[p.pid] = i
	}
	for _, gp := range snap.Processes {
		i, ok := byPID[gp.PID]
		if !ok {
			procs = append(procs, procMem{pid: gp.PID, name: "(not in this /proc)"})
			i = len(procs) - 1
			byPID[gp.PID] = i
		}
		procs[i].gpu += gp.UsedBytes
	}
	return procs
}

func writeProcs(b *strings.Builder, procs []procMem) {
	slices.SortFunc(procs, func(x, y procMem) int {
		if c := cmp.Compare(y.rss+y.gpu, x.rss+x.gpu); c != 0 {
			return c
		}
		return cmp.Compare(x.pid, y.pid)
	})
	fmt.Fprintf(b, "  %8s  %13s  %13s  %13s  %13s  %13s  %s\n", "PID", "RSS", "anon", "file", "shmem", "GPU", "NAME")
	var rss, anon, file, shmem, gpuSum uint64
	for i, p := range procs {
		rss, anon, file, shmem, gpuSum = rss+p.rss, anon+p.anon, file+p.file, shmem+p.shmem, gpuSum+p.gpu
		if i < maxProcRows {
			fmt.Fprintf(b, "  %8d  %s  %s  %s  %s  %s  %s\n", p.pid, gib(p.rss), gib(p.anon), gib(p.file), gib(p.shmem), gib(p.gpu), p.name)
		}
	}
	if len(procs) > maxProcRows {
		fmt.Fprintf(b, "  (%d more processes in the sums)\n", len(procs)-maxProcRows)
	}
	fmt.Fprintf(b, "  %8s  %s  %s  %s  %s  %s  all %d processes\n", "sum", gib(rss), gib(anon), gib(file), gib(shmem), gib(gpuSum), len(procs))
	b.WriteString("  Sums count a shared page once per process that maps it: shmem and file sums can exceed the\n" +
		"  host totals. anon sums compare with AnonPages above.\n")
}

func writeGPUs(b *strings.Builder, snap gpu.Snapshot, procs []procMem) {
	names := make(map[int]string, len(procs))
	for _, p := range procs {
		names[p.pid] = p.name
	}
	if len(snap.GPUs) == 0 {
		b.WriteString("(no GPUs)\n")
	}
	for _, g := range snap.GPUs {
		var charged uint64
		var lines []string
		for _, p := range snap.Processes {
			if p.GPUIndex == g.Index {
				charged += p.UsedBytes
				lines = append(lines, fmt.Sprintf("    %s  pid %d %s", gib(p.UsedBytes), p.PID, names[p.PID]))
			}
		}
		fmt.Fprintf(b, "  GPU %d %s (%s)\n", g.Index, g.Name, g.UUID)
		b.WriteString(strings.Join(lines, "\n"))
		if len(lines) > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(b, "    %s  held by the processes above\n", gib(charged))
		fmt.Fprintf(b, "    %s  used but charged to no process (driver and context overhead)\n", sgib(int64(g.MemoryUsed)-int64(charged)))
		fmt.Fprintf(b, "    %s  = used\n", gib(g.MemoryUsed))
		fmt.Fprintf(b, "    %s  free or reserved by the driver (total %s)\n", gib(g.MemoryTotal-min(g.MemoryUsed, g.MemoryTotal)), strings.TrimSpace(gib(g.MemoryTotal)))
	}
	for _, w := range snap.Warnings {
		fmt.Fprintf(b, "  warning: %s\n", w)
	}
}
