package scenarios

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/internal/freeport"
)

// Options configure Run.
type Options struct {
	// Binary is the llmgw binary to run nodes with.
	Binary string
	// WorkDir receives a directory per scenario: data dirs, logs, token,
	// gossip key.
	// Empty: a temporary directory, removed afterwards.
	WorkDir string
	// Rewrite replaces the expected outputs in the file with the actual
	// ones.
	Rewrite bool
	// Out, when set, receives progress: each command with its timing.
	Out io.Writer
	// Ports hands out the nodes' ports. Share one between the runs of a
	// process: ports of an earlier run's nodes may linger in TIME_WAIT.
	// Nil: a picker of this run's own.
	Ports *freeport.Picker
}

// Result is how one scenario went.
type Result struct {
	Name     string
	File     string
	Labels   []string
	Requires []string
	Passed   bool
	Skipped  bool
	// Why is the skip reason, or the first mismatch (command, line, want,
	// got).
	Why      string
	Measures []Measure
	// Notes are counters worth a summary line (requests answered, ...).
	Notes    []string
	Profile  string
	Nodes    int
	Duration time.Duration
	// Logs holds the tail of each node's log when the scenario failed.
	Logs map[string]string
	// Rewritten is set when -rewrite changed the file.
	Rewritten bool
}

// Measure is one measured time.
type Measure struct {
	Name string
	D    time.Duration
	Max  time.Duration
}

// runner is one Run: the scenario's nodes and what its commands
// remembered (aliases, events, snapshots, request loops).
type runner struct {
	ctx       context.Context
	commands  map[string]cmdSpec
	opts      Options
	work      string
	token     string
	tokenFile string
	// gossipKeyFile is the run's gossip key, passed to every node: every
	// scenario gossips encrypted, as a real cluster does.
	gossipKeyFile string
	http          *http.Client
	cfg           clusterCfg
	// clusterStarted: the cluster command ran; the others need it first.
	clusterStarted bool
	nodes          []*node
	byName         map[string]*node
	aliases        map[string]string
	events         map[string]time.Time
	snapshots      map[string]*snapshot
	loops          map[string]*requestLoop
	healthLoops    map[string]*healthLoop
	res            *Result
	// namespaces is the network of net=netns; nil with net=loopback.
	namespaces *netnsNet
	// binDir is first on every node's PATH: the engines a profile names
	// by command (vllm, python3 -m sglang.launch_server), played by the
	// fake engine's personalities (see engines.go).
	binDir    string
	pollEvery time.Duration
	// binaries are the llmgw binaries nodes may run, by name: "current"
	// (Options.Binary) and those build-binary built.
	binaries map[string]string
}

// cmdSpec is one command: the keys it accepts, space-separated (every
// command also takes mark=), and the method that runs it.
type cmdSpec struct {
	keys string
	run  func(r *runner, d *directive) (out string, at time.Time, err error)
}

// commandTable is every command of the grammar (doc.go) by name. Run builds
// it once and keeps it on the runner, so no table is package state.
func commandTable() map[string]cmdSpec {
	return map[string]cmdSpec{
		"cluster":      {"nodes gpus profile lease-ttl runtime labels log-level within net binary " + nodeFlagKeys(), (*runner).cmdCluster},
		"add-node":     {"gpus labels within binary", (*runner).cmdAddNode},
		"build-binary": {"commit", (*runner).cmdBuildBinary},
		"kill":         {"as engines", (*runner).cmdKill},
		"stop":         {"as", (*runner).cmdStop},
		"restart":      {"within binary", (*runner).cmdRestart},
		"freeze":       {"as", (*runner).cmdFreeze},
		"thaw":         {"", (*runner).cmdThaw},
		"partition":    {"", (*runner).cmdPartition},
		"heal":         {"", (*runner).cmdHeal},
		"place":        {"model engine replicas tp pp gpu-memory max-model-len max-num-seqs gpu-type labels args env update start-timeout min-replicas max-replicas target-inflight scale-down-delay idle-window priority max-loras max-lora-rank adapters prefill-replicas decode-replicas prefill-tp decode-tp pd-fallback pd-skip-below via", (*runner).cmdPlace},
		"weights":      {"family model", (*runner).cmdWeights},
		"unplace":      {"via", (*runner).cmdUnplace},
		"crash-engine": {"", (*runner).cmdCrashEngine},
		"hang-engine":  {"as", (*runner).cmdHangEngine},
		"wait-until":   {"within for on alive suspect dead left ready status lease engine running by model before after", (*runner).cmdWaitUntil},
		"expect":       {"on columns since min-routable min-success before match", (*runner).cmdExpect},
		"snapshot":     {"", (*runner).cmdSnapshot},
		"measure":      {"from to max", (*runner).cmdMeasure},
		"dump":         {"", (*runner).cmdDump},
		"request-loop": {"deployment via stream on workers tokens prompt-words timeout retry priority answered-as match min-routable min-success min-share before after at except-binary under quantile", (*runner).cmdRequestLoop},
		"health-loop":  {"deployment timeout", (*runner).cmdHealthLoop},
		"affinity":     {"deployment via tenants rounds", (*runner).cmdAffinity},
	}
}

