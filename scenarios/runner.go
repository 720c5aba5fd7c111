// Package scenarios runs declarative multi-node scenarios against real
// `llmgw node up` processes on one machine (on loopback, or each in a
// network namespace of its own): failover, partitions, restarts, rolling
// updates and scale, each written as a runbook that doubles as a test.
// Run(ctx, Options, file) runs one file; scenarios_test.go runs
// testdata/*.txt and prints a summary table.
//
// # Files
//
// A scenario file (testdata/*.txt) is a sequence of commands in the style of
// cockroachdb/datadriven. Each command is one line, followed by a line
// "----" and the output the command must print, which ends at the first
// blank line. An output that itself contains blank lines is fenced by two
// "----" lines before and after it. Lines starting with '#' and blank lines
// between commands are comments. Header comments before the first command:
//
//	# labels: short            short runs in `make test`; slow, pending, ... only with -all
//	# requires: process-runtime   skipped while the binary cannot run engines
//	# requires: netns             skipped where network namespaces cannot be made
//
// A command is `NAME positional... key=value key=(a,b,c)`. Values with
// spaces are double-quoted. Every argument must be used: an unknown
// command, an unknown key or a leftover argument fails the scenario, as does
// a malformed file. Errors of the system under test (an HTTP 400, a node
// that exits, a condition that never comes true) are not failures of the
// file: they are printed as the command's output, so a scenario fails when
// they were not expected and can assert them when they were. The first
// output that differs from the file fails the scenario and the remaining
// commands are not run. With -rewrite every command runs and the file is
// rewritten with the actual outputs.
//
// Outputs are deterministic: no times, pids, ports or claim stamps. Times
// are measured with `measure` and go to the summary, not to the output.
// There is no sleep: wait for a condition with wait-until.
//
// # Nodes
//
// Nodes are named n1, n2, ... by `cluster`, or as given to `add-node`. A
// NODE argument is a name, an alias set by as=ALIAS on an earlier command,
// "@SHARD" for the node the current plan gives that shard, or "all"; lists
// are comma-separated (n1,n2). Outputs name "@SHARD" nodes as "the node
// planned for SHARD", so they do not depend on which node placement chose.
// The nodes that answer (running and not frozen) are the observers; most
// checks ask every observer, or only those listed in on=(...).
//
// # Commands
//
//	cluster nodes=N [gpus=4xH100-80GB] [profile=local] [lease-ttl=3s] [runtime=none] [labels=(k=v,...)]
//	        [net=loopback|netns] [log-level=info] [within=30s]
//	    Start N nodes with free ports, their own data dirs, one shared token
//	    file, --test-hooks and simulated GPUs; wait until every node sees all
//	    N alive with their GPUs. net=loopback (default): every node on
//	    127.0.0.1. net=netns: every node in a network namespace of its own
//	    (root and iproute2 needed; see netns.go), so partitions are real.
//	add-node NAME [gpus=...] [labels=(k=v,...)] [within=30s]
//	    Start one more node joining the others; wait until every observer
//	    sees it alive.
//	kill NODE [engines=keep|kill] [as=ALIAS]
//	                           SIGKILL the agent: an agent crash, its engines
//	                           keep running (keep, the default), or the whole
//	                           node dying, its engines too (kill).
//	stop NODE [as=ALIAS]       SIGTERM: graceful leave; prints the exit status.
//	restart NODE [within=15s]  Start a stopped or killed node again with the
//	                           same name, data dir and ports (SIGTERM first if
//	                           it runs); waits for its API. A partition rule it
//	                           had is installed again.
//	freeze NODE [as=ALIAS]     SIGSTOP the agent.   thaw NODE: SIGCONT.
//	partition A,B | C,D ...    Split the cluster. With net=netns each side's
//	                           cluster links move to a bridge of their own: a
//	                           real partition. With net=loopback it is the
//	                           gossip-drop test hook (POST /v1/test/partition
//	                           on every node: it drops gossip to and from the
//	                           other sides). Either way the HTTP APIs stay
//	                           reachable. The output says which was used.
//	heal                       Undo the partition.
//	place NAME model=M [engine=fake] [replicas=1] [tp=1] [pp=1] [gpu-memory=70GiB] [gpu-type=H100]
//	      [labels=(k=v)] [args=(a,b)] [env=(K=V)] [via=NODE]
//	    POST the deployment to one node (default: the first observer).
//	unplace NAME [via=NODE]
//	crash-engine SHARD         SIGKILL the engine process of SHARD (pid from /v1/shards).
//	wait-until CONDITION... [for=DURATION] within DURATION   (or within=DURATION)
//	    Poll every observer (or on=(...)) until CONDITION holds everywhere;
//	    prints "ok", or what was last seen when the time ran out. With for=
//	    it must hold at every poll for that long (a stability check; the
//	    event is still when it first held).
//	expect WHAT ...            Print a deterministic snapshot (below).
//	snapshot NAME              Remember the plan and the engines' pids.
//	dump NAME                  Save every observer's /v1/cluster, /v1/plan,
//	                           /v1/shards and /status.json under the work dir
//	                           (see -keep), for debugging a scenario.
//	measure NAME from=EVENT to=EVENT [max=DURATION]
//	    Record the time between two events in the summary; with max= the
//	    output says whether it stayed within the budget.
//	request-loop NAME start deployment=D | stop | expect-no-errors [min-routable=N]
//	    A background client: chat completions in a loop, each to a replica
//	    whose lease is valid in a fresh /v1/shards; a connection error is
//	    retried once on another replica, as a router would. min-routable=N
//	    also checks that no /v1/shards it read offered fewer than N
//	    routable replicas (surge before drain in a rolling update).
//
// Every command records an event under its own name (the last one wins) and,
// with mark=EVENT, under that name too: a command's event is when it acted
// (the signal, the POST) or, for wait-until, when the condition was first
// seen to hold.
//
// # Conditions (wait-until)
//
//	all-placed                  every deployment placed in full, nothing unplaced
//	all-ready                   every deployment's ready count equals its replicas
//	replicas NAME ready=N       N replicas of NAME's current spec have a valid
//	                            lease on every shard, on nodes that really run
//	members [alive=N] [suspect=N] [dead=N] [left=N]   as counted in /v1/cluster
//	converged                   every observer's /v1/plan is identical, current
//	                            and computed from the same deployments
//	single-holder               the nodes' own records hold exactly the planned
//	                            shards, each on one node (asks every node; a
//	                            frozen node fails it)
//	serving NAME                a chat completion to every replica with a valid
//	                            lease answers, from the engine process its
//	                            record names (checked by the listening socket)
//	restarts SHARD>=N           /v1/shards reports at least N restarts
//	shard SHARD [status=S] [lease=L] [engine=running|gone]
//	shards-agree                every observer's /v1/shards shows the same shards,
//	                            nodes, leases, statuses and draining flags
//	engines running=N           N engine processes of this run exist (any node, orphans too)
//	no-orphans                  every engine process runs a shard some node holds
//
// # Snapshots (expect)
//
//	expect models [on=(NODES)]                   /v1/deployments as a table (why below it)
//	expect shards [on=(NODES)] [columns=(shard,replica,deployment,node,gpus,lease,status,restarts,draining,engine,reason)]
//	                                             default columns: shard,deployment,lease,status,draining
//	expect members [on=(NODES)]                  name, state and GPU count of every member
//	expect plan-agrees                           every observer has the same plan
//	expect single-holder                         as the condition, printed
//	expect pids-unchanged since=SNAPSHOT         engines kept their pids
//	expect plan-diff since=SNAPSHOT              assignments added, removed or moved
//	expect no-orphans
//	expect request-loop NAME [min-routable=N]    same as request-loop NAME expect-no-errors
//
// models, shards and members ask every observer (or those in on=); when
// all answer alike the answer is printed once, else each under "as seen by
// NODE:". Wait with shards-agree or converged first where views may still
// differ.
package scenarios

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/llmgw/llmgw/internal/freeport"
	"github.com/llmgw/llmgw/probes/sockets"
)

