package host

import (
	"bufio"
	"context"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/gpu"
)

// DriverFault is one NVRM or Xid line from the kernel log.
type DriverFault struct {
	// Time is when the kernel logged it; zero when the line carries no
	// time this parser knows.
	Time time.Time `json:"time,omitzero"`
	// Message is the line without its timestamp.
	Message string `json:"message"`
	// Xid is the Xid error number; 0 for NVRM lines that are not Xids.
	Xid int `json:"xid,omitempty"`
	// PCI is the GPU's PCI address as the kernel printed it: "0000:3b:00"
	// in Xid lines (no function), "0000:3b:00.0" in others; empty when the
	// line names no GPU.
	PCI string `json:"pci,omitempty"`
	// Fault: the line reports a fault (an Xid, or an NVRM error such as
	// NV_ERR_*; see isFaultLine), not a notice.
	Fault bool `json:"fault,omitempty"`
}

// DriverFaults summarises the NVIDIA driver's kernel messages.
//
// The kernel never clears them, so a count alone would mark a node broken
// for the rest of its boot after one fault: hence the recent window next to
// the whole-boot count. Not every NVRM line is a fault (the module's load
// banner is one), but it is the driver talking, and on 2026-08-27 a driver
// logging NV_ERR_NO_MEMORY every few minutes was the only sign of a node
// that answered requests normally until it had to be power-cycled. So the
// lines are classified: faults (Xids and NVRM errors, see isFaultLine) are
// counted apart, and they are what keeps work off a GPU; Xids are counted
// apart again, as the driver's own numbered error reports.
type DriverFaults struct {
	// Source is the command the lines came from.
	Source string `json:"source"`
	// Window is how far back Recent counts.
	Window time.Duration `json:"window"`
	// Total and Recent count NVRM and Xid lines since boot and within
	// Window. Lines without a time count only in Total.
	Total  int `json:"total"`
	Recent int `json:"recent"`
	// FaultTotal and FaultRecent count the faults among them (Xids and
	// NVRM errors).
	FaultTotal  int `json:"fault_total"`
	FaultRecent int `json:"fault_recent"`
	// XidTotal and XidRecent count the Xid lines among the faults.
	XidTotal  int `json:"xid_total"`
	XidRecent int `json:"xid_recent"`
	// Newest is the latest dated line; NewestFault the latest dated fault
	// and NewestXid the latest dated Xid (the ones to show beside their
	// counts: Newest may be a banner).
	Newest      *DriverFault `json:"newest,omitempty"`
	NewestFault *DriverFault `json:"newest_fault,omitempty"`
	NewestXid   *DriverFault `json:"newest_xid,omitempty"`
	// Faults are all matching lines in log order.
	Faults []DriverFault `json:"faults,omitempty"`
}

// RecentFaults returns the PCI addresses with a fault inside the window,
// sorted and without repeats (compare them to a GPU's PCIBusID with
// SamePCIDevice), and whether a recent fault named no GPU: such a fault
// (NV_ERR_NO_MEMORY from the driver's core, for one) may be any GPU's, so
// it counts for the whole node.
func (d DriverFaults) RecentFaults(now time.Time) (pci []string, nodeWide bool) {
	for _, f := range d.Faults {
		if !f.Fault || !recent(f.Time, now, d.Window) {
			continue
		}
		if f.PCI == "" {
			nodeWide = true
			continue
		}
		pci = append(pci, gpu.NormalizePCI(f.PCI))
	}
	slices.Sort(pci)
	return slices.Compact(pci), nodeWide
}

// MarkFaulted returns a copy of gpus with Faulted set on every GPU that had
// a fault inside the window, and on every GPU when a recent fault named
// none. A GPU without a PCI address (a simulated one) is marked only by
// such a node-wide fault.
func MarkFaulted(gpus []placement.GPU, d DriverFaults, now time.Time) []placement.GPU {
	bad, nodeWide := d.RecentFaults(now)
	out := slices.Clone(gpus)
	for i := range out {
		if nodeWide {
			out[i].Faulted = true
			continue
		}
		for _, p := range bad {
			if SamePCIDevice(p, out[i].PCIBusID) {
				out[i].Faulted = true
			}
		}
	}
	return out
}

// SamePCIDevice reports whether a kernel-printed PCI address and a GPU's bus
// id name the same device. Xid lines leave out the function number
// ("0000:3b:00"); a GPU is function 0 of its device, so an address without
// a function matches any function of that bus and device.
func SamePCIDevice(kernel, busID string) bool {
	k, b := gpu.NormalizePCI(kernel), gpu.NormalizePCI(busID)
	if k == "" || b == "" {
		return false
	}
	if k == b {
		return true
	}
	if !strings.Contains(k, ".") {
		dev, _, _ := strings.Cut(b, ".")
		return k == dev
	}
	return false
}

func recent(t, now time.Time, window time.Duration) bool {
	return !t.IsZero() && !t.After(now.Add(time.Minute)) && now.Sub(t) <= window
}

