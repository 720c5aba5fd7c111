package scenarios

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
)

// node is one `llmgw node up` process the runner manages.
type node struct {
	name       string
	gossipPort int
	apiPort    int
	// gatewayPort is where the node's gateway listens, on apiHost.
	gatewayPort int
	dataDir     string
	logPath     string
	gpus        string
	labels      []string
	// index is the node's number in creation order, from 1.
	index int
	// host is where gossip binds, apiHost where the API does: 127.0.0.1,
	// or the node's addresses in its namespace (net=netns).
	host, apiHost, netns string

	mu sync.Mutex
	// binary names the llmgw binary the agent runs (build-binary's NAME,
	// or "current", the runner's own); set at each start.
	binary string
	cmd    *exec.Cmd
	exited chan struct{}
	state  *os.ProcessState
	frozen bool
	// everStarted: others may list it in --join.
	everStarted bool
	// partitionRule is the rule last installed on this node with
	// net=loopback (the nodes whose gossip it drops), re-installed after a
	// restart.
	partitionRule []string
}

func (n *node) api() string     { return fmt.Sprintf("http://%s:%d", n.apiHost, n.apiPort) }
func (n *node) gateway() string { return fmt.Sprintf("http://%s:%d", n.apiHost, n.gatewayPort) }
func (n *node) gossip() string  { return fmt.Sprintf("%s:%d", n.host, n.gossipPort) }

// running: the agent process exists and has not exited (it may be frozen).
func (n *node) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// up: running and not frozen, so it answers.
func (n *node) up() bool {
	if !n.running() {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return !n.frozen
}

func (n *node) isFrozen() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.frozen && n.cmd != nil
}

// binaryName is the name of the binary the agent runs (or last ran).
func (n *node) binaryName() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.binary
}

// setBinary makes the node's next start run the named binary.
func (n *node) setBinary(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.binary = name
}

func (n *node) pid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.cmd.Process == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

func (r *runner) newNode(name, gpus string, labels []string) (*node, error) {
	if _, ok := r.byName[name]; ok {
		return nil, usagef("node %s exists already", name)
	}
	if !keyRE.MatchString(name) {
		return nil, usagef("node name %q: want lower-case letters, digits and '-'", name)
	}
	gp, err := r.opts.Ports.Next()
	if err != nil {
		return nil, err
	}
	ap, err := r.opts.Ports.Next()
	if err != nil {
		return nil, err
	}
	gwp, err := r.opts.Ports.Next()
	if err != nil {
		return nil, err
	}
	n := &node{
		name: name, gossipPort: gp, apiPort: ap, gatewayPort: gwp, gpus: gpus, labels: labels, index: len(r.nodes) + 1,
		dataDir: filepath.Join(r.work, name), logPath: filepath.Join(r.work, name+".log"),
		host: "127.0.0.1", apiHost: "127.0.0.1", binary: currentBinary,
	}
	if r.namespaces != nil {
		if err := r.namespaces.addNode(n); err != nil {
			return nil, err
		}
	}
	r.nodes = append(r.nodes, n)
	r.byName[name] = n
	return n, nil
}