// Options configure Run.
type Options struct {
	// Binary is the llmgw binary to run nodes with.
	Binary string
	// WorkDir receives a directory per scenario: data dirs, logs, token.
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

type runner struct {
	ctx       context.Context
	opts      Options
	work      string
	token     string
	tokenFile string
	http      *http.Client
	cfg       clusterCfg
	started   bool
	nodes     []*node
	byName    map[string]*node
	aliases   map[string]string
	events    map[string]time.Time
	snaps     map[string]*snap
	loops     map[string]*reqLoop
	res       *Result
	nn        *netnsNet
	t0        time.Time
	pollEvery time.Duration
}

type cmdSpec struct {
	keys string
	run  func(r *runner, d *directive) (out string, at time.Time, err error)
}

var commands map[string]cmdSpec

func init() {
	commands = map[string]cmdSpec{
		"cluster":      {"nodes gpus profile lease-ttl runtime labels log-level within net", (*runner).cmdCluster},
		"add-node":     {"gpus labels within", (*runner).cmdAddNode},
		"kill":         {"as engines", (*runner).cmdKill},
		"stop":         {"as", (*runner).cmdStop},
		"restart":      {"within", (*runner).cmdRestart},
		"freeze":       {"as", (*runner).cmdFreeze},
		"thaw":         {"", (*runner).cmdThaw},
		"partition":    {"", (*runner).cmdPartition},
		"heal":         {"", (*runner).cmdHeal},
		"place":        {"model engine replicas tp pp gpu-memory gpu-type labels args env via", (*runner).cmdPlace},
		"unplace":      {"via", (*runner).cmdUnplace},
		"crash-engine": {"", (*runner).cmdCrashEngine},
		"wait-until":   {"within for on alive suspect dead left ready status lease engine running", (*runner).cmdWaitUntil},
		"expect":       {"on columns since min-routable", (*runner).cmdExpect},
		"snapshot":     {"", (*runner).cmdSnapshot},
		"measure":      {"from to max", (*runner).cmdMeasure},
		"dump":         {"", (*runner).cmdDump},
		"request-loop": {"deployment min-routable", (*runner).cmdRequestLoop},
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
	if err := validate(s); err != nil {
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
	if why := unmet(opts.Binary, s.requires); why != "" {
		res.Skipped, res.Why = true, why
		return res, nil
	}
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	work := opts.WorkDir
	if work == "" {
		if work, err = os.MkdirTemp("", "llmgw-scenario-"); err != nil {
			return res, err
		}
		defer os.RemoveAll(work)
	} else {
		work = filepath.Join(work, res.Name)
		_ = os.RemoveAll(work)
	}
	if err := os.MkdirAll(work, 0o700); err != nil {
		return res, err
	}
	if opts.Ports == nil {
		opts.Ports = freeport.New()
	}
	r := &runner{
		ctx: ctx, opts: opts, work: work, res: &res,
		http:   &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}},
		byName: map[string]*node{}, aliases: map[string]string{}, events: map[string]time.Time{},
		snaps: map[string]*snap{}, loops: map[string]*reqLoop{}, t0: start, pollEvery: 50 * time.Millisecond,
	}
	r.tokenFile = filepath.Join(work, "token")
	tok := make([]byte, 20)
	_, _ = rand.Read(tok)
	r.token = hex.EncodeToString(tok)
	if err := os.WriteFile(r.tokenFile, []byte(r.token+"\n"), 0o600); err != nil {
		return res, err
	}
	defer r.teardownNet()
	defer r.teardown()

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
		mark, hasMark := d.kvRaw("mark")
		out, at, err := commands[d.cmd].run(r, d)
		var ue *usageError
		if errors.As(err, &ue) {
			runErr = fmt.Errorf("%s:%d: %s: %w", file, d.line, d.raw, err)
			break
		}
		if err == nil {
			err = d.unused()
			if errors.As(err, &ue) {
				runErr = fmt.Errorf("%s:%d: %w", file, d.line, err)
				break
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
		out = normalize(out)
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
		fmt.Fprintf(opts.Out, "[%6.1fs] %-60s %s (%.2fs)\n", time.Since(start).Seconds(), d.raw, status, time.Since(t).Seconds())
	}
	res.Duration = time.Since(start)
	res.Profile = r.cfg.profile
	res.Nodes = len(r.nodes)
	for _, l := range r.loops {
		l.halt()
		r.loopNote(l)
	}
	if runErr == nil && !failed {
		res.Passed = true
	} else {
		res.Logs = map[string]string{}
		for _, n := range r.nodes {
			res.Logs[n.name] = tail(n.logPath, 40)
		}
	}
	if opts.Rewrite && runErr == nil {
		if out := s.render(); out != mustRead(file) {
			if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
				return res, err
			}
			res.Rewritten = true
		}
	}
	return res, runErr
}

// validate checks command names and keys before anything starts, so a
// typo fails at once rather than minutes into a run.
func validate(s *script) error {
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

// kvRaw reads a key as used without type checks.
func (d *directive) kvRaw(key string) (string, bool) {
	a := d.arg(key)
	if a == nil {
		return "", false
	}
	return a.val, true
}

// unmet says why the binary cannot run a scenario with these requirements.
func unmet(binary string, requires []string) string {
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

func indent(s string) string {
	if s == "" {
		return "  (empty)"
	}
	return "  " + strings.ReplaceAll(s, "\n", "\n  ")
}

func mustRead(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// tail is the end of a node's log, or from the first panic on when there
// is one (a goroutine dump's end says little).
func tail(path string, n int) string {
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

// ---- cluster and node commands ----

func (r *runner) cmdCluster(d *directive) (string, time.Time, error) {
	if r.started {
		return "", time.Time{}, usagef("cluster: one cluster per scenario")
	}
	count, err := d.integer("nodes", 0)
	if err != nil {
		return "", time.Time{}, err
	}
	if count < 1 {
		return "", time.Time{}, usagef("cluster: nodes= must be at least 1")
	}
	if r.cfg.gpus, err = d.str("gpus", "4xH100-80GB"); err != nil {
		return "", time.Time{}, err
	}
	if r.cfg.profile, err = d.str("profile", "local"); err != nil {
		return "", time.Time{}, err
	}
	if r.cfg.leaseTTL, err = d.duration("lease-ttl", 3*time.Second); err != nil {
		return "", time.Time{}, err
	}
	if r.cfg.runtime, err = d.str("runtime", "none"); err != nil {
		return "", time.Time{}, err
	}
	if r.cfg.logLevel, err = d.str("log-level", "info"); err != nil {
		return "", time.Time{}, err
	}
	labels, _ := d.list("labels")
	within, err := d.duration("within", 30*time.Second+time.Duration(count)*time.Second)
	if err != nil {
		return "", time.Time{}, err
	}
	network, err := d.str("net", "loopback")
	if err != nil {
		return "", time.Time{}, err
	}
	switch network {
	case "loopback":
	case "netns":
		if r.nn, err = newNetns(); err != nil {
			return "", time.Time{}, err
		}
	default:
		return "", time.Time{}, usagef("cluster: net=%s: want loopback or netns", network)
	}
	r.started = true
	at := time.Now()
	// Polling every node costs CPU the nodes need: slower for big clusters.
	switch {
	case count >= 20:
		r.pollEvery = 250 * time.Millisecond
	case count >= 10:
		r.pollEvery = 100 * time.Millisecond
	}
	var nodes []*node
	for i := 1; i <= count; i++ {
		n, err := r.newNode(fmt.Sprintf("n%d", i), r.cfg.gpus, labels)
		if err != nil {
			return "", time.Time{}, err
		}
		nodes = append(nodes, n)
	}
	// The first node first, so the others find someone at once.
	if err := r.start(nodes[0]); err != nil {
		return "", time.Time{}, err
	}
	if err := r.waitHealthy(r.ctx, nodes[0], 15*time.Second); err != nil {
		return "", time.Time{}, err
	}
	for _, n := range nodes[1:] {
		if err := r.start(n); err != nil {
			return "", time.Time{}, err
		}
	}
	for _, n := range nodes[1:] {
		if err := r.waitHealthy(r.ctx, n, 15*time.Second); err != nil {
			return "", time.Time{}, err
		}
	}
	if ok, last := r.poll(within, func() (bool, string) { return r.condMembersAlive(nodes, count) }); !ok {
		return "", time.Time{}, fmt.Errorf("cluster did not form within %v: %s", within, last)
	}
	names := nodes[0].name
	if count > 1 {
		names += ".." + nodes[count-1].name
	}
	where := "on 127.0.0.1"
	if r.nn != nil {
		where = "each in its own network namespace"
	}
	return fmt.Sprintf("%d nodes up (%s) %s, %s each, profile %s, lease-ttl %v, runtime %s", count, names, where, r.cfg.gpus, r.cfg.profile, r.cfg.leaseTTL, r.cfg.runtime), at, nil
}

// condMembersAlive: every one of nodes sees want alive members with GPUs.
func (r *runner) condMembersAlive(nodes []*node, want int) (bool, string) {
	infos, errs := fetchAll[clusterInfo](r.ctx, r, nodes, "/v1/cluster")
	if err := firstErr(nodes, errs); err != nil {
		return false, err.Error()
	}
	for i, ci := range infos {
		alive := 0
		for _, m := range ci.Members {
			if m.State == "alive" && len(m.GPUs) > 0 {
				alive++
			}
		}
		if alive != want {
			return false, fmt.Sprintf("%s sees %d alive members with GPUs, want %d", nodes[i].name, alive, want)
		}
	}
	return true, ""
}

func (r *runner) needCluster(d *directive) error {
	if !r.started {
		return usagef("%s: no cluster yet (start one with: cluster nodes=3)", d.cmd)
	}
	return nil
}

func (r *runner) cmdAddNode(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	name, err := d.nextPos("node name")
	if err != nil {
		return "", time.Time{}, err
	}
	gpus, err := d.str("gpus", r.cfg.gpus)
	if err != nil {
		return "", time.Time{}, err
	}
	labels, _ := d.list("labels")
	within, err := d.duration("within", 30*time.Second)
	if err != nil {
		return "", time.Time{}, err
	}
	n, err := r.newNode(name, gpus, labels)
	if err != nil {
		return "", time.Time{}, err
	}
	at := time.Now()
	if err := r.start(n); err != nil {
		return "", time.Time{}, err
	}
	if err := r.waitHealthy(r.ctx, n, 15*time.Second); err != nil {
		return "", time.Time{}, err
	}
	ok, last := r.poll(within, func() (bool, string) {
		obs := r.observers(nil)
		infos, errs := fetchAll[clusterInfo](r.ctx, r, obs, "/v1/cluster")
		if err := firstErr(obs, errs); err != nil {
			return false, err.Error()
		}
		for i, ci := range infos {
			seen := false
			for _, m := range ci.Members {
				seen = seen || (m.Name == name && m.State == "alive" && len(m.GPUs) > 0)
			}
			if !seen {
				return false, obs[i].name + " does not see " + name + " alive yet"
			}
		}
		return true, ""
	})
	if !ok {
		return "", time.Time{}, fmt.Errorf("%s did not join within %v: %s", name, within, last)
	}
	desc := name + " joined (" + gpus
	if len(labels) > 0 {
		desc += ", labels " + strings.Join(labels, ",")
	}
	return desc + ")", at, nil
}

// targets resolves the positional node references of d.
func (r *runner) targets(d *directive) ([]*node, []string, error) {
	if err := r.needCluster(d); err != nil {
		return nil, nil, err
	}
	refs := d.positional()
	if len(refs) == 0 {
		return nil, nil, usagef("%s: name a node", d.cmd)
	}
	var all []string
	for _, ref := range refs {
		all = append(all, strings.Split(ref, ",")...)
	}
	ns, labels, err := r.resolveNodes(r.ctx, all)
	if err != nil {
		return nil, nil, err
	}
	if as, ok := d.kvRaw("as"); ok {
		if len(ns) != 1 {
			return nil, nil, usagef("%s: as= names one node", d.cmd)
		}
		if _, clash := r.byName[as]; clash {
			return nil, nil, usagef("%s: alias %q is a node name", d.cmd, as)
		}
		r.aliases[as] = ns[0].name
	}
	return ns, labels, nil
}

func (r *runner) cmdKill(d *directive) (string, time.Time, error) {
	mode, err := d.str("engines", "keep")
	if err != nil {
		return "", time.Time{}, err
	}
	if mode != "keep" && mode != "kill" {
		return "", time.Time{}, usagef("kill: engines=%s: want keep (an agent crash) or kill (the whole node dies)", mode)
	}
	ns, labels, err := r.targets(d)
	if err != nil {
		return "", time.Time{}, err
	}
	var out []string
	var at time.Time
	for i, n := range ns {
		var engines []int
		if mode == "kill" {
			engines = r.enginesOf(n)
		}
		at = time.Now()
		if err := n.signal(syscall.SIGKILL); err != nil {
			out = append(out, "error: "+err.Error())
			continue
		}
		for _, pid := range engines {
			if pg, err := syscall.Getpgid(pid); err == nil && pg == pid {
				_ = syscall.Kill(-pid, syscall.SIGKILL)
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if !n.waitExit(5 * time.Second) {
			out = append(out, "error: "+n.name+" did not die")
			continue
		}
		if mode == "kill" {
			out = append(out, "killed "+labels[i]+" and its engines (SIGKILL: the whole node is gone)")
		} else {
			out = append(out, "killed "+labels[i]+" (SIGKILL to the agent; engines keep running)")
		}
	}
	return strings.Join(out, "\n"), at, nil
}

// enginesOf lists the engine processes of a node: those its record names
// and those that are its agent's children.
func (r *runner) enginesOf(n *node) []int {
	pids := map[int]bool{}
	var st statusInfo
	if n.up() && r.get(r.ctx, n, "/status.json", &st) == nil {
		for _, s := range st.Record.Shards {
			if s.PID > 0 {
				pids[s.PID] = true
			}
		}
	}
	agent := n.pid()
	for pid := range engineProcs(r.opts.Binary) {
		if sockets.Host().Parent(pid) == agent {
			pids[pid] = true
		}
	}
	var out []int
	for pid := range pids {
		out = append(out, pid)
	}
	return out
}

func (r *runner) cmdStop(d *directive) (string, time.Time, error) {
	ns, labels, err := r.targets(d)
	if err != nil {
		return "", time.Time{}, err
	}
	at := time.Now()
	var out []string
	for _, n := range ns {
		if err := n.signal(syscall.SIGTERM); err != nil {
			out = append(out, "error: "+err.Error())
		}
	}
	for i, n := range ns {
		if !n.waitExit(20 * time.Second) {
			out = append(out, "error: "+n.name+" did not exit within 20s of SIGTERM")
			continue
		}
		out = append(out, fmt.Sprintf("stopped %s (SIGTERM, %s)", labels[i], n.exitStatus()))
	}
	return strings.Join(out, "\n"), at, nil
}

func (r *runner) cmdRestart(d *directive) (string, time.Time, error) {
	within, err := d.duration("within", 15*time.Second)
	if err != nil {
		return "", time.Time{}, err
	}
	ns, labels, err := r.targets(d)
	if err != nil {
		return "", time.Time{}, err
	}
	var out []string
	for _, n := range ns {
		if n.running() {
			if n.isFrozen() {
				_ = n.signal(syscall.SIGCONT)
			}
			_ = n.signal(syscall.SIGTERM)
			if !n.waitExit(20 * time.Second) {
				return "", time.Time{}, fmt.Errorf("%s did not exit within 20s of SIGTERM", n.name)
			}
		}
	}
	at := time.Now()
	for _, n := range ns {
		if err := r.start(n); err != nil {
			return "", time.Time{}, err
		}
	}
	for i, n := range ns {
		if err := r.waitHealthy(r.ctx, n, within); err != nil {
			out = append(out, "error: "+err.Error())
			continue
		}
		if len(n.drop) > 0 {
			if err := r.setDrop(n, n.drop); err != nil {
				out = append(out, "error: re-install partition rule: "+err.Error())
			}
		}
		out = append(out, "restarted "+labels[i])
	}
	return strings.Join(out, "\n"), at, nil
}

func (r *runner) cmdFreeze(d *directive) (string, time.Time, error) {
	return r.stopCont(d, syscall.SIGSTOP, "SIGSTOP", true, "froze")
}

func (r *runner) cmdThaw(d *directive) (string, time.Time, error) {
	return r.stopCont(d, syscall.SIGCONT, "SIGCONT", false, "thawed")
}

// stopCont freezes (SIGSTOP) or thaws (SIGCONT) agents and records which
// are frozen, so checks stop asking them.
func (r *runner) stopCont(d *directive, sig syscall.Signal, sigName string, frozen bool, verb string) (string, time.Time, error) {
	ns, labels, err := r.targets(d)
	if err != nil {
		return "", time.Time{}, err
	}
	at := time.Now()
	var out []string
	for i, n := range ns {
		if err := n.signal(sig); err != nil {
			out = append(out, "error: "+err.Error())
			continue
		}
		n.mu.Lock()
		n.frozen = frozen
		n.mu.Unlock()
		out = append(out, fmt.Sprintf("%s %s (%s)", verb, labels[i], sigName))
	}
	return strings.Join(out, "\n"), at, nil
}

func (r *runner) setDrop(n *node, drop []string) error {
	if drop == nil {
		drop = []string{}
	}
	return r.call(r.ctx, "POST", n.api()+"/v1/test/partition", map[string]any{"drop": drop}, true, nil)
}

func (r *runner) cmdPartition(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	spec := strings.Join(d.positional(), " ")
	var sides [][]*node
	seen := map[*node]bool{}
	for _, side := range strings.Split(spec, "|") {
		refs := strings.FieldsFunc(side, func(r rune) bool { return r == ',' || r == ' ' })
		if len(refs) == 0 {
			return "", time.Time{}, usagef("partition: empty side in %q (want: partition n1,n2 | n3)", spec)
		}
		ns, _, err := r.resolveNodes(r.ctx, refs)
		if err != nil {
			return "", time.Time{}, err
		}
		for _, n := range ns {
			if seen[n] {
				return "", time.Time{}, usagef("partition: %s is on two sides", n.name)
			}
			seen[n] = true
		}
		sides = append(sides, ns)
	}
	if len(sides) < 2 {
		return "", time.Time{}, usagef("partition: want at least two sides separated by '|'")
	}
	for _, n := range r.nodes {
		if !seen[n] {
			return "", time.Time{}, usagef("partition: %s is on no side; name every node", n.name)
		}
	}
	at := time.Now()
	var errs []string
	var desc []string
	if r.nn != nil {
		for _, side := range sides {
			var names []string
			for _, n := range side {
				names = append(names, n.name)
			}
			desc = append(desc, strings.Join(names, ","))
		}
		if err := r.nn.split(sides); err != nil {
			return "", at, err
		}
		return "partitioned " + strings.Join(desc, " | ") + " (network namespaces: each side on a bridge of its own; the API stays reachable)", at, nil
	}
	for i, side := range sides {
		var names []string
		for _, n := range side {
			names = append(names, n.name)
		}
		desc = append(desc, strings.Join(names, ","))
		var drop []string
		for j, other := range sides {
			if j != i {
				for _, o := range other {
					drop = append(drop, o.name)
				}
			}
		}
		for _, n := range side {
			n.drop = drop
			if !n.up() {
				continue // installed when it restarts
			}
			if err := r.setDrop(n, drop); err != nil {
				errs = append(errs, "error: "+n.name+": "+err.Error())
			}
		}
	}
	out := "partitioned " + strings.Join(desc, " | ") + " (gossip-drop test hook on every node; no network namespaces)"
	return strings.Join(append([]string{out}, errs...), "\n"), at, nil
}

func (r *runner) cmdHeal(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	at := time.Now()
	if r.nn != nil {
		if err := r.nn.heal(r.nodes); err != nil {
			return "", at, err
		}
		return "healed: every node back on one bridge", at, nil
	}
	out := []string{"healed: every node accepts gossip from every node again"}
	for _, n := range r.nodes {
		n.drop = nil
		if !n.up() {
			continue
		}
		if err := r.setDrop(n, nil); err != nil {
			out = append(out, "error: "+n.name+": "+err.Error())
		}
	}
	return strings.Join(out, "\n"), at, nil
}

// ---- deployments ----

func (r *runner) via(d *directive) (*node, error) {
	if ref, ok := d.kvRaw("via"); ok {
		ns, _, err := r.resolveNodes(r.ctx, []string{ref})
		if err != nil {
			return nil, err
		}
		return ns[0], nil
	}
	obs := r.observers(nil)
	if len(obs) == 0 {
		return nil, errors.New("no node is up")
	}
	return obs[0], nil
}

func (r *runner) cmdPlace(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	name, err := d.nextPos("deployment name")
	if err != nil {
		return "", time.Time{}, err
	}
	spec := map[string]any{"name": name}
	model, err := d.need("model")
	if err != nil {
		return "", time.Time{}, err
	}
	spec["model"] = model
	if spec["engine"], err = d.str("engine", "fake"); err != nil {
		return "", time.Time{}, err
	}
	for key, field := range map[string]string{"replicas": "replicas", "tp": "tensor_parallel", "pp": "pipeline_parallel"} {
		if d.has(key) {
			v, err := d.integer(key, 0)
			if err != nil {
				return "", time.Time{}, err
			}
			spec[field] = v
		}
	}
	for key, field := range map[string]string{"gpu-memory": "gpu_memory", "gpu-type": "gpu_type"} {
		if d.has(key) {
			if spec[field], err = d.str(key, ""); err != nil {
				return "", time.Time{}, err
			}
		}
	}
	if args, ok := d.list("args"); ok {
		spec["args"] = args
	}
	for key, field := range map[string]string{"labels": "labels", "env": "env"} {
		if kvs, ok := d.list(key); ok {
			m := map[string]string{}
			for _, kv := range kvs {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return "", time.Time{}, usagef("%s: %q: want k=v", key, kv)
				}
				m[k] = v
			}
			spec[field] = m
		}
	}
	n, err := r.via(d)
	if err != nil {
		return "", time.Time{}, err
	}
	at := time.Now()
	if err := r.call(r.ctx, "POST", n.api()+"/v1/deployments", spec, true, nil); err != nil {
		return "", at, err
	}
	return "ok", at, nil
}

func (r *runner) cmdUnplace(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	name, err := d.nextPos("deployment name")
	if err != nil {
		return "", time.Time{}, err
	}
	n, err := r.via(d)
	if err != nil {
		return "", time.Time{}, err
	}
	at := time.Now()
	if err := r.call(r.ctx, "DELETE", n.api()+"/v1/deployments/"+name, nil, true, nil); err != nil {
		return "", at, err
	}
	return "ok", at, nil
}

func (r *runner) cmdCrashEngine(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	shard, err := d.nextPos("shard")
	if err != nil {
		return "", time.Time{}, err
	}
	obs := r.observers(nil)
	if len(obs) == 0 {
		return "", time.Time{}, errors.New("no node is up")
	}
	var rows []shardRow
	if err := r.get(r.ctx, obs[0], "/v1/shards", &rows); err != nil {
		return "", time.Time{}, err
	}
	pid := 0
	for _, row := range rows {
		if row.ShardID == shard && row.PID > 0 && !row.Draining {
			pid = row.PID
		}
	}
	if pid == 0 {
		return "", time.Time{}, fmt.Errorf("%s has no engine pid in /v1/shards (runtime %s)", shard, r.cfg.runtime)
	}
	if _, ok := engineProcs(r.opts.Binary)[pid]; !ok && r.cfg.runtime == "process" {
		return "", time.Time{}, fmt.Errorf("%s: pid in /v1/shards is not an engine of this run", shard)
	}
	at := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return "", at, fmt.Errorf("kill the engine of %s: %w", shard, err)
	}
	return "killed the engine of " + shard + " (SIGKILL)", at, nil
}

// ---- measure ----

func (r *runner) cmdMeasure(d *directive) (string, time.Time, error) {
	name, err := d.nextPos("measure name")
	if err != nil {
		return "", time.Time{}, err
	}
	from, err := d.need("from")
	if err != nil {
		return "", time.Time{}, err
	}
	to, err := d.need("to")
	if err != nil {
		return "", time.Time{}, err
	}
	maxD, err := d.duration("max", 0)
	if err != nil {
		return "", time.Time{}, err
	}
	t0, ok0 := r.events[from]
	t1, ok1 := r.events[to]
	if !ok0 || !ok1 {
		return "", time.Time{}, usagef("measure: no event %q or %q yet (events are command names and mark= names)", from, to)
	}
	el := t1.Sub(t0)
	r.res.Measures = append(r.res.Measures, Measure{Name: name, D: el, Max: maxD})
	if maxD == 0 {
		return name + ": measured", time.Time{}, nil
	}
	if el <= maxD {
		return fmt.Sprintf("%s: within %v", name, maxD), time.Time{}, nil
	}
	return fmt.Sprintf("%s: %.2fs, over the %v budget", name, el.Seconds(), maxD), time.Time{}, nil
}

func (r *runner) cmdDump(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	name, err := d.nextPos("dump name")
	if err != nil {
		return "", time.Time{}, err
	}
	obs := r.observers(nil)
	for _, n := range obs {
		for _, path := range []string{"/v1/cluster", "/v1/plan", "/v1/shards", "/status.json"} {
			var raw json.RawMessage
			if err := r.get(r.ctx, n, path, &raw); err != nil {
				raw, _ = json.Marshal(map[string]string{"error": err.Error()})
			}
			file := fmt.Sprintf("dump-%s-%s-%s.json", name, n.name, strings.Trim(strings.ReplaceAll(path, "/", "-"), "-"))
			if err := os.WriteFile(filepath.Join(r.work, file), raw, 0o644); err != nil {
				return "", time.Time{}, err
			}
		}
	}
	return fmt.Sprintf("dumped %d nodes", len(obs)), time.Time{}, nil
}

func execOutput(bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	b, err := cmd.CombinedOutput()
	return string(b), err
}
