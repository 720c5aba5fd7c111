package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/supervisor"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/engine"
	"github.com/llmgw/llmgw/supervisor/mcpserver"
	"github.com/llmgw/llmgw/supervisor/nodemetrics"
	"github.com/llmgw/llmgw/supervisor/page"
)

func nodeCommand() *cli.Command {
	return &cli.Command{
		Name:  "node",
		Usage: "run this machine as a cluster node",
		Commands: []*cli.Command{{
			Name:   "up",
			Usage:  "join (or start) the cluster and serve this node's GPUs",
			Flags:  nodeFlags(),
			Action: nodeUp,
		}},
	}
}

func nodeFlags() []cli.Flag {
	host, _ := os.Hostname()
	return []cli.Flag{
		&cli.StringFlag{Name: "name", Value: host, Usage: "node name; must stay the same across restarts", Sources: cli.EnvVars("LLMGW_NAME")},
		&cli.StringFlag{Name: "data-dir", Value: "/var/lib/llmgw", Usage: "node identity, remembered peers, deployments and shard state", Sources: cli.EnvVars("LLMGW_DATA_DIR")},
		&cli.StringFlag{Name: "bind", Value: "0.0.0.0:7946", Usage: "gossip listen host:port (UDP and TCP)", Sources: cli.EnvVars("LLMGW_BIND")},
		&cli.StringFlag{Name: "advertise", Usage: "gossip address peers dial; required with a wildcard --bind on a host with several addresses", Sources: cli.EnvVars("LLMGW_ADVERTISE")},
		&cli.StringFlag{Name: "api", Value: "0.0.0.0:7070", Usage: "HTTP API listen host:port", Sources: cli.EnvVars("LLMGW_API")},
		&cli.StringSliceFlag{Name: "join", Usage: "gossip host:port of a node to join (repeatable); retried in the background", Sources: cli.EnvVars("LLMGW_JOIN")},
		&cli.StringFlag{Name: "gossip-key-file", Usage: "file with a base64 16, 24 or 32-byte key: encrypts gossip (AES-GCM)", Sources: cli.EnvVars("LLMGW_GOSSIP_KEY_FILE")},
		&cli.StringFlag{Name: "token-file", Usage: "file with the cluster token for mutating calls and MCP (default: <data-dir>/token, created if missing)", Sources: cli.EnvVars("LLMGW_TOKEN_FILE")},
		&cli.StringSliceFlag{Name: "label", Usage: "node label k=v (repeatable), matched by deployments' labels", Sources: cli.EnvVars("LLMGW_LABEL")},
		&cli.StringFlag{Name: "profile", Value: "lan", Usage: "memberlist timings: lan (its LAN defaults) or local (fast, one machine or rack)", Sources: cli.EnvVars("LLMGW_PROFILE")},
		&cli.StringFlag{Name: "simulate-gpus", Usage: "DEV/TEST ONLY: advertise simulated GPUs, e.g. 4xH100-80GB,2xL40S-48GB", Sources: cli.EnvVars("LLMGW_SIMULATE_GPUS")},
		&cli.DurationFlag{Name: "lease-ttl", Value: 10 * time.Second, Usage: "a shard's lease lapses this long after its last renewal", Sources: cli.EnvVars("LLMGW_LEASE_TTL")},
		&cli.StringFlag{Name: "runtime", Value: "auto", Usage: "how engines run: containerd, process (host processes and the built-in fake engine), none (claim shards, run nothing), or auto (containerd when its socket answers, else process)", Sources: cli.EnvVars("LLMGW_RUNTIME")},
		&cli.StringFlag{Name: "containerd-socket", Value: "/run/containerd/containerd.sock", Usage: "containerd's socket", Sources: cli.EnvVars("LLMGW_CONTAINERD_SOCKET")},
		&cli.StringFlag{Name: "containerd-namespace", Value: "llmgw", Usage: "containerd namespace for engines", Sources: cli.EnvVars("LLMGW_CONTAINERD_NAMESPACE")},
		&cli.StringFlag{Name: "weights-dir", Usage: "model weights cache, bind-mounted into engine containers", Sources: cli.EnvVars("LLMGW_WEIGHTS_DIR")},
		&cli.StringFlag{Name: "engine-ports", Value: "8100-8999", Usage: "port range for engines' HTTP servers", Sources: cli.EnvVars("LLMGW_ENGINE_PORTS")},
		&cli.StringSliceFlag{Name: "allow-from", Usage: "only accept HTTP requests from these CIDRs (repeatable or comma-separated)", Sources: cli.EnvVars("LLMGW_ALLOW_FROM")},
		&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error", Sources: cli.EnvVars("LLMGW_LOG_LEVEL")},
		&cli.BoolFlag{Name: "test-hooks", Hidden: true, Usage: "TEST ONLY: enable partition simulation endpoints", Sources: cli.EnvVars("LLMGW_TEST_HOOKS")},
	}
}

