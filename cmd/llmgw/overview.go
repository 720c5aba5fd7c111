package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/overview"
)

// overviewEvery is how often the full-screen overview reads the machine.
const overviewEvery = 3 * time.Second

// defaultDataDir is node up's --data-dir default.
const defaultDataDir = "/var/lib/llmgw"

func overviewCommand() *cli.Command {
	return &cli.Command{
		Name:  "overview",
		Usage: "this machine's own screen, read from the machine alone: the agent's service, peers, GPUs, engines, disks and recent problems (works with the agent down; run with sudo to read everything)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "data-dir", Value: defaultDataDir, Usage: "the node's data dir", Sources: cli.EnvVars("LLMGW_DATA_DIR")},
			&cli.StringFlag{Name: "weights-dir", Usage: "the weights dir to show (default: the one the agent runs with)", Sources: cli.EnvVars("LLMGW_WEIGHTS_DIR")},
			&cli.StringFlag{Name: "api", Usage: "host:port of the agent's API (default: the one the agent's stamp names, else 127.0.0.1:7070)"},
			&cli.BoolFlag{Name: "once", Usage: "print one plain-text frame and exit (also what a pipe gets)"},
		},
		Action: func(ctx context.Context, c *cli.Command) error {
			if a := c.String("api"); a != "" {
				if _, _, err := net.SplitHostPort(a); err != nil {
					return usageError(fmt.Sprintf("--api %q: want host:port, e.g. 127.0.0.1:7070", a))
				}
			}
			return runOverview(ctx, c.Root().Writer, c.String("data-dir"), c.String("weights-dir"), c.String("api"), c.Bool("once"))
		},
	}
}

// bareAction is what `llmgw` with no arguments does: on a terminal of a
// machine with a node data dir, the overview; anywhere else the help.
func bareAction(ctx context.Context, c *cli.Command) error {
	if c.Args().Len() > 0 {
		return noSuchCommand(c)
	}
	dir := os.Getenv("LLMGW_DATA_DIR")
	if dir == "" {
		dir = defaultDataDir
	}
	// A data dir that is root's (0700) still exists: the overview then
	// says what needs sudo.
	if _, err := os.Stat(dir); err != nil || !isTerminal(c.Root().Writer) {
		return cli.ShowAppHelp(c)
	}
	return runOverview(ctx, c.Root().Writer, dir, os.Getenv("LLMGW_WEIGHTS_DIR"), "", false)
}

// runOverview shows the overview of the node in dataDir: full screen on a
// terminal, or one plain frame with once or into a pipe.
func runOverview(ctx context.Context, w io.Writer, dataDir, weightsDir, api string, once bool) error {
	probe := gpu.System()
	defer probe.Close()
	o := machineOverview(dataDir, weightsDir, api, probe)
	if once || !isTerminal(w) {
		_, err := io.WriteString(w, overview.Render(o.Read(ctx), terminalWidth(w), overview.Plain()))
		return err
	}
	st := overview.Colored(w)
	return runScreen(ctx, w, screenModel{
		read:  func(ctx context.Context) any { return o.Read(ctx) },
		draw:  func(v any, width int) string { return overview.Render(v.(overview.Frame), width, st) },
		dim:   st.Dim,
		every: overviewEvery, what: "llmgw overview: reading this machine…",
		keys: "q quit · ↑↓ PgUp PgDn scroll · refreshed every " + overviewEvery.String(),
	})
}

// machineOverview reads this machine: fixed commands through
// host.ExecRunner, the agent's API on loopback, NVML directly.
func machineOverview(dataDir, weightsDir, api string, probe gpu.Discoverer) overview.Overview {
	run := host.ExecRunner{}
	client := overview.HTTPAPI{Client: &http.Client{Timeout: overview.Timeout}}
	asRoot := os.Geteuid() == 0
	// Utilisation, temperature and power, where the build has NVML.
	var telemetry overview.Telemetry
	if tr, ok := probe.(gpu.TelemetryReader); ok {
		telemetry = overview.FromNVML(tr)
	}
	return overview.Overview{
		Dir:      datadir.New(dataDir),
		Clock:    clock.Real(),
		Agent:    overview.AgentReader{Run: run, API: client, Addr: api, Version: version, DataDir: dataDir},
		Peers:    overview.PeersReader{API: client, Addr: api},
		GPUs:     overview.GPUsReader{GPUs: overview.OneAtATime(probe), Telemetry: telemetry},
		Engines:  overview.EnginesReader{API: client, Addr: api},
		Disks:    overview.DisksReader{WeightsDir: weightsDir, Statfs: overview.OneStatfsAtATime(overview.Statfs)},
		Problems: overview.ProblemsReader{Run: run, Root: asRoot},
		Faults:   overview.FaultsReader{Run: run, Clock: clock.Real(), AsRoot: asRoot},
	}
}
