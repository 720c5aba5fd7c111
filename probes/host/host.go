// Package host runs the host tools an operator (or a model, over MCP) asks a
// node for: nvidia-smi views, meminfo, ps, network and RDMA state, PCI and
// USB trees, running systemd services, containers, log files, engine
// stacks, memory accounting and kernel driver faults.
//
// Tools answer with what the underlying command printed, not a parsed
// summary: a parser keeps only the fields someone thought of in advance, and
// the answer to an odd question is usually in a field nobody kept. The
// exceptions, memory_accounting and driver_faults, are named for the
// question they answer and correlate several sources; systemd_units keeps
// every field systemctl prints, in columns.
//
// Every tool runs a fixed command with fixed arguments. Callers choose among
// named variants (a view, a log file name, a filter) that are checked here;
// no caller string ever reaches a command line. Every answer starts with the
// host, the time and the source, and is capped in size.
package host

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/probes/gpu"
)

// Runner runs a command. Run returns what the command wrote to stdout and
// stderr together, and an error for a failed start, a non-zero exit
// (*exec.ExitError) or a cancelled ctx. Output written before a failure is
// returned with it.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) ([]byte, error)
	// LookPath reports whether the tool is installed, as exec.LookPath.
	LookPath(name string) (string, error)
}

// EngineProcess is an engine process whose stacks engine_stacks may dump.
type EngineProcess struct {
	// Name says which engine it is (a shard ID) in the output, and is what
	// Args.Name selects.
	Name string
	PID  int
}

// Defaults for the zero fields of Config.
const (
	DefaultTimeout     = 15 * time.Second
	DefaultMaxOutput   = 64 << 10
	DefaultStackRounds = 3
	DefaultStackGap    = 2 * time.Second
	DefaultFaultWindow = 15 * time.Minute
)

// Config is what the tools need from the node. Zero fields get defaults;
// the callbacks may be nil, and the tools that need them then say so.
type Config struct {
	// Host names this node in every answer (default os.Hostname).
	Host string
	// Runner runs commands (default ExecRunner).
	Runner Runner
	// Root is the host's file system, for /proc and /sys, with paths
	// written without the leading slash ("proc/meminfo"). Default
	// os.DirFS("/").
	Root fs.FS
	// LogDir is the directory list_logs and read_log may read, and
	// nothing outside it. Empty: those tools say no log directory is set.
	LogDir string
	// Clock stamps answers and dates driver faults (default: real time).
	Clock clock.Clock
	// Sleep waits between engine_stacks rounds; it returns early with
	// ctx's error. Default: a timer of Clock.
	Sleep func(ctx context.Context, d time.Duration) error
	// Timeout bounds each command (DefaultTimeout), and each read_log
	// search. A command that runs past it is stopped, a search answers
	// with what it found, and the answer says so.
	Timeout time.Duration
	// MaxOutput caps each answer in bytes (DefaultMaxOutput).
	MaxOutput int
	// Containers lists what the container runtime runs, as text.
	Containers func(ctx context.Context) (string, error)
	// Engines lists this node's engine processes for engine_stacks.
	Engines func(ctx context.Context) ([]EngineProcess, error)
	// GPU reads the GPUs for memory_accounting.
	GPU func(ctx context.Context) (gpu.Snapshot, error)
	// StackRounds and StackGap shape engine_stacks (DefaultStackRounds,
	// DefaultStackGap).
	StackRounds int
	StackGap    time.Duration
	// FaultWindow is how far back a driver fault counts as recent
	// (DefaultFaultWindow).
	FaultWindow time.Duration
	// Location is the zone dmesg -T prints local times in (default
	// time.Local).
	Location *time.Location
}

