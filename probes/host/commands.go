package host

import (
	"context"
	"fmt"
	"io/fs"
	"slices"
	"strings"
)

func meminfoTool(c Config) Tool {
	return Tool{
		Name:        "meminfo",
		Description: "Raw /proc/meminfo of this host. For where the memory went, by owner, use memory_accounting.",
		Run: func(ctx context.Context, _ Args) (string, error) {
			b, err := fs.ReadFile(c.Root, "proc/meminfo")
			body := string(b)
			if err != nil {
				body = fmt.Sprintf("(/proc/meminfo unreadable on %s: %v)\n", c.Host, err)
			}
			return c.stamp("/proc/meminfo", capHead(body, c.MaxOutput)), nil
		},
	}
}

// gpuView returns the fixed nvidia-smi command line of a view.
func gpuView(view string) ([]string, bool) {
	switch view {
	case "", "default":
		return []string{"nvidia-smi"}, true
	case "query":
		return []string{"nvidia-smi",
			"--query-gpu=index,uuid,name,utilization.gpu,clocks.sm,temperature.gpu,power.draw,memory.total,memory.used,memory.free,pci.bus_id,mig.mode.current",
			"--format=csv"}, true
	case "apps":
		return []string{"nvidia-smi", "--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv"}, true
	case "topo":
		return []string{"nvidia-smi", "topo", "-m"}, true
	case "clocks":
		return []string{"nvidia-smi", "-q", "-d", "CLOCK,PERFORMANCE"}, true
	}
	return nil, false
}

// gpuViews lists the views in the order the description gives them.
func gpuViews() []string { return []string{"default", "query", "apps", "topo", "clocks"} }

func gpuTool(c Config) Tool {
	return Tool{
		Name: "gpu",
		Description: "nvidia-smi output. Views: default (the usual table), query (CSV per GPU: utilisation, " +
			"SM clock, temperature, power, memory total/used/free, PCI bus id, MIG mode), apps (CSV of compute " +
			"processes with their GPU memory: where memory went when the table does not say), topo (the " +
			"GPU/NIC topology matrix: NVLink, PCIe switch, NUMA affinity), clocks (clock and performance detail, " +
			"including why clocks are held back: power cap, thermal).",
		Params: []Param{{Name: "view", Description: "one of " + strings.Join(gpuViews(), ", ") + "; default if empty"}},
		Run: func(ctx context.Context, a Args) (string, error) {
			cmd, ok := gpuView(a.View)
			if !ok {
				return "", fmt.Errorf("%w: unknown gpu view %q; valid views: %s", ErrBadArgs, a.View, strings.Join(gpuViews(), ", "))
			}
			out, err := c.command(ctx, cmd[0], cmd[1:]...)
			if err != nil {
				return "", err
			}
			return c.stamp(strings.Join(cmd, " "), capHead(out, c.MaxOutput)), nil
		},
	}
}

func processesTool(c Config) Tool {
	return simple(c, "processes",
		"Every process (ps), largest resident memory first: pid, parent, RSS in KiB, CPU %, elapsed time, "+
			"threads, full command line. GPU memory does not show here; see gpu view apps or memory_accounting.",
		"ps", "-eww", "-o", "pid,ppid,rss,pcpu,etime,nlwp,comm,args", "--sort=-rss")
}

func pciTool(c Config) Tool {
	return simple(c, "pci", "PCI devices with vendor/device IDs and the kernel driver bound to each (lspci -nnk).",
		"lspci", "-nnk")
}

func usbTool(c Config) Tool {
	return simple(c, "usb", "USB device tree (lsusb -t).", "lsusb", "-t")
}

// networkCommands are run in order by the network tool.
func networkCommands() [][]string {
	return [][]string{
		{"ip", "addr", "show"},
		{"ip", "-s", "link", "show"},
		{"rdma", "link", "show"},
	}
}