// start launches the agent with its fixed name, data dir and ports; join
// lists every other node the runner knows, so a node finds the cluster
// whichever of them is up.
func (r *runner) start(n *node) error {
	if n.running() {
		return fmt.Errorf("%s is running already", n.name)
	}
	// binary= names only built binaries (binaryKey), so this is a check
	// of the runner itself.
	bin := r.binaries[n.binaryName()]
	if bin == "" {
		return fmt.Errorf("start %s: no binary %q", n.name, n.binaryName())
	}
	args := []string{"node", "up",
		"--name", n.name,
		"--data-dir", n.dataDir,
		"--bind", n.gossip(),
		"--api", fmt.Sprintf("%s:%d", n.apiHost, n.apiPort),
		"--gateway", fmt.Sprintf("%s:%d", n.apiHost, n.gatewayPort),
		"--profile", r.cfg.profile,
		"--simulate-gpus", n.gpus,
		"--token-file", r.tokenFile,
		"--gossip-key-file", r.gossipKeyFile,
		"--lease-ttl", r.cfg.leaseTTL.String(),
		"--runtime", r.cfg.runtime,
		"--log-level", r.cfg.logLevel,
		"--test-hooks",
		// Each node has a weights dir of its own (the weights command
		// writes header-only models there), rescanned every second, and
		// no hub: a scenario never reaches the internet.
		"--weights-dir", n.weightsDir(),
		"--weights-interval", "1s",
		"--hub-url", "",
	}
	// Join a few running nodes (memberlist contacts every address given:
	// thirty nodes each joining all others is hundreds of push/pulls), or
	// every node ever started when none runs (a full restart).
	var join, all []string
	for _, o := range r.nodes {
		if o == n || !o.everStarted {
			continue
		}
		all = append(all, o.gossip())
		if o.up() && len(join) < 3 {
			join = append(join, o.gossip())
		}
	}
	if len(join) == 0 {
		join = all
	}
	if len(join) > 0 {
		args = append(args, "--join", strings.Join(join, ","))
	}
	for _, l := range n.labels {
		args = append(args, "--label", l)
	}
	args = append(args, r.cfg.nodeFlags...)
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "%s%s at %s\n", startMarker, n.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(bin, args...)
	if n.netns != "" {
		// ip netns exec execs the binary: the pid is the agent's.
		cmd = exec.Command("ip", append([]string{"netns", "exec", n.netns, bin}, args...)...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// The run's engines first on PATH (engines.go).
	cmd.Env = r.nodeEnv()
	// Its own process group, so a terminal's ^C reaches the runner only;
	// killed with the runner if the runner dies (the engines it started
	// are not, as in production: the teardown finds them by executable).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", n.name, err)
	}
	logf.Close()
	exited := make(chan struct{})
	n.mu.Lock()
	n.cmd, n.exited, n.state, n.frozen, n.everStarted = cmd, exited, nil, false, true
	n.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		n.mu.Lock()
		n.state = cmd.ProcessState
		n.mu.Unlock()
		close(exited)
	}()
	return nil
}

// waitHealthy waits until the node's API answers, or reports why it exited.
func (r *runner) waitHealthy(ctx context.Context, n *node, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		n.mu.Lock()
		exited := n.exited
		n.mu.Unlock()
		select {
		case <-exited:
			return fmt.Errorf("%s exited during start (%s): %s", n.name, n.exitStatus(), lastLogError(n.logPath))
		default:
		}
		if err := r.get(ctx, n, "/healthz", nil); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: API did not answer within %v", n.name, within)
		}
		if !clock.SleepReal(ctx, 25*time.Millisecond) {
			return ctx.Err()
		}
	}
}

func (n *node) exitStatus() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.state == nil {
		return "running"
	}
	if ws, ok := n.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "killed by " + ws.Signal().String()
	}
	return "exit " + strconv.Itoa(n.state.ExitCode())
}

// signal sends sig to the agent (not to its engines).
func (n *node) signal(sig syscall.Signal) error {
	p := n.pid()
	if p == 0 || !n.running() {
		return fmt.Errorf("%s is not running", n.name)
	}
	return syscall.Kill(p, sig)
}

func (n *node) waitExit(within time.Duration) bool {
	n.mu.Lock()
	exited := n.exited
	n.mu.Unlock()
	if exited == nil {
		return true
	}
	select {
	case <-exited:
		return true
	case <-time.After(within):
		return false
	}
}

// lastLogError says why a node's last run failed, from its log: a panic or
// fatal runtime error, else the CLI's "llmgw: <error>" line, else the last
// line. Only the part after the runner's last start marker is read.
func lastLogError(path string) string {
	lines := lastRun(path)
	for _, l := range lines {
		if strings.HasPrefix(l, "panic: ") || strings.HasPrefix(l, "fatal error: ") {
			return l
		}
	}
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "llmgw: ") {
			return lines[i]
		}
	}
	if len(lines) > 0 {
		return lines[len(lines)-1]
	}
	return "(empty log)"
}

const startMarker = "=== scenario runner: starting "

// lastRun is the log of the node's latest start.
func lastRun(path string) []string {
	b, _ := os.ReadFile(path)
	s := string(b)
	if i := strings.LastIndex(s, startMarker); i >= 0 {
		s = s[i:]
	}
	return strings.Split(strings.TrimSpace(s), "\n")
}

// logTail is the end of a node's log, or from the first panic on when there
// is one (a goroutine dump's end says little).
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "panic: ") || strings.HasPrefix(l, "fatal error: ") {
			lines = lines[i:]
			if len(lines) > 3*n {
				lines = lines[:3*n]
			}
			return strings.Join(lines, "\n")
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// weightsDir is the node's --weights-dir.
func (n *node) weightsDir() string { return n.dataDir + "-weights" }
