package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/internal/atomicfile"
	"github.com/llmgw/llmgw/supervisor/status"
)

// demoNode is what the demo remembers of one node, in <dir>/<name>.cmd.json:
// the exact command line it was started with, so that start-node starts it
// again the same way (same data dir, ports, key, token and labels).
type demoNode struct {
	Name string   `json:"name"`
	Exe  string   `json:"exe"`
	Args []string `json:"args"`
	// API is the node's HTTP address, host:port (its --api).
	API string `json:"api"`
}

func demoNodeFile(dir, name string) string { return filepath.Join(dir, name+".cmd.json") }
func demoPIDFile(dir, name string) string  { return filepath.Join(dir, name+".pid") }

func (n demoNode) save(dir string) error {
	b, err := json.MarshalIndent(n, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(demoNodeFile(dir, n.Name), append(b, '\n'), 0o600)
}

// demoNodes reads every node the demo in dir started, by name.
func demoNodes(dir string) ([]demoNode, error) {
	files, _ := filepath.Glob(filepath.Join(dir, "*.cmd.json"))
	var out []demoNode
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var n demoNode
		if err := json.Unmarshal(b, &n); err != nil || n.Name == "" || n.Exe == "" {
			return nil, fmt.Errorf("%s: not a demo node's command line (%v); remove the demo dir and run make run again", f, err)
		}
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b demoNode) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// demoNodeNamed finds name among the demo's nodes, or says which exist.
func demoNodeNamed(dir, name string) (demoNode, error) {
	nodes, err := demoNodes(dir)
	if err != nil {
		return demoNode{}, err
	}
	var names []string
	for _, n := range nodes {
		if n.Name == name {
			return n, nil
		}
		names = append(names, n.Name)
	}
	if len(names) == 0 {
		return demoNode{}, usageError(fmt.Sprintf("NAME %q: no demo was started from %s (start one with: make run)", name, dir))
	}
	return demoNode{}, usageError(fmt.Sprintf("NAME %q: no such demo node; the demo's nodes are %s", name, strings.Join(names, ", ")))
}

// pid is the node's running process, or 0.
func (n demoNode) pid(dir string) int {
	b, err := os.ReadFile(demoPIDFile(dir, n.Name))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || !processAlive(pid) {
		return 0
	}
	return pid
}

// processAlive: pid runs and has not exited. An exited child that its
// parent has not reaped yet (a zombie: the parent is a test, or a
// long-lived shell that started the demo) still answers signal 0, so the
// state in /proc decides.
func processAlive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true // no /proc: signal 0 is all there is
	}
	// "pid (comm) S ...": the state follows the last ')'.
	if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// start runs the node's command line in the background, its output