// withDefaults fills the zero fields.
func (c Config) withDefaults() Config {
	if c.Host == "" {
		c.Host, _ = os.Hostname()
		if c.Host == "" {
			c.Host = "unknown-host"
		}
	}
	if c.Runner == nil {
		c.Runner = ExecRunner{}
	}
	if c.Root == nil {
		c.Root = os.DirFS("/")
	}
	if c.Clock == nil {
		c.Clock = clock.Real()
	}
	if c.Sleep == nil {
		clk := c.Clock
		c.Sleep = func(ctx context.Context, d time.Duration) error {
			if !clock.Sleep(ctx, clk, d) {
				return ctx.Err()
			}
			return nil
		}
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxOutput <= 0 {
		c.MaxOutput = DefaultMaxOutput
	}
	if c.StackRounds <= 0 {
		c.StackRounds = DefaultStackRounds
	}
	if c.StackGap <= 0 {
		c.StackGap = DefaultStackGap
	}
	if c.FaultWindow <= 0 {
		c.FaultWindow = DefaultFaultWindow
	}
	if c.Location == nil {
		c.Location = time.Local
	}
	return c
}

// Args are the optional arguments of a tool call, as the MCP layer decodes
// them from JSON. Each tool reads only the fields its Params name and
// rejects the others.
type Args struct {
	View   string `json:"view,omitempty"`
	Name   string `json:"name,omitempty"`
	Filter string `json:"filter,omitempty"`
	Lines  int    `json:"lines,omitempty"`
	Device string `json:"device,omitempty"`
	// Rounds and GapS shape one engine_stacks call (0: the node's
	// default), within MaxStackRounds and MaxStackGap.
	Rounds int     `json:"rounds,omitempty"`
	GapS   float64 `json:"gap_s,omitempty"`
}

// Param documents one field of Args that a tool reads.
type Param struct {
	// Name is the field's JSON name: view, name, filter, lines, device,
	// rounds or gap_s.
	Name        string
	Description string
}

// Tool is one host tool.
type Tool struct {
	Name        string
	Description string
	Params      []Param
	// Run answers a call. An error means the call itself was wrong (an
	// unknown view, a path outside the log directory, a bad regex) or was
	// cancelled; what the host did (a tool missing, a command failing or
	// hanging) is part of the answer text, since that is an observation
	// of the host.
	Run func(ctx context.Context, a Args) (string, error)
}

// ErrBadArgs is wrapped by every error about a call's arguments.
var ErrBadArgs = errors.New("bad arguments")

// set reports the Args fields that are set, by JSON name.
func (a Args) set() []string {
	var s []string
	if a.View != "" {
		s = append(s, "view")
	}
	if a.Name != "" {
		s = append(s, "name")
	}
	if a.Filter != "" {
		s = append(s, "filter")
	}
	if a.Lines != 0 {
		s = append(s, "lines")
	}
	if a.Device != "" {
		s = append(s, "device")
	}
	if a.Rounds != 0 {
		s = append(s, "rounds")
	}
	if a.GapS != 0 {
		s = append(s, "gap_s")
	}
	return s
}

// Tools returns the host tools over cfg, in a fixed order.
func Tools(cfg Config) []Tool {
	c := cfg.withDefaults()
	tools := []Tool{
		meminfoTool(c),
		gpuTool(c),
		processesTool(c),
		networkTool(c),
		rdmaCountersTool(c),
		pciTool(c),
		usbTool(c),
		systemdUnitsTool(c),
		containersTool(c),
		listLogsTool(c),
		readLogTool(c),
		engineStacksTool(c),
		memoryAccountingTool(c),
		driverFaultsTool(c),
	}
	for i := range tools {
		tools[i].Run = checkArgs(tools[i].Name, tools[i].Params, tools[i].Run)
	}
	return tools
}

// checkArgs refuses arguments a tool does not take: a caller who passes
// one expects it to matter, and silently ignoring it answers a different
// question than the one asked.
func checkArgs(name string, params []Param, run func(context.Context, Args) (string, error)) func(context.Context, Args) (string, error) {
	return func(ctx context.Context, a Args) (string, error) {
		for _, f := range a.set() {
			ok := false
			for _, p := range params {
				ok = ok || p.Name == f
			}
			if !ok {
				return "", fmt.Errorf("%w: %s does not take %q (it takes %s)", ErrBadArgs, name, f, paramNames(params))
			}
		}
		if err := ctx.Err(); err != nil {
			return "", err
		}
		return run(ctx, a)
	}
}

func paramNames(ps []Param) string {
	if len(ps) == 0 {
		return "no arguments"
	}
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}

// stamp prefixes an answer with where and when it came from.
func (c Config) stamp(source, body string) string {
	return fmt.Sprintf("[%s %s] %s\n%s", c.Host, c.Clock.Now().UTC().Format(time.RFC3339), source, body)
}

// capHead keeps the first max bytes of s, cut at a line end where one is
// near, and says how much was left out.
func capHead(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	if nl := strings.LastIndexByte(s[:cut], '\n'); nl >= cut-1024 && nl > 0 {
		cut = nl + 1
	}
	return fmt.Sprintf("%s\n[output cut: showing the first %d of %d bytes; %d bytes left out]\n", s[:cut], cut, len(s), len(s)-cut)
}

// capTail keeps the last max bytes of s, for output whose newest part is at
// the end (logs, kernel messages).
func capTail(s string, max int) string {
	if len(s) <= max {
		return s
	}
	start := len(s) - max
	for start < len(s) && !utf8.RuneStart(s[start]) {
		start++
	}
	if nl := strings.IndexByte(s[start:], '\n'); nl >= 0 && nl < 1024 && start+nl+1 < len(s) {
		start += nl + 1
	}
	return fmt.Sprintf("[output cut: showing the last %d of %d bytes; %d earlier bytes left out]\n%s", len(s)-start, len(s), start, s[start:])
}

// command runs one fixed command and returns its output with a note when it
// is missing, failed or hung. The error is only for a cancelled call.
func (c Config) command(ctx context.Context, name string, args ...string) (string, error) {
	out, problem, err := c.try(ctx, name, args...)
	return out + problem, err
}

// try runs one fixed command. problem is empty when it ran and exited 0,
// else a line saying what went wrong: not installed (and on which host),
// stopped after the timeout, a non-zero exit. out is what it printed
// either way. The error is only for a cancelled call.
func (c Config) try(ctx context.Context, name string, args ...string) (out, problem string, err error) {
	line := strings.Join(append([]string{name}, args...), " ")
	if _, err := c.Runner.LookPath(name); err != nil {
		return "", fmt.Sprintf("(%s is not installed on %s: %v)\n", name, c.Host, err), nil
	}
	// The timeout runs on c.Clock, as the read_log budget does, so a test
	// moves it instead of waiting for it.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	timeout := c.Clock.AfterFunc(c.Timeout, cancel)
	defer timeout.Stop()
	b, rerr := c.Runner.Run(cctx, name, args...)
	out = string(b)
	if out != "" && !strings.HasSuffix(out, "\n") {
		out += "\n"
	}
	if rerr == nil {
		return out, "", nil
	}
	if ctx.Err() != nil { // the caller gave up; not the command's fault
		return "", "", ctx.Err()
	}
	var exit *exec.ExitError
	switch {
	case cctx.Err() != nil:
		problem = fmt.Sprintf("(%s did not finish within %s and was stopped; above is what it printed until then)\n", line, c.Timeout)
	case errors.As(rerr, &exit):
		problem = fmt.Sprintf("(%s exited with status %d)\n", line, exit.ExitCode())
	default:
		problem = fmt.Sprintf("(%s failed: %v)\n", line, rerr)
	}
	return out, problem, nil
}

// simple builds a tool that runs one command.
func simple(c Config, name, desc string, cmd ...string) Tool {
	return Tool{
		Name:        name,
		Description: desc,
		Run: func(ctx context.Context, _ Args) (string, error) {
			out, err := c.command(ctx, cmd[0], cmd[1:]...)
			if err != nil {
				return "", err
			}
			return c.stamp(strings.Join(cmd, " "), capHead(out, c.MaxOutput)), nil
		},
	}
}
