package scenarios

import (
	"fmt"
	"os"
	"strings"
)

// condIsolated holds when every observer's /status.json says it is (want
// true) or is not isolated: it hears no peer although it expects some.
func (r *runner) condIsolated(obs []*node, want bool) (bool, string) {
	type statusJSON struct {
		Isolated bool `json:"isolated"`
	}
	sts, errs := fetchAll[statusJSON](r.ctx, r, obs, "/status.json")
	if err := firstErr(obs, errs); err != nil {
		return false, err.Error()
	}
	for i, st := range sts {
		if st.Isolated != want {
			return false, fmt.Sprintf("%s: isolated=%v", obs[i].name, st.Isolated)
		}
	}
	return true, ""
}

// isolatedCondition parses "isolated yes|no".
func (r *runner) isolatedCondition(args []string) (cond, error) {
	if len(args) != 1 || (args[0] != "yes" && args[0] != "no") {
		return nil, usagef("wait-until isolated: want yes or no")
	}
	want := args[0] == "yes"
	return func(obs []*node) (bool, string) { return r.condIsolated(obs, want) }, nil
}

// expectLog counts the lines of a node's log (every run of it) that
// contain match=TEXT: "expect log n3 match=\"is isolated\"".
func (r *runner) expectLog(d *directive) (string, error) {
	ref, err := d.nextPos("a node")
	if err != nil {
		return "", err
	}
	match, err := d.need("match")
	if err != nil {
		return "", err
	}
	ns, labels, err := r.resolveNodes(r.ctx, []string{ref})
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for i, n := range ns {
		raw, err := os.ReadFile(n.logPath)
		if err != nil {
			return "", fmt.Errorf("log of %s: %w", n.name, err)
		}
		count := 0
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.Contains(line, match) {
				count++
			}
		}
		word := "lines"
		if count == 1 {
			word = "line"
		}
		fmt.Fprintf(&b, "%s: %d %s with %q\n", labels[i], count, word, match)
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}