// appended to <dir>/<name>.log, in a session of its own so it outlives the
// command that started it.
func (n demoNode) start(dir string) error {
	logf, err := os.OpenFile(filepath.Join(dir, n.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(n.Exe, n.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", n.Name, err)
	}
	pid := cmd.Process.Pid
	_ = cmd.Process.Release()
	return os.WriteFile(demoPIDFile(dir, n.Name), []byte(strconv.Itoa(pid)), 0o600)
}

// waitExit waits for pid to end, and SIGKILLs it past within.
func waitExit(pid int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for processAlive(pid) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if !processAlive(pid) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

func demoStopNode(ctx context.Context, c *cli.Command) error {
	dir, n, err := demoNodeArg(c)
	if err != nil {
		return err
	}
	name := n.Name
	pid := n.pid(dir)
	if pid == 0 {
		return failure(fmt.Sprintf("%s is not running; start it with: llmgw demo start-node %s", name, name))
	}
	sig, how := syscall.SIGTERM, "SIGTERM: it left the cluster, telling the others"
	if c.Bool("kill") {
		sig, how = syscall.SIGKILL, "SIGKILL: a crash; the others notice within the failure detector's time"
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("stop %s (pid %d): %w", name, pid, err)
	}
	if err := waitExit(pid, 15*time.Second); err != nil {
		return err
	}
	_ = os.Remove(demoPIDFile(dir, name))
	w := c.Root().Writer
	fmt.Fprintf(w, "stopped %s (%s).\n", name, how)
	fmt.Fprintf(w, "Its shards' leases lapse and the others place them elsewhere where GPUs allow; its engines keep running, unrouted, until it comes back and stops what no plan wants.\n")
	fmt.Fprintf(w, "Watch: bin/llmgw shards   Bring it back with the same flags: bin/llmgw demo start-node %s\n", name)
	return nil
}

func demoStartNode(ctx context.Context, c *cli.Command) error {
	dir, n, err := demoNodeArg(c)
	if err != nil {
		return err
	}
	name := n.Name
	if pid := n.pid(dir); pid != 0 {
		return failure(fmt.Sprintf("%s runs already (pid %d); stop it first with: llmgw demo stop-node %s", name, pid, name))
	}
	if err := n.start(dir); err != nil {
		return err
	}
	if err := waitAlive(ctx, "http://"+n.API, demoRunning(dir), 30*time.Second); err != nil {
		return fmt.Errorf("%w; see %s", err, filepath.Join(dir, name+".log"))
	}
	fmt.Fprintf(c.Root().Writer, "started %s again with the flags it first had (%s); it sees every running demo node alive. Watch it rejoin: bin/llmgw shards\n",
		name, demoNodeFile(dir, name))
	return nil
}

// demoRunning counts the demo's nodes that run.
func demoRunning(dir string) int {
	nodes, _ := demoNodes(dir)
	running := 0
	for _, n := range nodes {
		if n.pid(dir) != 0 {
			running++
		}
	}
	return running
}

// demoNodeArg is the demo's dir and the one node the command names.
func demoNodeArg(c *cli.Command) (dir string, n demoNode, err error) {
	if c.Args().Len() != 1 {
		return "", demoNode{}, usageError("NAME: want exactly one demo node, e.g. node-2 (see bin/llmgw nodes)")
	}
	if dir, err = filepath.Abs(c.String("dir")); err != nil {
		return "", demoNode{}, err
	}
	n, err = demoNodeNamed(dir, c.Args().First())
	return dir, n, err
}

// demoUnplaceAll removes every deployment through the first running node
// and says what it removes, then waits until no node holds a shard: the
// engines outlive their agents by design, the demo's should not outlive
// the demo.
func demoUnplaceAll(ctx context.Context, c *cli.Command, dir string, nodes []demoNode) {
	w := c.Root().Writer
	tok, err := os.ReadFile(filepath.Join(dir, "token"))
	if err != nil {
		fmt.Fprintf(c.Root().ErrWriter, "cannot unplace: %v\n", err)
		return
	}
	var cl *client
	var deps []status.DeploymentInfo
	for _, n := range nodes {
		try := &client{base: "http://" + n.API, token: strings.TrimSpace(string(tok)), http: &http.Client{Timeout: 2 * time.Second}}
		if try.do(ctx, "GET", "/v1/deployments", nil, "", &deps) == nil {
			cl = try
			break
		}
	}
	if cl == nil {
		fmt.Fprintln(c.Root().ErrWriter, "no demo node answers: nothing unplaced")
		return
	}
	if len(deps) == 0 {
		fmt.Fprintln(w, "nothing is placed")
	}
	for _, d := range deps {
		if err := cl.do(ctx, "DELETE", "/v1/deployments/"+d.Name, nil, "", nil); err != nil {
			fmt.Fprintf(c.Root().ErrWriter, "unplace %s: %v\n", d.Name, err)
			continue
		}
		fmt.Fprintf(w, "unplaced %s (%s, %s engine, %d replicas, %d ready)\n", d.Name, d.Model, d.Engine, d.Replicas, d.Ready)
	}
	err = poll(ctx, 20*time.Second, func() (bool, string) {
		var info status.ClusterInfo
		if err := cl.do(ctx, "GET", "/v1/cluster", nil, "", &info); err != nil {
			return true, "" // the nodes are gone already
		}
		held := 0
		for _, m := range info.Members {
			held += len(m.Shards)
		}
		return held == 0, fmt.Sprintf("%d shards still held", held)
	})
	if err != nil {
		fmt.Fprintln(c.Root().ErrWriter, "some engines did not stop in time; see the node logs")
		return
	}
	if len(deps) > 0 {
		fmt.Fprintln(w, "every engine stopped")
	}
}
