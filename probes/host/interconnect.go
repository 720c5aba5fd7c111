package host

import (
	"context"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultInterconnectGap is how far apart ReadInterconnect reads the port
// counters.
const DefaultInterconnectGap = time.Second

// LinkRate is one RDMA (InfiniBand or RoCE) port's traffic between two
// counter reads.
type LinkRate struct {
	Device string `json:"device"`
	Port   int    `json:"port"`
	// State is the port's state as sysfs words it ("ACTIVE", "DOWN");
	// Up is State == ACTIVE. A port without a link ("no cable") is Up
	// false with zero rates: that is a state, not an error.
	State string `json:"state,omitempty"`
	Up    bool   `json:"up"`
	// LinkLayer is "InfiniBand" or "Ethernet" (RoCE).
	LinkLayer string `json:"link_layer,omitempty"`
	// TxMBps and RxMBps are megabytes (10^6) per second sent and received.
	TxMBps float64 `json:"tx_mb_s"`
	RxMBps float64 `json:"rx_mb_s"`
}

// Interconnect is one reading of every RDMA port's rates.
type Interconnect struct {
	Links []LinkRate `json:"links,omitempty"`
	// Interval is the time between the two counter reads.
	Interval time.Duration `json:"interval"`
	// Warnings name ports whose counters could not be read or went
	// backwards (a reset), left out of Links.
	Warnings []string `json:"warnings,omitempty"`
}

// portCounters is one read of a port: data words sent and received.
type portCounters struct {
	dev         string
	port        int
	state, link string
	tx, rx      uint64
	err         error
}

// ReadInterconnect reads every RDMA port's data counters twice, gap apart
// (DefaultInterconnectGap when 0), and returns the rates: a lifetime total
// says how much a link ever carried, two reads say whether it is busy now.
// port_xmit_data and port_rcv_data count 4-byte words, per the InfiniBand
// spec (the "data" counters are octets divided by 4). A host without
// /sys/class/infiniband has no RDMA devices, which is no error.
func ReadInterconnect(ctx context.Context, cfg Config, gap time.Duration) (Interconnect, error) {
	c := cfg.withDefaults()
	if gap <= 0 {
		gap = DefaultInterconnectGap
	}
	first := c.readPorts()
	if len(first) == 0 {
		return Interconnect{}, nil
	}
	t0 := c.Clock.Now()
	if err := c.Sleep(ctx, gap); err != nil {
		return Interconnect{}, err
	}
	second := c.readPorts()
	elapsed := c.Clock.Now().Sub(t0)
	out := Interconnect{Interval: elapsed}
	if elapsed <= 0 {
		return out, fmt.Errorf("interconnect: the clock did not advance between the two counter reads")
	}
	before := map[string]portCounters{}
	for _, p := range first {
		before[fmt.Sprintf("%s/%d", p.dev, p.port)] = p
	}
	for _, p := range second {
		name := fmt.Sprintf("%s/%d", p.dev, p.port)
		a, ok := before[name]
		switch {
		case p.err != nil:
			out.Warnings = append(out.Warnings, fmt.Sprintf("%s: %v", name, p.err))
			continue
		case !ok || a.err != nil:
			out.Warnings = append(out.Warnings, fmt.Sprintf("%s: no first read", name))
			continue
		case p.tx < a.tx || p.rx < a.rx:
			out.Warnings = append(out.Warnings, fmt.Sprintf("%s: counters went backwards (reset); rates at the next read", name))
			continue
		}
		sec := elapsed.Seconds()
		out.Links = append(out.Links, LinkRate{Device: p.dev, Port: p.port, State: p.state, Up: p.state == "ACTIVE", LinkLayer: p.link,
			TxMBps: float64(p.tx-a.tx) * 4 / 1e6 / sec, RxMBps: float64(p.rx-a.rx) * 4 / 1e6 / sec})
	}
	return out, nil
}

// readPorts reads every port's counters once, in device and port order.
func (c Config) readPorts() []portCounters {
	devs, err := fs.ReadDir(c.Root, infiniband)
	if err != nil {
		return nil
	}
	var out []portCounters
	for _, d := range devs {
		dir := infiniband + "/" + d.Name() + "/ports"
		ports, err := fs.ReadDir(c.Root, dir)
		if err != nil {
			continue
		}
		var nums []int
		for _, p := range ports {
			if n, err := strconv.Atoi(p.Name()); err == nil {
				nums = append(nums, n)
			}
		}
		slices.Sort(nums)
		for _, n := range nums {
			pd := fmt.Sprintf("%s/%d/", dir, n)
			pc := portCounters{dev: d.Name(), port: n, state: portState(c.Root, pd+"state"), link: readWord(c.Root, pd+"link_layer")}
			pc.tx, pc.err = readCounter(c.Root, pd+"counters/port_xmit_data")
			if pc.err == nil {
				pc.rx, pc.err = readCounter(c.Root, pd+"counters/port_rcv_data")
			}
			out = append(out, pc)
		}
	}
	return out
}

func readCounter(root fs.FS, name string) (uint64, error) {
	b, err := fs.ReadFile(root, name)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/%s: %w", name, err)
	}
	return v, nil
}

func readWord(root fs.FS, name string) string {
	b, _ := fs.ReadFile(root, name)
	return strings.TrimSpace(string(b))
}

// portState turns sysfs's "4: ACTIVE" into "ACTIVE".
func portState(root fs.FS, name string) string {
	s := readWord(root, name)
	if _, w, ok := strings.Cut(s, ":"); ok {
		return strings.TrimSpace(w)
	}
	return s
}

// RDMADevices lists the RDMA devices with a port up (ACTIVE), each once,
// from one read of the ports' state: what a gang's collectives may use
// (NCCL_IB_HCA). Unlike ReadInterconnect it reads no counters and does
// not wait. A host without /sys/class/infiniband has none.
func RDMADevices(cfg Config) []string {
	var devs []string
	for _, p := range cfg.withDefaults().readPorts() {
		if p.err == nil && p.state == "ACTIVE" && !slices.Contains(devs, p.dev) {
			devs = append(devs, p.dev)
		}
	}
	return devs
}
