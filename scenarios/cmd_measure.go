package scenarios

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

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
