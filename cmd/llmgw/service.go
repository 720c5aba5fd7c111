package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/internal/atomicfile"
	"github.com/llmgw/llmgw/probes/host"
)

// unitTemplate is the systemd unit, the same file packagers ship
// (cmd/llmgw/llmgw.service): one source for both.
//
//go:embed llmgw.service
var unitTemplate string

// The paths the unit in the repository names; install puts the real ones
// in their place.
const (
	unitBinary  = "/usr/local/bin/llmgw"
	unitEnvFile = "/etc/llmgw/node.env"
	serviceName = "llmgw"
)

// serviceSetup is where install writes and what it runs; tests point it
// at directories and a runner of their own.
type serviceSetup struct {
	unitDir, envDir string
	// binary is the llmgw the unit runs (default: this one).
	binary string
	run    host.Runner
	// poll is how often upgrade looks at the restarted node (default 1 s).
	poll time.Duration
}

func defaultServiceSetup() serviceSetup {
	return serviceSetup{unitDir: "/etc/systemd/system", envDir: "/etc/llmgw", run: host.ExecRunner{}}
}

func (s serviceSetup) unitFile() string { return filepath.Join(s.unitDir, serviceName+".service") }
func (s serviceSetup) envFile() string  { return filepath.Join(s.envDir, "node.env") }

// nodeServiceCommands are `node install`, `node uninstall` and `node
// upgrade` (upgrade.go).
func nodeServiceCommands(s serviceSetup) []*cli.Command {
	return []*cli.Command{{
		Name:      "install",
		Usage:     "make this machine's node a systemd service: writes the unit and /etc/llmgw/node.env (the flags), reloads systemd and enables and starts it",
		ArgsUsage: "[node up flags...]",
		Flags:     nodeFlags(),
		Action:    func(ctx context.Context, c *cli.Command) error { return s.install(ctx, c) },
	}, {
		Name:   "uninstall",
		Usage:  "stop and disable the service and remove its unit and node.env; engines keep running, the data dir stays",
		Action: func(ctx context.Context, c *cli.Command) error { return s.uninstall(ctx, c.Root().Writer) },
	}, s.upgradeCommand()}
}

// pathFlags name files or directories: the service runs from /, so a
// relative path given to install is made absolute first.
var pathFlags = map[string]bool{"data-dir": true, "token-file": true, "gossip-key-file": true, "weights-dir": true,
	"log-file": true, "gateway-tls-cert": true, "gateway-tls-key": true, "gateway-keys-file": true, "containerd-socket": true}

// serviceEnv turns the flags given to install into node.env's lines,
// LLMGW_<FLAG>=value, each flag by the variable `node up` reads it from.
// The name is always written: the service must keep it across restarts
// even if the host is renamed.
func serviceEnv(c *cli.Command) ([]string, error) {
	type envFlag interface {
		Names() []string
		GetEnvVars() []string
	}
	var lines []string
	for _, f := range c.Flags {
		ef, ok := f.(envFlag)
		if !ok || len(ef.GetEnvVars()) == 0 {
			continue
		}
		name := ef.Names()[0]
		if !c.IsSet(name) && name != "name" {
			continue
		}
		var v string
		switch x := c.Value(name).(type) {
		case []string:
			v = strings.Join(x, ",")
		default:
			v = fmt.Sprint(x)
		}
		if pathFlags[name] && v != "" {
			abs, err := filepath.Abs(v)
			if err != nil {
				return nil, fmt.Errorf("--%s: %w", name, err)
			}
			v = abs
		}
		if strings.ContainsAny(v, "\n\r\x00") {
			return nil, fmt.Errorf("--%s: a value with a line break cannot go in an environment file", name)
		}
		// systemd's EnvironmentFile: a double-quoted value, with \ and "
		// escaped.
		v = strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(v)
		lines = append(lines, ef.GetEnvVars()[0]+`="`+v+`"`)
	}
	sort.Strings(lines)
	return lines, nil
}

