package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// upgradeCommand is `node upgrade`: one node's part of a rolling upgrade,
// done the way an operator would by hand (install the binary by rename,
// restart the service, watch the node come back), ending only once the
// node serves again, so that `llmgw node upgrade ... && ssh next-node ...`
// moves on to the next node at the right moment.
func (s serviceSetup) upgradeCommand() *cli.Command {
	return &cli.Command{
		Name:  "upgrade",
		Usage: "replace the installed llmgw with --binary (by rename), restart the service, and wait until this node is back, settled and its shards ready; exits 0 only then, so nodes can be chained with &&",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "binary", Required: true, Usage: "the new llmgw binary; refused, with nothing changed, unless it runs (`PATH version` answers)"},
			&cli.StringFlag{Name: "install-path", Usage: "the installed llmgw to replace (default: the binary the unit's ExecStart names, as node install wrote it)"},
			&cli.StringFlag{Name: "addr", Usage: "this node's API address (default: LLMGW_API in node.env, on loopback, else http://127.0.0.1:7070)"},
			&cli.DurationFlag{Name: "timeout", Value: 10 * time.Minute, Usage: "how long to wait for the node to be back, settled and its shards ready"},
		},
		Action: func(ctx context.Context, c *cli.Command) error { return s.upgrade(ctx, c) },
	}
}

func (s serviceSetup) upgrade(ctx context.Context, c *cli.Command) error {
	w := c.Root().Writer
	if c.Args().Len() > 0 {
		return usageError(fmt.Sprintf("node upgrade: unexpected argument %q: give the new binary as --binary PATH", c.Args().First()))
	}
	timeout := c.Duration("timeout")
	if timeout <= 0 {
		return usageError(fmt.Sprintf("--timeout %s: want a duration above 0, e.g. 10m", timeout))
	}
	// Everything that can refuse is checked before the binary is touched:
	// a refused upgrade leaves the node as it was.
	if _, err := s.run.LookPath("systemctl"); err != nil {
		return failure("node upgrade: systemctl not found: this machine does not run systemd; replace the binary and restart the agent yourself. Nothing was changed")
	}
	target, err := s.installPath(c.String("install-path"))
	if err != nil {
		return err
	}
	bin, err := filepath.Abs(c.String("binary"))
	if err != nil {
		return usageError(fmt.Sprintf("--binary: %v", err))
	}
	want, err := s.binaryVersion(ctx, bin)
	if err != nil {
		return usageError(fmt.Sprintf("--binary %s: %v. Nothing was changed", bin, err))
	}
	base, err := s.nodeAPI(c.String("addr"))
	if err != nil {
		return usageError(err.Error())
	}
	api := &http.Client{Timeout: 5 * time.Second}

	who := "the node"
	if st, err := agentStatus(ctx, api, base); err != nil {
		fmt.Fprintf(w, "llmgw: the agent does not answer at %s now (%v); upgrading anyway\n", base, err)
	} else {
		who = st.Name
		fmt.Fprintf(w, "llmgw: %s runs llmgw %s; installing llmgw %s at %s\n", who, st.Version, want, target)
	}
	if err := s.installBinary(ctx, bin, target, want); err != nil {
		return failure("node upgrade: " + err.Error())
	}
	fmt.Fprintf(w, "llmgw: installed %s (by rename: the running agent keeps its old file until it exits); restarting %s\n", target, serviceName)
	// The new agent's start time is later than this: whatever answers
	// with an earlier one is still the old agent.
	restarted := time.Now() // real time: compared with the agent's started_at on this same host
	if err := s.systemctl(ctx, "restart", serviceName); err != nil {
		return failure(fmt.Sprintf("node upgrade: the new binary is installed at %s, but the restart failed: %v; see journalctl -u %s", target, err, serviceName))
	}
	return s.waitBack(ctx, w, api, base, who, want, restarted, timeout)
}

// installPath is the installed llmgw that upgrade replaces: --install-path
// or the unit's ExecStart. It must be there: a path that names nothing
// (a typo) would get the new binary while the service went on running the
// old one.
func (s serviceSetup) installPath(flag string) (string, error) {
	if flag != "" {
		p, err := filepath.Abs(flag)
		if err != nil {
			return "", usageError(fmt.Sprintf("--install-path: %v", err))
		}
		if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
			return "", usageError(fmt.Sprintf("--install-path %s: want the installed llmgw binary, the one your unit's ExecStart runs (%v). Nothing was changed", p, describeStat(st, err)))
		}
		return p, nil
	}
	p, err := s.installedBinary()
	if err != nil {
		return "", failure("node upgrade: " + err.Error() + ". Nothing was changed")
	}
	if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
		return "", failure(fmt.Sprintf("node upgrade: %s names %s as the installed llmgw, but %v; give --install-path. Nothing was changed", s.unitFile(), p, describeStat(st, err)))
	}
	return p, nil
}

// describeStat says why a stat result is not a regular file.
func describeStat(st fs.FileInfo, err error) string {
	if err != nil {
		return err.Error()
	}
	return "it is not a regular file"
}

