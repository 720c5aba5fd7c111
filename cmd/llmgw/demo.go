package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/supervisor"
	"github.com/llmgw/llmgw/supervisor/status"
)

// demoCommand runs a whole cluster on this machine: real `llmgw node up`
// processes on loopback with simulated GPUs, detached so the newcomer's
// shell is free to look at it.
func demoCommand() *cli.Command {
	dirFlag := &cli.StringFlag{Name: "dir", Value: ".demo", Usage: "where the demo keeps data dirs, logs and pids"}
	return &cli.Command{
		Name:  "demo",
		Usage: "run a local cluster with simulated GPUs (make run / make stop)",
		Commands: []*cli.Command{
			{
				Name:  "up",
				Usage: "start the demo cluster in the background",
				Flags: []cli.Flag{
					dirFlag,
					&cli.IntFlag{Name: "nodes", Value: 3},
					&cli.StringFlag{Name: "simulate-gpus", Value: "4xH100-80GB", Usage: "simulated GPUs per node, as node up's --simulate-gpus"},
					renamed("gpus", "simulate-gpus"),
					&cli.IntFlag{Name: "api-port", Value: 7070, Usage: "API port of the first node; the others follow"},
					&cli.IntFlag{Name: "gossip-port", Value: 7946, Usage: "gossip port of the first node; the others follow"},
					&cli.IntFlag{Name: "gateway-port", Value: 8000, Usage: "gateway port of the first node; the others follow"},
				},
				Action: demoUp,
			},
			{
				Name:   "down",
				Usage:  "unplace everything (saying what), then stop the demo cluster",
				Flags:  []cli.Flag{dirFlag},
				Action: demoDown,
			},
			{
				Name:      "stop-node",
				Usage:     "rehearse a failure: stop one demo node (SIGTERM, or --kill for a crash)",
				ArgsUsage: "NAME",
				Flags:     []cli.Flag{dirFlag, &cli.BoolFlag{Name: "kill", Usage: "SIGKILL the agent, as a crash would (its engines keep running)"}},
				Action:    demoStopNode,
			},
			{
				Name:      "start-node",
				Usage:     "start a stopped demo node again, with the flags the demo first gave it",
				ArgsUsage: "NAME",
				Flags:     []cli.Flag{dirFlag},
				Action:    demoStartNode,
			},
		},
	}
}

