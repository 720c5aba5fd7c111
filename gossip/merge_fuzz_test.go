package gossip

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
)

// FuzzMergeOrder decodes a list of deployment records from the input and
// merges them forwards, backwards and twice over: every order must give the
// same state.
func FuzzMergeOrder(f *testing.F) {
	f.Add([]byte(`[{"name":"a","spec":{"name":"a","model":"x"},"stamp":{"wall":5,"origin":"n1"}},{"name":"a","deleted":true,"stamp":{"wall":5,"origin":"n1"}}]`))
	f.Add([]byte(`[{"name":"b","spec":{"name":"b","model":"y"},"stamp":{"wall":1,"logical":2,"origin":"n2"}},{"name":"b","spec":{"name":"b","model":"z"},"stamp":{"wall":1,"logical":2,"origin":"n2"}}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var recs []DeploymentRecord
		if json.Unmarshal(data, &recs) != nil || len(recs) > 64 {
			return
		}
		clk := clock.NewFake(time.UnixMilli(1 << 40))
		state := func(order []DeploymentRecord) string {
			s := NewStore(clk, time.Duration(1<<62))
			for _, r := range order {
				if r.Spec != nil {
					r.Spec.Name = r.Name
				}
				s.MergeDeployment(r)
			}
			b, _ := json.Marshal(s.Deployments())
			return string(b)
		}
		rev := make([]DeploymentRecord, len(recs))
		for i, r := range recs {
			rev[len(recs)-1-i] = r
		}
		fwd := state(recs)
		if back := state(rev); back != fwd {
			t.Fatalf("order matters:\n%s\n%s", fwd, back)
		}
		if twice := state(append(append([]DeploymentRecord{}, recs...), rev...)); twice != fwd {
			t.Fatalf("not idempotent:\n%s\n%s", fwd, twice)
		}
	})
}