var (
	// dmesg -T: "[Sun Nov 29 22:53:19 2026] NVRM: ..." (local time; the
	// day of month is space-padded).
	dmesgHuman = regexp.MustCompile(`^\[([A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d \d{4})\] ?(.*)$`)
	// dmesg without -T: "[    1.726829] NVRM: ..." (seconds since boot).
	dmesgRaw = regexp.MustCompile(`^\[\s*(\d+)\.(\d+)\] ?(.*)$`)
	// journalctl -o short-iso: "2026-11-29T22:53:19+0000 host kernel: ...".
	journalISO = regexp.MustCompile(`^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:Z|[+-]\d\d:?\d\d)) \S+ kernel: ?(.*)$`)
	// "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.",
	// with MIG "Xid (PCI:0000:3b:00 GPU-I:05): 94, ..." (or GPU-I and
	// GPU-CI), and from older drivers "Xid (0000:03:00): 14, ...".
	xidLine = regexp.MustCompile(`Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)[^)]*\): (\d+)`)
	// "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", and
	// "NVRM: GPU at PCI:0000:3b:00: GPU-...".
	gpuAddr = regexp.MustCompile(`GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])|PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)`)
	// What `grep -iE 'nvrm|xid'` would keep.
	driverLine = regexp.MustCompile(`(?i)nvrm|xid`)
)

// ParseDriverFaults reads kernel log text (dmesg -T, plain dmesg or
// journalctl -k -o short-iso) and keeps the NVRM and Xid lines. loc is the
// zone dmesg -T printed in; boot is the boot time, for plain dmesg's
// seconds-since-boot stamps (zero: those lines get no time).
func ParseDriverFaults(text string, now time.Time, window time.Duration, loc *time.Location, boot time.Time) DriverFaults {
	d := DriverFaults{Window: window}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), " \r")
		if !driverLine.MatchString(line) {
			continue
		}
		f := parseFaultLine(line, loc, boot)
		d.Faults = append(d.Faults, f)
		d.Total++
		isRecent := recent(f.Time, now, window)
		if isRecent {
			d.Recent++
		}
		if f.Fault {
			d.FaultTotal++
			if isRecent {
				d.FaultRecent++
			}
			if !f.Time.IsZero() && (d.NewestFault == nil || !f.Time.Before(d.NewestFault.Time)) {
				n := f
				d.NewestFault = &n
			}
		}
		if f.Xid != 0 {
			d.XidTotal++
			if isRecent {
				d.XidRecent++
			}
		}
		if !f.Time.IsZero() && (d.Newest == nil || !f.Time.Before(d.Newest.Time)) {
			n := f
			d.Newest = &n
		}
		if f.Xid != 0 && !f.Time.IsZero() && (d.NewestXid == nil || !f.Time.Before(d.NewestXid.Time)) {
			n := f
			d.NewestXid = &n
		}
	}
	return d
}

func parseFaultLine(line string, loc *time.Location, boot time.Time) DriverFault {
	f := DriverFault{Message: line}
	if m := dmesgHuman.FindStringSubmatch(line); m != nil {
		if t, err := time.ParseInLocation("Mon Jan _2 15:04:05 2006", m[1], loc); err == nil {
			f.Time, f.Message = t, m[2]
		}
	} else if m := dmesgRaw.FindStringSubmatch(line); m != nil {
		f.Message = m[3]
		sec, err1 := strconv.ParseInt(m[1], 10, 64)
		frac, err2 := strconv.ParseFloat("0."+m[2], 64)
		if err1 == nil && err2 == nil && !boot.IsZero() {
			f.Time = boot.Add(time.Duration(sec)*time.Second + time.Duration(frac*float64(time.Second)))
		}
	} else if m := journalISO.FindStringSubmatch(line); m != nil {
		for _, layout := range []string{"2006-01-02T15:04:05-0700", "2006-01-02T15:04:05Z07:00"} {
			if t, err := time.Parse(layout, m[1]); err == nil {
				f.Time, f.Message = t, m[2]
				break
			}
		}
	}
	if m := xidLine.FindStringSubmatch(f.Message); m != nil {
		f.PCI = m[1]
		f.Xid, _ = strconv.Atoi(m[2])
	} else if m := gpuAddr.FindStringSubmatch(f.Message); m != nil {
		f.PCI = m[1] + m[2]
	}
	f.Fault = isFaultLine(f.Message, f.Xid)
	return f
}

// bootTime reads btime from /proc/stat.
func bootTime(root fs.FS) time.Time {
	b, err := fs.ReadFile(root, "proc/stat")
	if err != nil {
		return time.Time{}
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			if s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return time.Unix(s, 0)
			}
		}
	}
	return time.Time{}
}

// kernelLog reads the kernel log: dmesg -T, or journalctl when dmesg is
// missing or refused (kernel.dmesg_restrict without CAP_SYSLOG). It returns
// the text, the command it came from, and notes on what failed on the way.
func (c Config) kernelLog(ctx context.Context) (text, source, notes string, err error) {
	out, problem, err := c.try(ctx, "dmesg", "-T")
	if err != nil {
		return "", "", "", err
	}
	if problem == "" {
		return out, "dmesg -T", "", nil
	}
	notes = strings.TrimSpace(out+problem) + "\n"
	jout, jproblem, err := c.try(ctx, "journalctl", "-k", "-b", "--no-pager", "-o", "short-iso")
	if err != nil {
		return "", "", "", err
	}
	return jout, "journalctl -k -b --no-pager -o short-iso", notes + jproblem, nil
}