// unit is the unit file for this installation.
func (s serviceSetup) unit() (string, error) {
	bin := s.binary
	if bin == "" {
		self, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("find the llmgw binary: %w", err)
		}
		if bin, err = filepath.EvalSymlinks(self); err != nil {
			return "", fmt.Errorf("find the llmgw binary: %w", err)
		}
	}
	for _, p := range []string{bin, s.envFile()} {
		if strings.ContainsAny(p, " \t\n\"'\\%$") {
			return "", fmt.Errorf("%q: a path with spaces or quotes cannot go in the unit; install llmgw under a plain path such as %s", p, unitBinary)
		}
	}
	u := strings.Replace(unitTemplate, "ExecStart="+unitBinary, "ExecStart="+bin, 1)
	return strings.Replace(u, "EnvironmentFile="+unitEnvFile, "EnvironmentFile="+s.envFile(), 1), nil
}

func (s serviceSetup) install(ctx context.Context, c *cli.Command) error {
	if c.Args().Len() > 0 {
		return usageError(fmt.Sprintf("node install: unexpected argument %q: give node up's flags, e.g. --name gpu-1 --advertise 10.0.0.1", c.Args().First()))
	}
	// The flags are checked as node up checks them, before anything is
	// written: a service that cannot start helps nobody.
	if _, err := nodeConfig(c, slog.New(slog.DiscardHandler)); err != nil {
		return usageError(fromEnv(err.Error()))
	}
	env, err := serviceEnv(c)
	if err != nil {
		return usageError(err.Error())
	}
	unit, err := s.unit()
	if err != nil {
		return failure(err.Error())
	}
	if _, err := s.run.LookPath("systemctl"); err != nil {
		return failure("node install: systemctl not found: this machine does not run systemd; start the node with llmgw node up (and --log-file) instead")
	}
	if err := os.MkdirAll(s.envDir, 0o755); err != nil {
		return failure(fmt.Sprintf("node install: %v (run with sudo)", err))
	}
	head := "# llmgw node up's flags, as the variables it reads them from; written by llmgw node install.\n" +
		"# Change a line and run: systemctl restart llmgw (the engines keep running).\n"
	if err := atomicfile.Write(s.envFile(), []byte(head+strings.Join(env, "\n")+"\n"), 0o600); err != nil {
		return failure(fmt.Sprintf("node install: %v (run with sudo)", err))
	}
	if err := atomicfile.Write(s.unitFile(), []byte(unit), 0o644); err != nil {
		return failure(fmt.Sprintf("node install: %v (run with sudo)", err))
	}
	for _, args := range [][]string{{"daemon-reload"}, {"enable", "--now", serviceName}} {
		if err := s.systemctl(ctx, args...); err != nil {
			return failure("node install: " + err.Error())
		}
	}
	w := c.Root().Writer
	fmt.Fprintf(w, "llmgw: wrote %s and %s; the service is enabled and started.\n", s.unitFile(), s.envFile())
	fmt.Fprintf(w, "It was already running? Apply the new flags with: systemctl restart %s (engines keep running).\n", serviceName)
	fmt.Fprintf(w, "See it: sudo llmgw overview   Its log: journalctl -u %s\n", serviceName)
	return nil
}

func (s serviceSetup) uninstall(ctx context.Context, w io.Writer) error {
	if _, err := os.Stat(s.unitFile()); errors.Is(err, fs.ErrNotExist) {
		return failure(fmt.Sprintf("node uninstall: %s is not there: llmgw is not installed as a service", s.unitFile()))
	}
	if _, err := s.run.LookPath("systemctl"); err != nil {
		return failure("node uninstall: systemctl not found")
	}
	if err := s.systemctl(ctx, "disable", "--now", serviceName); err != nil {
		return failure("node uninstall: " + err.Error())
	}
	for _, p := range []string{s.unitFile(), s.envFile()} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return failure(fmt.Sprintf("node uninstall: %v (run with sudo)", err))
		}
	}
	if err := s.systemctl(ctx, "daemon-reload"); err != nil {
		return failure("node uninstall: " + err.Error())
	}
	fmt.Fprintf(w, "llmgw: the service is stopped and removed. Its engines keep running (KillMode=process) until a node adopts or stops them; the data dir is kept.\n")
	return nil
}

func (s serviceSetup) systemctl(ctx context.Context, args ...string) error {
	out, err := s.run.Run(ctx, "systemctl", args...)
	if err != nil {
		return fmt.Errorf("systemctl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
