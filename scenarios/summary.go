package scenarios

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Summary renders results as a table: one row per scenario with its
// result, the well-known measured times (detection, full-strength,
// convergence), the memberlist profile, the node count and the wall time;
// other measures and notes follow in the last column.
func Summary(results []Result) string {
	var rows [][]string
	for _, r := range results {
		res := "PASS"
		switch {
		case r.Skipped:
			res = "SKIP"
		case !r.Passed:
			res = "FAIL"
		}
		known := map[string]string{}
		var other []string
		for _, m := range r.Measures {
			v := fmtDur(m.D)
			if m.Max > 0 {
				v += "/" + m.Max.String()
				if m.D > m.Max {
					v += "!"
				}
			}
			switch m.Name {
			case "detection", "full-strength", "convergence":
				if known[m.Name] != "" {
					known[m.Name] += " "
				}
				known[m.Name] += v
			default:
				other = append(other, m.Name+"="+v)
			}
		}
		other = append(other, r.Notes...)
		if r.Skipped {
			other = append(other, r.Why)
		}
		nodes := "-"
		if r.Nodes > 0 {
			nodes = strconv.Itoa(r.Nodes)
		}
		rows = append(rows, []string{r.Name, res, dash(known["detection"]), dash(known["full-strength"]), dash(known["convergence"]),
			dash(r.Profile), nodes, fmtDur(r.Duration), dash(strings.Join(other, "; "))})
	}
	return table([]string{"SCENARIO", "RESULT", "DETECTION", "FULL-STRENGTH", "CONVERGENCE", "PROFILE", "NODES", "WALL", "OTHER"}, rows)
}

func fmtDur(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