// installedBinary is the llmgw the service runs: ExecStart's program in
// the unit node install wrote.
func (s serviceSetup) installedBinary() (string, error) {
	f, err := os.Open(s.unitFile())
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%s is not there: llmgw was not installed with llmgw node install; give --install-path, the binary your unit's ExecStart runs", s.unitFile())
	}
	if err != nil {
		return "", fmt.Errorf("%v (run with sudo)", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "ExecStart=")
		if !ok {
			continue
		}
		// systemd's prefixes (-, @, :, +, !) go before the path.
		if fields := strings.Fields(strings.TrimLeft(v, "-@:+!")); len(fields) > 0 && filepath.IsAbs(fields[0]) {
			return fields[0], nil
		}
		return "", fmt.Errorf("%s: ExecStart=%s names no absolute path; give --install-path", s.unitFile(), v)
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read %s: %w", s.unitFile(), err)
	}
	return "", fmt.Errorf("%s has no ExecStart line; give --install-path", s.unitFile())
}

// binaryVersion runs `path version` and returns the build it names: a
// binary that is not executable, does not run here (another architecture,
// a missing loader) or does not answer as llmgw does is refused.
func (s serviceSetup) binaryVersion(ctx context.Context, path string) (string, error) {
	st, err := os.Stat(path)
	switch {
	case err != nil:
		return "", err
	case !st.Mode().IsRegular():
		return "", errors.New("not a regular file")
	case st.Mode().Perm()&0o111 == 0:
		return "", fmt.Errorf("not executable (mode %v): chmod +x it", st.Mode().Perm())
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := s.run.Run(ctx, path, "version")
	if err != nil {
		msg := fmt.Sprintf("`%s version` failed: %v", filepath.Base(path), err)
		if said := clipLine(string(out)); said != "" {
			msg += ": " + said
		}
		return "", errors.New(msg)
	}
	// `llmgw version` prints "llmgw <build> ..." first.
	first, _, _ := strings.Cut(string(out), "\n")
	fields := strings.Fields(first)
	if len(fields) < 2 || fields[0] != "llmgw" {
		return "", fmt.Errorf("`%s version` printed %q, not an llmgw build", filepath.Base(path), clipLine(first))
	}
	return fields[1], nil
}

// installBinary puts a copy of bin at target: the copy is written beside target
// (same file system), given target's mode, synced, checked to run, then
// renamed over target. A running executable cannot be written in place
// (ETXTBSY); the rename leaves the running agent's file (its inode) as it
// is until that agent exits, and a crash midway leaves either the old
// binary or the new one at target, never half of one.
func (s serviceSetup) installBinary(ctx context.Context, bin, target, want string) error {
	if err := s.copyOver(ctx, bin, target, want); err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return fmt.Errorf("%w (run with sudo); the installed binary is unchanged", err)
		}
		return fmt.Errorf("%w; the installed binary is unchanged", err)
	}
	dir := filepath.Dir(target)
	d, err := os.Open(dir)
	if err == nil {
		err = d.Sync()
		d.Close()
	}
	if err != nil {
		return fmt.Errorf("installed %s, but the fsync of %s failed, so the rename may not survive a crash: %w; nothing was restarted", target, dir, err)
	}
	return nil
}

// copyOver is installBinary up to the rename: after an error target is
// what it was, and no copy is left beside it.
func (s serviceSetup) copyOver(ctx context.Context, bin, target, want string) error {
	st, err := os.Stat(target)
	if err != nil {
		return err
	}
	mode := st.Mode().Perm()
	src, err := os.Open(bin)
	if err != nil {
		return err
	}
	defer src.Close()
	dir := filepath.Dir(target)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(target)+".upgrade-*")
	if err != nil {
		return err
	}
	renamed := false
	defer func() {
		if !renamed {
			_ = os.Remove(tmp.Name())
		}
	}()
	_, err = io.Copy(tmp, src)
	if err == nil {
		err = tmp.Chmod(mode)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", bin, dir, err)
	}
	// The copy, not only the original, must run: dir may be mounted
	// noexec, or the copy may have been cut short.
	if got, err := s.binaryVersion(ctx, tmp.Name()); err != nil || got != want {
		return fmt.Errorf("the copy in %s does not run as llmgw %s (%v, it said %q)", dir, want, err, got)
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return err
	}
	renamed = true
	return nil
}

// nodeAPI is this node's API base URL: --addr, else the --api that node
// install wrote to node.env (a wildcard host dialled on loopback), else
// node up's default.
func (s serviceSetup) nodeAPI(addr string) (string, error) {
	if addr == "" {
		addr = "127.0.0.1:7070"
		if api := envFileValue(s.envFile(), "LLMGW_API"); api != "" {
			host, port, err := net.SplitHostPort(api)
			if err != nil {
				return "", fmt.Errorf("%s: LLMGW_API=%q: want host:port; give --addr", s.envFile(), api)
			}
			if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
				host = "127.0.0.1"
			}
			addr = net.JoinHostPort(host, port)
		}
	}
	base := strings.TrimRight(addr, "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	return base, nil
}