// nodeConfig turns flags into a supervisor.Config. Every error names the
// flag and says what is wanted; nothing has started when it returns.
func nodeConfig(c *cli.Command, log *slog.Logger) (supervisor.Config, error) {
	cfg := supervisor.Config{Name: c.String("name"), DataDir: c.String("data-dir"), Version: version, Logger: log, LeaseTTL: c.Duration("lease-ttl"), TestHooks: c.Bool("test-hooks"),
		// One clock for the node and its engine runner.
		Clock: clock.Real()}
	if cfg.Name == "" || strings.ContainsAny(cfg.Name, " /\t\n") {
		return cfg, fmt.Errorf("--name %q: want a non-empty name without spaces or '/'", cfg.Name)
	}
	if cfg.LeaseTTL < time.Second {
		return cfg, fmt.Errorf("--lease-ttl %v: want at least 1s", cfg.LeaseTTL)
	}
	var err error
	if cfg.DataDir, err = filepath.Abs(cfg.DataDir); err != nil {
		return cfg, fmt.Errorf("--data-dir: %w", err)
	}
	host, port, err := splitHostPort("--bind", c.String("bind"))
	if err != nil {
		return cfg, err
	}
	cfg.BindAddr, cfg.BindPort = host, port
	if adv := c.String("advertise"); adv != "" {
		if !strings.Contains(adv, ":") {
			adv = net.JoinHostPort(adv, strconv.Itoa(port))
		}
		h, p, err := splitHostPort("--advertise", adv)
		if err != nil {
			return cfg, err
		}
		if net.ParseIP(h) == nil {
			return cfg, fmt.Errorf("--advertise %q: want an IP address (optionally with :port) that peers can dial", c.String("advertise"))
		}
		cfg.AdvertiseAddr, cfg.AdvertisePort = h, p
	} else if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		addr, err := soleAddress()
		if err != nil {
			return cfg, err
		}
		cfg.AdvertiseAddr, cfg.AdvertisePort = addr, port
	}
	if _, _, err := splitHostPort("--api", c.String("api")); err != nil {
		return cfg, err
	}
	cfg.APIAddr = c.String("api")
	for _, j := range splitList(c.StringSlice("join")) {
		if err := supervisor.ValidateJoin(j); err != nil {
			return cfg, err
		}
		cfg.Join = append(cfg.Join, j)
	}
	if f := c.String("gossip-key-file"); f != "" {
		if cfg.GossipKey, err = readGossipKey(f); err != nil {
			return cfg, err
		}
	} else if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		// Gossip carries deployments (image, args, env): whoever can send
		// to this port unencrypted can run code on every node.
		log.Warn("GOSSIP IS NOT ENCRYPTED: no --gossip-key-file, and --bind is reachable from other hosts; anyone who can reach it can change what this cluster runs", "bind", c.String("bind"))
	}
	if cfg.Labels, err = parseKV("--label", splitList(c.StringSlice("label"))); err != nil {
		return cfg, err
	}
	if cfg.Profile, err = gossip.ProfileByName(c.String("profile")); err != nil {
		return cfg, fmt.Errorf("--profile: %w", err)
	}
	for _, cidr := range splitList(c.StringSlice("allow-from")) {
		_, n, err := net.ParseCIDR(cidr)
		if err != nil {
			return cfg, fmt.Errorf("--allow-from %q: want a CIDR such as 10.0.0.0/8", cidr)
		}
		cfg.AllowFrom = append(cfg.AllowFrom, n)
	}
	if spec := c.String("simulate-gpus"); spec != "" {
		sim, err := gpu.NewSimulated(spec, cfg.Name)
		if err != nil {
			return cfg, fmt.Errorf("--simulate-gpus: %w", err)
		}
		cfg.GPUs, cfg.GPUsSimulated = sim, true
	} else {
		cfg.GPUs = gpu.System()
	}
	switch c.String("runtime") {
	case "none", "process", "containerd", "auto":
	default:
		return cfg, fmt.Errorf("--runtime %q: want containerd, process, none or auto", c.String("runtime"))
	}
	if _, _, err := parsePortRange(c.String("engine-ports")); err != nil {
		return cfg, err
	}
	return cfg, nil
}