// Run runs one scenario file against a fresh cluster and tears everything
// down afterwards. It returns an error for a file that cannot run (a parse
// error, an unknown command or argument, a binary that does not start);
// a scenario whose outputs differ returns a Result with Passed false.
func Run(ctx context.Context, opts Options, file string) (Result, error) {
	start := time.Now()
	res := Result{File: file, Name: strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))}
	s, err := parseFile(file)
	if err != nil {
		return res, err
	}
	res.Labels, res.Requires = s.labels, s.requires
	commands := commandTable()
	if err := validate(s, commands); err != nil {
		return res, err
	}
	if opts.Binary == "" {
		return res, errors.New("scenarios: Options.Binary is empty")
	}
	if opts.Binary, err = filepath.Abs(opts.Binary); err != nil {
		return res, err
	}
	if b, err := filepath.EvalSymlinks(opts.Binary); err == nil {
		opts.Binary = b
	}
	if why := unmetRequirement(opts.Binary, s.requires); why != "" {
		res.Skipped, res.Why = true, why
		return res, nil
	}
	r, cleanup, err := newRunner(ctx, opts, commands, &res)
	if err != nil {
		return res, err
	}
	defer cleanup()

	failed := false
	var runErr error
	for _, sg := range s.segs {
		d := sg.d
		if d == nil {
			continue
		}
		if failed {
			// The summary still gets what was measured before the
			// failure: later measures whose events happened.
			if d.cmd == "measure" && runErr == nil {
				_, _, _ = r.cmdMeasure(d)
			}
			continue
		}
		if ctx.Err() != nil {
			runErr = ctx.Err()
			break
		}
		t := time.Now()
		out, err := r.exec(d)
		if err != nil {
			runErr = fmt.Errorf("%s:%d: %w", file, d.line, err)
			break
		}
		status := "ok"
		if out != d.expected {
			status = "DIFFERS"
			if opts.Rewrite {
				d.expected = out
			} else {
				failed = true
				res.Why = fmt.Sprintf("%s:%d: %s\n--- want:\n%s\n--- got:\n%s", file, d.line, d.raw, indent(d.expected), indent(out))
			}
		}
		fmt.Fprintf(r.opts.Out, "[%6.1fs] %-60s %s (%.2fs)\n", time.Since(start).Seconds(), d.raw, status, time.Since(t).Seconds())
	}
	res.Duration = time.Since(start)
	res.Profile = r.cfg.profile
	res.Nodes = len(r.nodes)
	for _, l := range r.loops {
		l.stop()
		r.addLoopNote(l)
	}
	for _, l := range r.healthLoops {
		l.stop()
		r.addHealthNote(l)
	}
	if runErr == nil && !failed {
		res.Passed = true
	} else {
		res.Logs = map[string]string{}
		for _, n := range r.nodes {
			res.Logs[n.name] = logTail(n.logPath, 40)
		}
	}
	if opts.Rewrite && runErr == nil {
		if out := s.render(); out != readFileOrEmpty(file) {
			if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
				return res, err
			}
			res.Rewritten = true
		}
	}
	return res, runErr
}