// ReadDriverFaults reads and summarises this host's NVIDIA driver messages,
// for the node's own record (recent Xids mark GPUs Faulted).
func ReadDriverFaults(ctx context.Context, cfg Config) (DriverFaults, error) {
	c := cfg.withDefaults()
	text, source, _, err := c.kernelLog(ctx)
	if err != nil {
		return DriverFaults{}, err
	}
	d := ParseDriverFaults(text, c.Clock.Now(), c.FaultWindow, c.Location, bootTime(c.Root))
	d.Source = source
	return d, nil
}

func driverFaultsTool(c Config) Tool {
	return Tool{
		Name: "driver_faults",
		Description: fmt.Sprintf("NVIDIA driver messages in the kernel log (NVRM and Xid lines from dmesg -T, "+
			"or journalctl -k when dmesg is refused): how many in the last %s and since boot, the faults among "+
			"them (Xids and NVRM errors such as NV_ERR_*, not banners or notices), Xid errors apart with their "+
			"number and GPU PCI address, the newest line and fault, then the lines themselves (faults marked FAULT). The "+
			"kernel never clears these, so only the recent count says something is wrong now; a GPU can "+
			"keep answering requests while its driver logs errors.", c.FaultWindow),
		Run: func(ctx context.Context, _ Args) (string, error) {
			text, source, notes, err := c.kernelLog(ctx)
			if err != nil {
				return "", err
			}
			now := c.Clock.Now()
			d := ParseDriverFaults(text, now, c.FaultWindow, c.Location, bootTime(c.Root))
			d.Source = source
			var b strings.Builder
			b.WriteString(notes)
			fmt.Fprintf(&b, "NVRM/Xid lines: %d since boot, %d in the last %s\n", d.Total, d.Recent, c.FaultWindow)
			fmt.Fprintf(&b, "faults (Xid and NVRM errors): %d since boot, %d in the last %s\n", d.FaultTotal, d.FaultRecent, c.FaultWindow)
			fmt.Fprintf(&b, "Xid errors: %d since boot, %d in the last %s\n", d.XidTotal, d.XidRecent, c.FaultWindow)
			if d.Newest != nil {
				fmt.Fprintf(&b, "newest: %s (%s ago) %s\n", d.Newest.Time.UTC().Format(time.RFC3339),
					now.Sub(d.Newest.Time).Round(time.Second), d.Newest.Message)
			}
			if d.NewestFault != nil {
				fmt.Fprintf(&b, "newest fault: %s (%s ago) %s\n", d.NewestFault.Time.UTC().Format(time.RFC3339),
					now.Sub(d.NewestFault.Time).Round(time.Second), d.NewestFault.Message)
			}
			writeXidTable(&b, d, now)
			if source == "dmesg -T" {
				b.WriteString("(dmesg reads the kernel ring buffer, which drops the oldest lines when full: \"since boot\" counts what it still holds)\n")
			}
			b.WriteString("--- the lines, oldest first ---\n")
			var lines strings.Builder
			for _, f := range d.Faults {
				if !f.Time.IsZero() {
					lines.WriteString(f.Time.UTC().Format(time.RFC3339) + " ")
				}
				if f.Fault {
					lines.WriteString("FAULT ")
				}
				lines.WriteString(f.Message + "\n")
			}
			if len(d.Faults) == 0 {
				lines.WriteString("(none)\n")
			}
			// The summary stays whole; the lines keep their newest end.
			body := b.String() + capTail(lines.String(), max(c.MaxOutput-b.Len(), 1024))
			return c.stamp(source+" | NVRM/Xid lines", body), nil
		},
	}
}

// writeXidTable groups Xids by number and GPU.
func writeXidTable(b *strings.Builder, d DriverFaults, now time.Time) {
	type key struct {
		pci string
		xid int
	}
	type agg struct {
		total, recent int
		last          time.Time
	}
	groups := map[key]*agg{}
	var keys []key
	for _, f := range d.Faults {
		if f.Xid == 0 {
			continue
		}
		k := key{gpu.NormalizePCI(f.PCI), f.Xid}
		g, ok := groups[k]
		if !ok {
			g = &agg{}
			groups[k] = g
			keys = append(keys, k)
		}
		g.total++
		if recent(f.Time, now, d.Window) {
			g.recent++
		}
		if f.Time.After(g.last) {
			g.last = f.Time
		}
	}
	slices.SortFunc(keys, func(x, y key) int {
		if c := strings.Compare(x.pci, y.pci); c != 0 {
			return c
		}
		return x.xid - y.xid
	})
	for _, k := range keys {
		g := groups[k]
		last := "time unknown"
		if !g.last.IsZero() {
			last = "last " + g.last.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(b, "  Xid %d on GPU %s: %d since boot, %d recent, %s\n", k.xid, k.pci, g.total, g.recent, last)
	}
}