func demoUp(ctx context.Context, c *cli.Command) error {
	n := int(c.Int("nodes"))
	apiPort, gossipPort, gatewayPort := int(c.Int("api-port")), int(c.Int("gossip-port")), int(c.Int("gateway-port"))
	if n < 1 || n > 100 {
		return usageError(fmt.Sprintf("--nodes %d: want 1-100", n))
	}
	for _, p := range []struct {
		flag string
		port int
	}{{"--api-port", apiPort}, {"--gossip-port", gossipPort}, {"--gateway-port", gatewayPort}} {
		if p.port < 1 || p.port+n-1 > 65535 {
			return usageError(fmt.Sprintf("%s %d: the %d nodes need ports %d-%d; want them within 1-65535", p.flag, p.port, n, p.port, p.port+n-1))
		}
	}
	dir, err := filepath.Abs(c.String("dir"))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("--dir: %w", err)
	}
	if pids := demoPIDs(dir); len(pids) > 0 {
		var list []string
		for file, pid := range pids {
			list = append(list, fmt.Sprintf("%s %d", strings.TrimSuffix(filepath.Base(file), ".pid"), pid))
		}
		sort.Strings(list)
		return failure(fmt.Sprintf("a demo cluster already runs from %s (%s); stop it with: make stop", dir, strings.Join(list, ", ")))
	}
	tokenFile := filepath.Join(dir, "token")
	if _, err := os.Stat(tokenFile); err != nil {
		if err := os.WriteFile(tokenFile, []byte(supervisor.NewToken()+"\n"), 0o600); err != nil {
			return err
		}
	}
	// One gossip key for the demo's nodes: the demo runs encrypted, as a
	// real cluster must (a node refuses to gossip in the clear unasked).
	keyFile := filepath.Join(dir, "gossip.key")
	if _, err := os.Stat(keyFile); err != nil {
		if _, err := writeNewGossipKey(keyFile); err != nil {
			return err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	first := fmt.Sprintf("127.0.0.1:%d", gossipPort)
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("node-%d", i+1)
		args := []string{"node", "up", "--name", name,
			"--data-dir", filepath.Join(dir, name),
			"--bind", fmt.Sprintf("127.0.0.1:%d", gossipPort+i),
			"--api", fmt.Sprintf("127.0.0.1:%d", apiPort+i),
			"--gateway", fmt.Sprintf("127.0.0.1:%d", gatewayPort+i),
			"--profile", "local",
			"--runtime", "process",
			"--simulate-gpus", c.String("simulate-gpus"),
			"--token-file", tokenFile,
			"--gossip-key-file", keyFile,
			"--label", "zone=demo-" + strconv.Itoa(i%2),
			// The node's own log, which llmgw overview reads; stdout and
			// stderr (a panic, the gateway's access log) go there too.
			"--log-file", filepath.Join(dir, name+".log"),
		}
		if i > 0 {
			args = append(args, "--join", first)
		}
		// Remembered first, so start-node can start it again the same way.
		node := demoNode{Name: name, Exe: self, Args: args, API: fmt.Sprintf("127.0.0.1:%d", apiPort+i)}
		if err := node.save(dir); err != nil {
			return err
		}
		if err := node.start(dir); err != nil {
			return err
		}
	}
	addr := fmt.Sprintf("http://127.0.0.1:%d", apiPort)
	// demo down drains through the same node.
	_ = os.WriteFile(filepath.Join(dir, "addr"), []byte(addr+"\n"), 0o600)
	if err := waitAlive(ctx, addr, n, 30*time.Second); err != nil {
		return fmt.Errorf("%w; see the logs in %s", err, dir)
	}
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		return err
	}
	cl := &client{base: addr, token: strings.TrimSpace(string(tok)), http: &http.Client{Timeout: 5 * time.Second}}
	spec := []byte(`{"name":"chat","model":"demo/tiny-chat","engine":"fake","replicas":2}`)
	if err := cl.do(ctx, "POST", "/v1/deployments", spec, "application/json", nil); err != nil {
		return fmt.Errorf("place the demo deployment: %w", err)
	}
	if err := waitServing(ctx, cl, "chat", 2, 30*time.Second); err != nil {
		return fmt.Errorf("%w; see the logs in %s", err, dir)
	}
	// Every node's gateway serves the whole cluster: ask the last node's,
	// whichever nodes the replicas landed on.
	gw := fmt.Sprintf("http://127.0.0.1:%d", gatewayPort+n-1)
	if err := waitGateway(ctx, gw, "chat", 30*time.Second); err != nil {
		return fmt.Errorf("%w; see the logs in %s", err, dir)
	}
	w := c.Root().Writer
	fmt.Fprintf(w, "llmgw demo: %d nodes alive on 127.0.0.1 (API ports %d-%d), %s simulated GPUs each,\n", n, apiPort, apiPort+n-1, c.String("simulate-gpus"))
	fmt.Fprintf(w, "and deployment \"chat\" (the built-in fake engine, 2 replicas) is serving. Gossip is encrypted with %s.\n\n", keyFile)
	fmt.Fprintf(w, "Look at it:\n  bin/llmgw nodes\n  bin/llmgw models\n  bin/llmgw shards\n  bin/llmgw top\n  bin/llmgw overview --data-dir %s   (node-1's own screen, as sudo llmgw on a node)\n  open %s/ in a browser\n\n", filepath.Join(dir, "node-1"), addr)
	fmt.Fprintf(w, "Ask it through any node's gateway (ports %d-%d, OpenAI's API):\n  curl -s %s/v1/chat/completions -d '{\"model\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}'\n  bin/llmgw chat --gateway-addr %s chat \"hello\"\n\n", gatewayPort, gatewayPort+n-1, gw, gw)
	fmt.Fprintf(w, "Change it and read engine logs (both need the cluster token):\n  export LLMGW_TOKEN_FILE=%s\n  bin/llmgw place chat --model demo/tiny-chat --engine fake --replicas 3\n  bin/llmgw logs chat-0\n\n", tokenFile)
	fmt.Fprintf(w, "Rehearse a failure: bin/llmgw demo stop-node node-%d (--kill for a crash), watch bin/llmgw shards, then bin/llmgw demo start-node node-%d\n\n", n, n)
	fmt.Fprintf(w, "Logs: %s/node-*.log   Stop: make stop\n", dir)
	return nil
}

