package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/supervisor/status"
)

// defaultPlaceWait is how long a bare --wait waits: an engine that loads a
// large model from a cold cache takes minutes.
const defaultPlaceWait = 30 * time.Minute

// placeWaitPoll is how often --wait reads the deployment back.
const placeWaitPoll = 500 * time.Millisecond

// waitValue is --wait[=DURATION]: alone it waits defaultPlaceWait. It is a
// flag value that says it needs no argument (urfave/cli's IsBoolFlag), so
// "--wait" takes none and "--wait=5m" sets the limit.
type waitValue struct{ d time.Duration }

func (w *waitValue) Set(s string) error {
	switch s {
	case "true":
		w.d = defaultPlaceWait
		return nil
	case "false":
		w.d = 0
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return fmt.Errorf("want a duration such as 10m, or --wait alone for %s", defaultPlaceWait)
	}
	w.d = d
	return nil
}

func (w *waitValue) String() string {
	if w == nil || w.d == 0 {
		return ""
	}
	return w.d.String()
}

func (w *waitValue) Get() any         { return w.d }
func (w *waitValue) IsBoolFlag() bool { return true }

func waitFlag() cli.Flag {
	return &cli.GenericFlag{Name: "wait", Value: &waitValue{},
		Usage: "block until every replica is ready, showing progress; --wait=DURATION bounds it (alone: " + defaultPlaceWait.String() + "); exit status 0 only when ready"}
}

// changeWords says what a place did to the spec the cluster held.
func changeWords(change string) string {
	switch change {
	case status.ChangeNew:
		return "new deployment"
	case status.ChangeChanged:
		return "spec changed: replicas roll to the new spec, the old ones serving until the new are ready"
	case status.ChangeScaled:
		return "replicas changed, same spec: replicas that serve keep running"
	case status.ChangeSettings:
		return "settings changed (nothing an engine starts with: update, start_timeout, the autoscaling range, priority, runtime adapters or the gateways' P/D settings), same spec: no replica restarts"
	case status.ChangeUnchanged:
		return "unchanged: the cluster already had this spec and replica count"
	}
	return "placed"
}

// placeReport writes what a place did: the change, how many replicas the
// plan computed with it can place now and, short of all, placement's
// reasons.
func placeReport(w io.Writer, out status.DeploymentInfo) {
	fmt.Fprintf(w, "placed %s (%s, spec %s): %s\n", out.Name, out.Model, out.SpecVersion, changeWords(out.Change))
	fmt.Fprintf(w, "%d of %d replicas can be placed now, %d ready", out.Placed, out.Replicas, out.Ready)
	if out.Placed < out.Replicas && len(out.Why) > 0 {
		fmt.Fprintf(w, "; why not the rest:\n")
		for _, why := range out.Why {
			fmt.Fprintf(w, "  %s\n", why)
		}
	} else {
		fmt.Fprintln(w)
	}
}

// placeAction posts the deployment, says what happened and, with --wait,
// waits for it.
func placeAction(ctx context.Context, c *cli.Command) error {
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	body, ctype, err := placeBody(c)
	if err != nil {
		return usageError(err.Error())
	}
	var out status.DeploymentInfo
	if err := cl.do(ctx, "POST", "/v1/deployments", body, ctype, &out); err != nil {
		return err
	}
	wait, _ := c.Value("wait").(time.Duration)
	if c.Bool("json") && wait == 0 {
		return printJSON(c.Root().Writer, out)
	}
	if !c.Bool("json") {
		placeReport(c.Root().Writer, out)
	}
	if wait == 0 {
		if !c.Bool("json") {
			fmt.Fprintf(c.Root().Writer, "watch it with: llmgw models (or place again with --wait)\n")
		}
		return nil
	}
	return waitReady(ctx, c, cl, out, wait)
}

// waitReady polls the deployment until every replica of its spec is
// ready, printing a line at every change of placed, ready or why, and
// fails with the last reason when the time runs out.
func waitReady(ctx context.Context, c *cli.Command, cl *client, placed status.DeploymentInfo, wait time.Duration) error {
	w := c.Root().Writer
	quiet := c.Bool("json")
	deadline := time.Now().Add(wait)
	last := ""
	for {
		d, found, err := readDeployment(ctx, cl, placed.Name)
		switch {
		case err != nil && ctx.Err() != nil:
			return failure(fmt.Sprintf("stopped waiting for %s: %v", placed.Name, ctx.Err()))
		case err != nil:
			// A node that restarts or a blip: keep waiting, say so once.
			if line := "cannot read the deployment back: " + err.Error() + "\n"; line != last {
				if !quiet {
					fmt.Fprint(w, line)
				}
				last = line
			}
		case !found:
			return failure(fmt.Sprintf("%s was removed while waiting for it", placed.Name))
		case d.SpecVersion != placed.SpecVersion:
			return failure(fmt.Sprintf("%s was placed again meanwhile (spec %s, not %s): stopped waiting", placed.Name, d.SpecVersion, placed.SpecVersion))
		case d.Ready >= d.Replicas:
			if quiet {
				return printJSON(w, d)
			}
			fmt.Fprintf(w, "ready: %d of %d replicas of %s serve (spec %s)\n", d.Ready, d.Replicas, d.Name, d.SpecVersion)
			return nil
		default:
			if line := waitLine(d); line != last {
				if !quiet {
					fmt.Fprint(w, line)
				}
				last = line
			}
		}
		if time.Now().After(deadline) {
			// The reason why not, on the error's one line.
			why := strings.ReplaceAll(strings.ReplaceAll(strings.TrimSpace(last), "; why:\n  ", "; why: "), "\n  ", "; ")
			why = strings.TrimPrefix(why, "waiting: ")
			return failure(fmt.Sprintf("%s not ready after %s: %s", placed.Name, wait, why))
		}
		t := time.NewTimer(placeWaitPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return failure(fmt.Sprintf("stopped waiting for %s: %v", placed.Name, ctx.Err()))
		case <-t.C:
		}
	}
}

// waitLine is one --wait progress report: counts, then placement's
// reasons, one a line.
func waitLine(d status.DeploymentInfo) string {
	s := fmt.Sprintf("waiting: %d of %d replicas ready, %d placed", d.Ready, d.Replicas, d.Placed)
	if len(d.Why) == 0 {
		return s + "\n"
	}
	return s + "; why:\n  " + strings.Join(d.Why, "\n  ") + "\n"
}

func readDeployment(ctx context.Context, cl *client, name string) (status.DeploymentInfo, bool, error) {
	var deps []status.DeploymentInfo
	if err := cl.do(ctx, "GET", "/v1/deployments", nil, "", &deps); err != nil {
		return status.DeploymentInfo{}, false, err
	}
	for _, d := range deps {
		if d.Name == name {
			return d, true, nil
		}
	}
	return status.DeploymentInfo{}, false, nil
}
