package host

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
)

// systemdUnitsCommand is the one command systemd_units runs: running
// services only, one per line, no pager, colour, bullets or legend, so
// every line is "UNIT LOAD ACTIVE SUB DESCRIPTION".
func systemdUnitsCommand() []string {
	return []string{"systemctl", "list-units", "--type=service", "--state=running", "--no-pager", "--plain", "--no-legend"}
}

// systemdAbsent are systemctl's words when systemd is installed but is not
// the init system (a container, a chroot, WSL without systemd).
var systemdAbsent = []string{"has not been booted with systemd", "Failed to connect to bus", "System has not been booted"}

func systemdUnitsTool(c Config) Tool {
	cmd := systemdUnitsCommand()
	line := strings.Join(cmd, " ")
	return Tool{
		Name: "systemd_units",
		Description: "The systemd services running on this host (" + line + "), one row each: unit, load " +
			"state, active state, sub state, description. Shows whether containerd, the NVIDIA persistence " +
			"and fabric manager daemons, the llmgw agent itself and anything unexpected are running. A host " +
			"without systemd (a container) says so.",
		Run: func(ctx context.Context, _ Args) (string, error) {
			if _, err := c.Runner.LookPath(cmd[0]); err != nil {
				return c.stamp(line, fmt.Sprintf("(no systemd on %s: systemctl is not installed)\n", c.Host)), nil
			}
			out, problem, err := c.try(ctx, cmd[0], cmd[1:]...)
			if err != nil {
				return "", err
			}
			for _, w := range systemdAbsent {
				if strings.Contains(out, w) {
					return c.stamp(line, fmt.Sprintf("(systemd is not running on %s: it is not this host's init system, e.g. in a container)\n%s", c.Host, out)), nil
				}
			}
			if problem != "" {
				return c.stamp(line, capHead(out+problem, c.MaxOutput)), nil
			}
			return c.stamp(line, capHead(unitTable(out), c.MaxOutput)), nil
		},
	}
}

// unitTable lays systemctl's lines out in columns under a count; a line
// that is not "UNIT LOAD ACTIVE SUB DESCRIPTION" is kept as it came, below.
func unitTable(out string) string {
	var b, odd strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	n := 0
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 0:
			continue
		case len(f) < 4 || !strings.Contains(f[0], "."):
			fmt.Fprintln(&odd, l)
			continue
		}
		if n == 0 {
			fmt.Fprintln(tw, "UNIT\tLOAD\tACTIVE\tSUB\tDESCRIPTION")
		}
		n++
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", f[0], f[1], f[2], f[3], strings.Join(f[4:], " "))
	}
	_ = tw.Flush()
	head := fmt.Sprintf("%d services running\n", n)
	if n == 1 {
		head = "1 service running\n"
	}
	if odd.Len() > 0 {
		return head + b.String() + "lines not in systemctl's usual form:\n" + odd.String()
	}
	return head + b.String()
}