// waitGateway waits until the gateway at base lists model as served.
func waitGateway(ctx context.Context, base, model string, within time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	err := poll(ctx, within, func() (bool, string) {
		req, err := http.NewRequestWithContext(ctx, "GET", base+"/v1/models", nil)
		if err != nil {
			return false, err.Error()
		}
		resp, err := hc.Do(req)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		var list struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
			return false, fmt.Sprintf("HTTP %d: %v", resp.StatusCode, err)
		}
		for _, m := range list.Data {
			if m.ID == model {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%s not listed yet", model)
	})
	if err != nil {
		return fmt.Errorf("the gateway at %s does not serve %s: %w", base, model, err)
	}
	return nil
}

// poll calls check every 200ms until it reports done, ctx ends or within
// passes; on timeout the error carries check's last status.
func poll(ctx context.Context, within time.Duration, check func() (done bool, status string)) error {
	deadline := time.Now().Add(within)
	last := "no answer"
	for time.Now().Before(deadline) {
		var done bool
		if done, last = check(); done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("not within %v (%s)", within, last)
}

// waitServing waits until deployment name has want ready replicas.
func waitServing(ctx context.Context, cl *client, name string, want int, within time.Duration) error {
	err := poll(ctx, within, func() (bool, string) {
		var shards []status.ShardInfo
		if err := cl.do(ctx, "GET", "/v1/shards", nil, "", &shards); err != nil {
			return false, err.Error()
		}
		ready := 0
		for _, s := range shards {
			if s.Deployment == name && s.Lease == "valid" {
				ready++
			}
		}
		return ready >= want, fmt.Sprintf("%d of %d replicas ready", ready, want)
	})
	if err != nil {
		return fmt.Errorf("deployment %s did not become ready: %w", name, err)
	}
	return nil
}

func waitAlive(ctx context.Context, addr string, n int, within time.Duration) error {
	cl := &client{base: addr, http: &http.Client{Timeout: 2 * time.Second}}
	err := poll(ctx, within, func() (bool, string) {
		var info status.ClusterInfo
		if err := cl.do(ctx, "GET", "/v1/cluster", nil, "", &info); err != nil {
			return false, err.Error()
		}
		alive := 0
		for _, m := range info.Members {
			if m.State == "alive" {
				alive++
			}
		}
		return alive == n, fmt.Sprintf("%d of %d alive", alive, n)
	})
	if err != nil {
		return fmt.Errorf("the demo cluster did not come up: %w", err)
	}
	return nil
}

func demoPIDs(dir string) map[string]int {
	out := map[string]int{}
	files, _ := filepath.Glob(filepath.Join(dir, "*.pid"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || !processAlive(pid) {
			_ = os.Remove(f)
			continue
		}
		out[f] = pid
	}
	return out
}

func demoDown(ctx context.Context, c *cli.Command) error {
	dir, err := filepath.Abs(c.String("dir"))
	if err != nil {
		return err
	}
	pids := demoPIDs(dir)
	nodes, err := demoNodes(dir)
	if err != nil {
		return err
	}
	if len(pids) == 0 && len(nodes) == 0 {
		fmt.Fprintln(c.Root().Writer, "no demo cluster is running")
		return nil
	}
	// A node stopped with stop-node left its engines running, and only it
	// stops them: start it first, so that the unplace reaches them too.
	for _, n := range nodes {
		if n.pid(dir) == 0 {
			fmt.Fprintf(c.Root().Writer, "starting %s again so that it stops the engines it left running\n", n.Name)
			if err := n.start(dir); err != nil {
				fmt.Fprintf(c.Root().ErrWriter, "%v\n", err)
			}
		}
	}
	if len(nodes) > 0 {
		_ = waitAlive(ctx, "http://"+nodes[0].API, demoRunning(dir), 30*time.Second)
	}
	demoUnplaceAll(ctx, c, dir, nodes)
	pids = demoPIDs(dir)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	for f, pid := range pids {
		if err := waitExit(pid, 15*time.Second); err != nil {
			return err
		}
		_ = os.Remove(f)
	}
	// The demo is over: nothing is left for start-node to start.
	for _, n := range nodes {
		_ = os.Remove(demoNodeFile(dir, n.Name))
	}
	fmt.Fprintf(c.Root().Writer, "stopped %d demo nodes\n", len(pids))
	return nil
}
