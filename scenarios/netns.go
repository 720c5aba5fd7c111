package scenarios

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// netnsNet puts every node in its own network namespace (net=netns): a real
// network partition instead of the gossip-drop test hook.
//
// Each node gets two links:
//   - eth0, its cluster link (gossip), a veth whose host end sits on a bridge
//     in the root namespace. All nodes start on bridge 0. A partition moves
//     each side's host ends to a bridge of its own, so nothing at all crosses
//     between sides (no tc or iptables needed); heal moves them back.
//   - mgmt, a point-to-point veth to the root namespace with a /30 of its own,
//     on which the node serves its HTTP API, so the runner always reaches
//     every node, partitioned or not.
//
// Names carry the runner's pid (llmgw-<pid>-<node>, lg<pid>...), so that
// leftovers of a runner that died are recognised and removed by the next.
// Needs root and iproute2.
type netnsNet struct {
	pid     int
	octet   int // 10.<octet>.0.0/16 is this run's
	bridges map[int]string
}

func runIP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func newNetns() (*netnsNet, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("net=netns needs root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("net=netns needs iproute2 (ip): %w", err)
	}
	cleanStaleNetns()
	used, _ := exec.Command("ip", "-4", "-o", "addr").Output()
	pid := os.Getpid()
	octet := 0
	for i := range 128 {
		o := 64 + (pid+i)%128
		if !strings.Contains(string(used), fmt.Sprintf(" 10.%d.", o)) {
			octet = o
			break
		}
	}
	if octet == 0 {
		return nil, fmt.Errorf("net=netns: no free 10.x.0.0/16 for this run")
	}
	nn := &netnsNet{pid: pid, octet: octet, bridges: map[int]string{}}
	if _, err := nn.bridge(0); err != nil {
		return nil, err
	}
	return nn, nil
}

func (nn *netnsNet) bridge(side int) (string, error) {
	if b, ok := nn.bridges[side]; ok {
		return b, nil
	}
	b := fmt.Sprintf("lg%db%d", nn.pid, side)
	if err := runIP("link", "add", b, "type", "bridge"); err != nil {
		return "", err
	}
	if err := runIP("link", "set", b, "up"); err != nil {
		return "", err
	}
	nn.bridges[side] = b
	return b, nil
}

func (nn *netnsNet) nsName(n *node) string { return fmt.Sprintf("llmgw-%d-%s", nn.pid, n.name) }
func (nn *netnsNet) hostLink(n *node) string {
	return fmt.Sprintf("lg%dc%d", nn.pid, n.index)
}

// addNode creates the node's namespace and links and sets its addresses.
func (nn *netnsNet) addNode(n *node) error {
	if n.index < 1 || n.index > 250 {
		return fmt.Errorf("net=netns: at most 250 nodes")
	}
	ns := nn.nsName(n)
	clusterIP := fmt.Sprintf("10.%d.1.%d", nn.octet, n.index)
	m := n.index - 1
	hostMgmt := fmt.Sprintf("10.%d.%d.%d", nn.octet, 2+m/64, (m%64)*4+1)
	nodeMgmt := fmt.Sprintf("10.%d.%d.%d", nn.octet, 2+m/64, (m%64)*4+2)
	mgmtLink := fmt.Sprintf("lg%dm%d", nn.pid, n.index)
	br, err := nn.bridge(0)
	if err != nil {
		return err
	}
	steps := [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		{"link", "add", nn.hostLink(n), "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"link", "set", nn.hostLink(n), "master", br, "up"},
		{"-n", ns, "addr", "add", clusterIP + "/24", "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"link", "add", mgmtLink, "type", "veth", "peer", "name", "mgmt", "netns", ns},
		{"addr", "add", hostMgmt + "/30", "dev", mgmtLink},
		{"link", "set", mgmtLink, "up"},
		{"-n", ns, "addr", "add", nodeMgmt + "/30", "dev", "mgmt"},
		{"-n", ns, "link", "set", "mgmt", "up"},
	}
	for _, s := range steps {
		if err := runIP(s...); err != nil {
			return err
		}
	}
	n.host, n.apiHost, n.netns = clusterIP, nodeMgmt, ns
	return nil
}

// split puts each side's cluster links on a bridge of its own; side 0 keeps
// bridge 0.
func (nn *netnsNet) split(sides [][]*node) error {
	for i, side := range sides {
		br, err := nn.bridge(i)
		if err != nil {
			return err
		}
		for _, n := range side {
			if err := runIP("link", "set", nn.hostLink(n), "master", br); err != nil {
				return err
			}
		}
	}
	return nil
}

func (nn *netnsNet) heal(nodes []*node) error {
	br, err := nn.bridge(0)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if err := runIP("link", "set", nn.hostLink(n), "master", br); err != nil {
			return err
		}
	}
	return nil
}

// teardown deletes the namespaces (which takes their veths along) and the
// bridges.
func (nn *netnsNet) teardown(nodes []*node) {
	for _, n := range nodes {
		if n.netns != "" {
			_ = runIP("netns", "del", n.netns)
		}
	}
	for _, b := range nn.bridges {
		_ = runIP("link", "del", b)
	}
}

var (
	staleNS   = regexp.MustCompile(`^llmgw-(\d+)-`)
	staleLink = regexp.MustCompile(`^lg(\d+)[bcm]\d+`)
)

// netnsWorks says why net=netns cannot work here, or "".
func netnsWorks() string {
	if os.Geteuid() != 0 {
		return "requires network namespaces: run as root"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "requires network namespaces: iproute2 (ip) not found"
	}
	probe := fmt.Sprintf("llmgw-%d-probe", os.Getpid())
	if err := runIP("netns", "add", probe); err != nil {
		return "requires network namespaces: " + err.Error()
	}
	_ = runIP("netns", "del", probe)
	return ""
}

// cleanStaleNetns removes namespaces and links left by runners that died.
func cleanStaleNetns() {
	// Runs in one process are sequential: our own pid's leftovers are stale
	// too.
	alive := func(pid int) bool { return pid != os.Getpid() && syscall.Kill(pid, 0) == nil }
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			if len(f) == 0 {
				continue
			}
			if m := staleNS.FindStringSubmatch(f[0]); m != nil {
				if pid, _ := strconv.Atoi(m[1]); !alive(pid) {
					_ = runIP("netns", "del", f[0])
				}
			}
		}
	}
	if out, err := exec.Command("ip", "-o", "link", "show").Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			if len(f) < 2 {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			if m := staleLink.FindStringSubmatch(name); m != nil {
				if pid, _ := strconv.Atoi(m[1]); !alive(pid) {
					_ = runIP("link", "del", name)
				}
			}
		}
	}
}