// envFileValue is key's value in an environment file as install writes it
// (KEY="value", \ and " escaped), empty when the file or the key is not
// there.
func envFileValue(path, key string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(l), key+"=")
		if !ok {
			continue
		}
		if uq, err := strconv.Unquote(v); err == nil {
			return uq
		}
		return strings.Trim(v, `"`)
	}
	return ""
}

// agentState is what the wait reads of /status.json.
type agentState struct {
	Name      string    `json:"name"`
	Version   string    `json:"version"`
	StartedAt time.Time `json:"started_at"`
	// Settled: the agent has heard the cluster (joined a peer, had none
	// to join, or waited out the settle bound). Before that its plan
	// comes from a partial view, and "no shard for this node" means
	// nothing.
	Settled bool `json:"settled"`
}

func agentStatus(ctx context.Context, api *http.Client, base string) (agentState, error) {
	var st agentState
	err := agentGet(ctx, api, base+"/status.json", &st)
	return st, err
}

// agentGet reads url's JSON answer into out. Its errors are short, for a
// progress line: what went wrong, not which flag to set (upgrade talks to
// this node, never to LLMGW_ADDR's).
func agentGet(ctx context.Context, api *http.Client, url string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := api.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) {
			return op // "dial tcp 127.0.0.1:7070: connect: connection refused"
		}
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("it answered %s", resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out); err != nil {
		return fmt.Errorf("its answer does not parse: %w", err)
	}
	return nil
}

// waitBack polls the node until its agent is the new build (started after
// the restart), settled, and every shard the plan gives it is ready with a
// valid lease in its own view, printing a line whenever what it waits for
// changes; it fails once timeout has passed.
func (s serviceSetup) waitBack(ctx context.Context, w io.Writer, api *http.Client, base, who, want string, restarted time.Time, timeout time.Duration) error {
	poll := s.poll
	if poll <= 0 {
		poll = time.Second
	}
	deadline := restarted.Add(timeout)
	last := ""
	for {
		done, line := backAndReady(ctx, api, base, who, want, restarted)
		if line != last {
			fmt.Fprintf(w, "llmgw: %s\n", line)
			last = line
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) { // real time: the operator's --timeout
			return failure(fmt.Sprintf("node upgrade: not back and ready within %s: %s. The new binary is installed and the service restarted; see journalctl -u %s and llmgw shards",
				timeout, line, serviceName))
		}
		if !clock.SleepReal(ctx, poll) {
			return failure("node upgrade: interrupted while waiting: " + line)
		}
	}
}

// backAndReady is one look at the node: whether it is done, and a line
// saying where it stands.
func backAndReady(ctx context.Context, api *http.Client, base, who, want string, restarted time.Time) (bool, string) {
	st, err := agentStatus(ctx, api, base)
	switch {
	case err != nil:
		return false, fmt.Sprintf("waiting for %s's agent to answer at %s (%v)", who, base, err)
	case st.Version != want:
		return false, fmt.Sprintf("%s's agent answers as llmgw %s, not yet %s", st.Name, st.Version, want)
	case st.StartedAt.Before(restarted):
		return false, fmt.Sprintf("%s's agent started at %s, before the restart: still the old one", st.Name, st.StartedAt.Format(time.RFC3339))
	case !st.Settled:
		return false, fmt.Sprintf("%s is back on llmgw %s, not settled yet (it has not heard the cluster)", st.Name, want)
	}
	var shards []status.ShardInfo
	if err := agentGet(ctx, api, base+"/v1/shards", &shards); err != nil {
		return false, fmt.Sprintf("%s is back and settled; its shards do not answer (%v)", st.Name, err)
	}
	// The shards the plan counts on here: a copy being stopped (not in the
	// plan) or replaced (draining) is on its way out and waits for no one.
	var mine, ready int
	var waiting []string
	for _, sh := range shards {
		if sh.Node != st.Name || sh.Draining || sh.Reason == status.ReasonNotPlanned {
			continue
		}
		mine++
		if sh.Lease == placement.LeaseValid {
			ready++
		} else if len(waiting) < 3 {
			waiting = append(waiting, fmt.Sprintf("%s: %s, lease %s", sh.ShardID, sh.Status, sh.Lease))
		}
	}
	switch {
	case mine == 0:
		return true, fmt.Sprintf("%s is back on llmgw %s and settled; the plan gives it no shard", st.Name, want)
	case ready < mine:
		return false, fmt.Sprintf("%s is back on llmgw %s and settled; %d of %d shards ready (%s)", st.Name, want, ready, mine, strings.Join(waiting, "; "))
	}
	if mine == 1 {
		return true, fmt.Sprintf("%s is back on llmgw %s, settled, and its shard is ready", st.Name, want)
	}
	return true, fmt.Sprintf("%s is back on llmgw %s, settled, and its %d shards are ready", st.Name, want, mine)
}

// clipLine is the first line of a command's output, at most 200 bytes, for
// an error message.
func clipLine(out string) string {
	first, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	if len(first) > 200 {
		first = strings.ToValidUTF8(first[:200], "") + "..."
	}
	return first
}