func networkTool(c Config) Tool {
	return Tool{
		Name: "network",
		Description: "Interfaces and addresses (ip addr show), link state with packet, error and drop counts " +
			"(ip -s link show), and RDMA link state (rdma link show).",
		Run: func(ctx context.Context, _ Args) (string, error) {
			var b strings.Builder
			var lines []string
			for _, cmd := range networkCommands() {
				out, err := c.command(ctx, cmd[0], cmd[1:]...)
				if err != nil {
					return "", err
				}
				line := strings.Join(cmd, " ")
				lines = append(lines, line)
				fmt.Fprintf(&b, "$ %s\n%s", line, out)
			}
			return c.stamp(strings.Join(lines, "; "), capHead(b.String(), c.MaxOutput)), nil
		},
	}
}

func containersTool(c Config) Tool {
	return Tool{
		Name:        "containers",
		Description: "What the container runtime runs on this host, as the node's runtime reports it.",
		Run: func(ctx context.Context, _ Args) (string, error) {
			if c.Containers == nil {
				return c.stamp("containers", fmt.Sprintf("(no container runtime is configured on %s)\n", c.Host)), nil
			}
			out, err := c.Containers(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return "", ctx.Err()
				}
				out = fmt.Sprintf("(listing containers on %s failed: %v)\n", c.Host, err)
			}
			return c.stamp("container runtime", capHead(out, c.MaxOutput)), nil
		},
	}
}

const infiniband = "sys/class/infiniband"

func rdmaCountersTool(c Config) Tool {
	return Tool{
		Name: "rdma_counters",
		Description: "Every counter of every RDMA port (/sys/class/infiniband/<device>/ports/<port>/counters " +
			"and hw_counters), raw. These are totals since the driver loaded: a rate needs two calls and a " +
			"difference.",
		Params: []Param{{Name: "device", Description: "one RDMA device (e.g. mlx5_0); all if empty"}},
		Run: func(ctx context.Context, a Args) (string, error) {
			entries, err := fs.ReadDir(c.Root, infiniband)
			if err != nil {
				if a.Device != "" {
					return "", fmt.Errorf("%w: no RDMA device %q on %s (no /%s)", ErrBadArgs, a.Device, c.Host, infiniband)
				}
				return c.stamp("/"+infiniband, fmt.Sprintf("(no RDMA devices on %s: %v)\n", c.Host, err)), nil
			}
			var devs []string
			for _, e := range entries {
				devs = append(devs, e.Name())
			}
			slices.Sort(devs)
			if a.Device != "" {
				if !slices.Contains(devs, a.Device) {
					return "", fmt.Errorf("%w: no RDMA device %q on %s; devices: %s", ErrBadArgs, a.Device, c.Host, strings.Join(devs, ", "))
				}
				devs = []string{a.Device}
			}
			var b strings.Builder
			for _, d := range devs {
				if err := ctx.Err(); err != nil {
					return "", err
				}
				c.rdmaDevice(&b, d)
			}
			if b.Len() == 0 {
				b.WriteString("(no ports with counters)\n")
			}
			return c.stamp("/"+infiniband+"/*/ports/*/{counters,hw_counters}", capHead(b.String(), c.MaxOutput)), nil
		},
	}
}

func (c Config) rdmaDevice(b *strings.Builder, dev string) {
	portsDir := infiniband + "/" + dev + "/ports"
	ports, err := fs.ReadDir(c.Root, portsDir)
	if err != nil {
		fmt.Fprintf(b, "# %s: %v\n", dev, err)
		return
	}
	for _, p := range ports {
		for _, group := range []string{"counters", "hw_counters"} {
			dir := portsDir + "/" + p.Name() + "/" + group
			names, err := fs.ReadDir(c.Root, dir)
			if err != nil {
				continue // hw_counters is absent on some drivers
			}
			fmt.Fprintf(b, "# %s port %s %s\n", dev, p.Name(), group)
			for _, n := range names {
				v, err := fs.ReadFile(c.Root, dir+"/"+n.Name())
				val := strings.TrimSpace(string(v))
				if err != nil {
					val = fmt.Sprintf("(unreadable: %v)", err)
				}
				fmt.Fprintf(b, "%s = %s\n", n.Name(), val)
			}
		}
	}
}
