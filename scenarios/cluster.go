package scenarios

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
)

// clusterCfg is what the cluster command fixed for every node it starts.
type clusterCfg struct {
	gpus     string
	profile  string
	leaseTTL time.Duration
	runtime  string
	logLevel string
}

// node is one `llmgw node up` process the runner manages.
type node struct {
	name       string
	gossipPort int
	apiPort    int
	dataDir    string
	logPath    string
	gpus       string
	labels     []string
	// index is the node's number in creation order, from 1.
	index int
	// host is where gossip binds, apiHost where the API does: 127.0.0.1,
	// or the node's addresses in its namespace (net=netns).
	host, apiHost, netns string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	state  *os.ProcessState
	frozen bool
	// everStarted: others may list it in --join.
	everStarted bool
	// drop is the partition rule last installed on this node, re-installed
	// after a restart.
	drop []string
}

func (n *node) api() string    { return fmt.Sprintf("http://%s:%d", n.apiHost, n.apiPort) }
func (n *node) gossip() string { return fmt.Sprintf("%s:%d", n.host, n.gossipPort) }

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
	n := &node{
		name: name, gossipPort: gp, apiPort: ap, gpus: gpus, labels: labels, index: len(r.nodes) + 1,
		dataDir: filepath.Join(r.work, name), logPath: filepath.Join(r.work, name+".log"),
		host: "127.0.0.1", apiHost: "127.0.0.1",
	}
	if r.nn != nil {
		if err := r.nn.addNode(n); err != nil {
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
	args := []string{"node", "up",
		"--name", n.name,
		"--data-dir", n.dataDir,
		"--bind", n.gossip(),
		"--api", fmt.Sprintf("%s:%d", n.apiHost, n.apiPort),
		"--profile", r.cfg.profile,
		"--simulate-gpus", n.gpus,
		"--token-file", r.tokenFile,
		"--lease-ttl", r.cfg.leaseTTL.String(),
		"--runtime", r.cfg.runtime,
		"--log-level", r.cfg.logLevel,
		"--test-hooks",
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
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "%s%s at %s\n", startMarker, n.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(r.opts.Binary, args...)
	if n.netns != "" {
		// ip netns exec execs the binary: the pid is the agent's.
		cmd = exec.Command("ip", append([]string{"netns", "exec", n.netns, r.opts.Binary}, args...)...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "GOTRACEBACK=all")
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
		if !clock.Sleep(ctx, 25*time.Millisecond) {
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

// engineProcs lists the engine processes started from the runner's binary
// (argv[1] == "engine"), whoever started them. Engines outlive their agent,
// so this is how orphans are found and how the teardown finds everything.
func engineProcs(binary string) map[int][]string {
	out := map[int][]string{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || strings.TrimSuffix(exe, " (deleted)") != binary {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(argv) > 1 && argv[1] == "engine" && !zombie(pid) {
			out[pid] = argv
		}
	}
	return out
}

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z' || b[i+2] == 'X'
}

// teardown kills every agent and every engine of this run.
func (r *runner) teardown() {
	for _, l := range r.loops {
		l.halt()
	}
	for _, n := range r.nodes {
		if p := n.pid(); p != 0 && n.running() {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
	for _, n := range r.nodes {
		n.waitExit(5 * time.Second)
	}
	for range 3 {
		procs := engineProcs(r.opts.Binary)
		if len(procs) == 0 {
			return
		}
		for pid := range procs {
			if pg, err := syscall.Getpgid(pid); err == nil && pg == pid {
				_ = syscall.Kill(-pid, syscall.SIGKILL)
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// teardownNet removes the namespaces and bridges of net=netns.
func (r *runner) teardownNet() {
	if r.nn != nil {
		r.nn.teardown(r.nodes)
	}
}

// resolveNodes turns node references into nodes: a name, an alias set with
// as=, "@SHARD" (the node the plan gives that shard), or "all".
func (r *runner) resolveNodes(ctx context.Context, refs []string) ([]*node, []string, error) {
	var out []*node
	var labels []string
	for _, ref := range refs {
		switch {
		case ref == "all":
			for _, n := range r.nodes {
				out = append(out, n)
				labels = append(labels, n.name)
			}
		case strings.HasPrefix(ref, "@"):
			shard := ref[1:]
			name, err := r.holderOf(ctx, shard)
			if err != nil {
				return nil, nil, err
			}
			out = append(out, r.byName[name])
			labels = append(labels, "the node planned for "+shard)
		default:
			name := ref
			label := ref
			if a, ok := r.aliases[ref]; ok {
				name = a
			}
			n, ok := r.byName[name]
			if !ok {
				return nil, nil, usagef("no node or alias %q", ref)
			}
			out = append(out, n)
			labels = append(labels, label)
		}
	}
	var uniq []*node
	var ulabels []string
	for i, n := range out {
		if !slices.Contains(uniq, n) {
			uniq = append(uniq, n)
			ulabels = append(ulabels, labels[i])
		}
	}
	return uniq, ulabels, nil
}

// holderOf is the node the first answering node's plan gives the shard (the
// current spec version's assignment when there are several).
func (r *runner) holderOf(ctx context.Context, shard string) (string, error) {
	obs := r.observers(nil)
	if len(obs) == 0 {
		return "", errors.New("no node is up to ask")
	}
	var p planInfo
	if err := r.get(ctx, obs[0], "/v1/plan", &p); err != nil {
		return "", err
	}
	name := ""
	for _, a := range p.Plan.Assignments {
		if a.ShardID == shard && (name == "" || !a.Draining) {
			name = a.Node
		}
	}
	if name == "" {
		return "", fmt.Errorf("no node is planned for shard %s", shard)
	}
	if _, ok := r.byName[name]; !ok {
		return "", fmt.Errorf("shard %s is planned on %s, a node this scenario did not start", shard, name)
	}
	return name, nil
}

// observers are the nodes that answer (running, not frozen), in creation
// order, limited to only when it is non-nil.
func (r *runner) observers(only []*node) []*node {
	var out []*node
	for _, n := range r.nodes {
		if only != nil && !slices.Contains(only, n) {
			continue
		}
		if n.up() {
			out = append(out, n)
		}
	}
	return out
}