// newRunner prepares one run: its work dir (a temporary one unless
// opts.WorkDir is set), a token and a gossip key made for it. cleanup
// kills what the run started and removes the temporary work dir; call it
// even when newRunner fails.
func newRunner(ctx context.Context, opts Options, commands map[string]cmdSpec, res *Result) (r *runner, cleanup func(), err error) {
	var undo []func()
	cleanup = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	work := opts.WorkDir
	if work == "" {
		if work, err = os.MkdirTemp("", "llmgw-scenario-"); err != nil {
			return nil, cleanup, err
		}
		undo = append(undo, func() { _ = os.RemoveAll(work) })
	} else {
		work = filepath.Join(work, res.Name)
		_ = os.RemoveAll(work)
	}
	if err := os.MkdirAll(work, 0o700); err != nil {
		return nil, cleanup, err
	}
	if opts.Ports == nil {
		opts.Ports = freeport.New()
	}
	r = &runner{
		ctx: ctx, commands: commands, opts: opts, work: work, res: res,
		http:   &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}},
		byName: map[string]*node{}, aliases: map[string]string{}, events: map[string]time.Time{},
		snapshots: map[string]*snapshot{}, loops: map[string]*requestLoop{}, healthLoops: map[string]*healthLoop{}, pollEvery: 50 * time.Millisecond,
		binaries: map[string]string{currentBinary: opts.Binary},
	}
	undo = append(undo, r.teardownNet, r.teardown)
	r.tokenFile = filepath.Join(work, "token")
	tok := make([]byte, 20)
	_, _ = rand.Read(tok)
	r.token = hex.EncodeToString(tok)
	if err := os.WriteFile(r.tokenFile, []byte(r.token+"\n"), 0o600); err != nil {
		return nil, cleanup, err
	}
	r.binDir = filepath.Join(work, "bin")
	if err := writeEngineShims(r.binDir, opts.Binary); err != nil {
		return nil, cleanup, err
	}
	r.gossipKeyFile = filepath.Join(work, "gossip.key")
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if err := os.WriteFile(r.gossipKeyFile, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		return nil, cleanup, err
	}
	return r, cleanup, nil
}

// exec runs one command and records its events. It returns the command's
// output, normalized, with an error of the system under test appended as
// "error: ..."; err is a mistake in the file (a usage error), which ends
// the scenario.
func (r *runner) exec(d *directive) (out string, err error) {
	mark, hasMark := d.kvRaw("mark")
	out, at, err := r.commands[d.cmd].run(r, d)
	var ue *usageError
	if errors.As(err, &ue) {
		return "", fmt.Errorf("%s: %w", d.raw, err)
	}
	if err == nil {
		err = d.unused()
		if errors.As(err, &ue) {
			return "", err
		}
	}
	if err != nil {
		out = strings.TrimSpace(out + "\nerror: " + err.Error())
	}
	if at.IsZero() {
		at = time.Now()
	}
	if !d.noEvent {
		r.events[d.cmd] = at
		if hasMark {
			r.events[mark] = at
		}
	}
	return normalize(out), nil
}

// validate checks command names and keys before anything starts, so a
// typo fails at once rather than minutes into a run.
func validate(s *script, commands map[string]cmdSpec) error {
	for _, sg := range s.segs {
		d := sg.d
		if d == nil {
			continue
		}
		spec, ok := commands[d.cmd]
		if !ok {
			names := make([]string, 0, len(commands))
			for n := range commands {
				names = append(names, n)
			}
			slices.Sort(names)
			return fmt.Errorf("%s:%d: unknown command %q (have %s)", s.path, d.line, d.cmd, strings.Join(names, ", "))
		}
		keys := strings.Fields(spec.keys + " mark")
		for _, a := range d.kv {
			if !slices.Contains(keys, a.key) {
				return fmt.Errorf("%s:%d: %s: unknown argument %s= (want %s)", s.path, d.line, d.cmd, a.key, strings.Join(keys, "= ")+"=")
			}
		}
	}
	return nil
}

// unmetRequirement says why the binary cannot run a scenario with these
// requirements, or "".
func unmetRequirement(binary string, requires []string) string {
	for _, req := range requires {
		switch req {
		case "netns":
			if why := netnsWorks(); why != "" {
				return why
			}
		case "process-runtime":
			out, _ := execOutput(binary, "node", "up", "--help")
			if !strings.Contains(out, "process") {
				return "requires the process runtime; this llmgw binary only offers --runtime none"
			}
		default:
			return "unknown requirement " + req
		}
	}
	return ""
}

func execOutput(bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	b, err := cmd.CombinedOutput()
	return string(b), err
}

func indent(s string) string {
	if s == "" {
		return "  (empty)"
	}
	return "  " + strings.ReplaceAll(s, "\n", "\n  ")
}

func readFileOrEmpty(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}