func nodeUp(ctx context.Context, c *cli.Command) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return usageError(fmt.Sprintf("--log-level %q: want debug, info, warn or error", c.String("log-level")))
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	cfg, err := nodeConfig(c, log)
	if err != nil {
		return usageError(fromEnv(err.Error()))
	}
	if cfg.Token, err = loadToken(c.String("token-file"), cfg.DataDir, log); err != nil {
		return usageError(fromEnv(err.Error()))
	}
	runner, err := newRunner(ctx, c, cfg, log)
	if err != nil {
		return failure(err.Error())
	}
	if runner != nil {
		cfg.Runner = runner
		cfg.RuntimeName = runner.RuntimeName()
	}
	cfg.DriverFaults = func(ctx context.Context) (host.DriverFaults, error) {
		return host.ReadDriverFaults(ctx, host.Config{Host: cfg.Name, Runner: host.ExecRunner{}})
	}
	cfg.Extra = func(n *supervisor.Node, mux *http.ServeMux) {
		hc := host.Config{Host: cfg.Name, LogDir: datadir.New(cfg.DataDir).LogsDir()}
		if runner != nil {
			hc.Containers = runner.DescribeEngines
			hc.Engines = runner.HostEngines
		}
		m := mcpserver.Register(n, mux, mcpserver.Options{Host: hc, Logger: log, Version: version})
		var scrapeErrors func() uint64
		if runner != nil {
			scrapeErrors = runner.ScrapeErrors
		}
		nodemetrics.Register(n, mux, nodemetrics.Options{ScrapeErrors: scrapeErrors, Collectors: []prometheus.Collector{m}})
		page.Register(n, mux)
	}
	node, err := supervisor.Start(ctx, cfg)
	if err != nil {
		if runner != nil {
			runner.Close()
		}
		return failure(err.Error())
	}
	select {
	case <-ctx.Done():
		log.Info("signal received: leaving the cluster")
	case <-node.Done():
	}
	if err := node.Leave(5 * time.Second); err != nil {
		log.Warn("leave", "err", err)
	}
	log.Info("node stopped; engines keep running for the next agent to adopt")
	return nil
}

func splitHostPort(flag, v string) (string, int, error) {
	h, p, err := net.SplitHostPort(v)
	if err != nil {
		return "", 0, fmt.Errorf("%s %q: want host:port, e.g. 0.0.0.0:7946", flag, v)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%s %q: port must be 0-65535", flag, v)
	}
	return h, port, nil
}

// soleAddress finds the one address peers can dial when the bind address is
// a wildcard. With several candidates it refuses to guess: memberlist's own
// guess picks the wrong network on multi-homed GPU hosts.
func soleAddress() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", fmt.Errorf("--advertise: list host addresses: %w", err)
	}
	var cands []string
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLoopback() || ipn.IP.To4() == nil || ipn.IP.IsLinkLocalUnicast() {
			continue
		}
		cands = append(cands, ipn.IP.String())
	}
	switch len(cands) {
	case 0:
		return "127.0.0.1", nil
	case 1:
		return cands[0], nil
	default:
		return "", fmt.Errorf("--advertise is required: --bind is a wildcard and this host has several addresses (%s); name the one peers should dial", strings.Join(cands, ", "))
	}
}

func readGossipKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--gossip-key-file: %w", err)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("--gossip-key-file %s: not base64 (make one with: head -c32 /dev/urandom | base64)", path)
	}
	if l := len(key); l != 16 && l != 24 && l != 32 {
		return nil, fmt.Errorf("--gossip-key-file %s: key is %d bytes; want 16, 24 or 32 (make one with: head -c32 /dev/urandom | base64)", path, l)
	}
	return key, nil
}

// loadToken reads the cluster token, or creates <data-dir>/token when no
// file was named.
func loadToken(file, dataDir string, log *slog.Logger) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--token-file: %w", err)
		}
		tok := strings.TrimSpace(string(b))
		if len(tok) < 16 {
			return "", fmt.Errorf("--token-file %s: token shorter than 16 characters", file)
		}
		return tok, nil
	}
	p := datadir.New(dataDir).TokenFile()
	switch b, err := os.ReadFile(p); {
	case err == nil:
		// A token someone put there is kept or refused, never replaced:
		// a fresh one would quietly split this node from its cluster.
		tok := strings.TrimSpace(string(b))
		if len(tok) < 16 {
			return "", fmt.Errorf("%s: token shorter than 16 characters; put the cluster's token there (or remove the file to have one generated)", p)
		}
		return tok, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("--data-dir: read token: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", fmt.Errorf("--data-dir: %w", err)
	}
	tok := supervisor.NewToken()
	if err := os.WriteFile(p, []byte(tok+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("--data-dir: write token: %w", err)
	}
	log.Warn("no --token-file: generated a cluster token; every node of a cluster needs the same one", "path", p)
	return tok, nil
}

// fromEnv adds where a bad flag's value came from when it was the
// environment, not the command line: "--simulate-gpus: ..." names a flag
// the user never typed if they set LLMGW_SIMULATE_GPUS.
func fromEnv(msg string) string {
	flag, _, _ := strings.Cut(strings.TrimPrefix(msg, "--"), " ")
	flag = strings.TrimSuffix(flag, ":")
	if !strings.HasPrefix(msg, "--") || flag == "" {
		return msg
	}
	for _, a := range os.Args[1:] {
		if a == "--"+flag || strings.HasPrefix(a, "--"+flag+"=") {
			return msg
		}
	}
	env := "LLMGW_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
	if os.Getenv(env) == "" {
		return msg
	}
	return msg + " (set by " + env + ")"
}

func splitList(vals []string) []string {
	var out []string
	for _, v := range vals {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

func parseKV(flag string, vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, v := range vals {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: want key=value", flag, v)
		}
		out[k] = val
	}
	return out, nil
}

func parsePortRange(v string) (int, int, error) {
	lo, hi, ok := strings.Cut(v, "-")
	a, err1 := strconv.Atoi(lo)
	b, err2 := strconv.Atoi(hi)
	if !ok || err1 != nil || err2 != nil || a < 1 || b > 65535 || a > b {
		return 0, 0, fmt.Errorf("--engine-ports %q: want a range such as 8100-8999", v)
	}
	return a, b, nil
}

// newRunner builds the engine runner for --runtime; nil for none.
func newRunner(ctx context.Context, c *cli.Command, cfg supervisor.Config, log *slog.Logger) (*engine.Runner, error) {
	rt, err := openRuntime(ctx, c, cfg, log)
	if err != nil || rt == nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the llmgw binary: %w", err)
	}
	lo, hi, _ := parsePortRange(c.String("engine-ports"))
	host := cfg.AdvertiseAddr
	if host == "" {
		host = cfg.BindAddr
	}
	probe := cfg.GPUs
	return engine.NewRunner(ctx, engine.Config{
		Node: cfg.Name, Runtime: rt, DataDir: datadir.New(cfg.DataDir), Clock: cfg.Clock, Host: host, Self: self, WeightsDir: c.String("weights-dir"),
		PortMin: lo, PortMax: hi, SimulatedGPUs: cfg.GPUsSimulated, Logger: log.With("node", cfg.Name),
		GPUs: func() []placement.GPU {
			s, err := probe.Discover(context.Background())
			if err != nil {
				return nil
			}
			return s.GPUs
		},
	})
}
