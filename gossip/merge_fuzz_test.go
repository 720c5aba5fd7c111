package gossip

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/protocol"
)

// FuzzMergeOrder decodes a list of deployment records from the input, each
// with its bytes as a peer's arrive, and merges them forwards, backwards
// and twice over, at every protocol version this build speaks: for a
// given version every order must give the same state, bytes included.
func FuzzMergeOrder(f *testing.F) {
	f.Add([]byte(`[{"name":"a","spec":{"name":"a","model":"x"},"stamp":{"wall":5,"origin":"n1"}},{"name":"a","deleted":true,"stamp":{"wall":5,"origin":"n1"}}]`))
	f.Add([]byte(`[{"name":"b","spec":{"name":"b","model":"y"},"stamp":{"wall":1,"logical":2,"origin":"n2"}},{"name":"b","spec":{"name":"b","model":"z"},"stamp":{"wall":1,"logical":2,"origin":"n2"}}]`))
	// The longer spec is the lexically smaller: the versions' rules differ.
	f.Add([]byte(`[{"name":"c","spec":{"name":"c","model":"b"},"stamp":{"wall":1,"origin":"n2"}},{"name":"c","spec":{"name":"c","model":"a","start_timeout":"3h"},"stamp":{"wall":1,"origin":"n2"}}]`))
	// Equal specs, records that differ only in a field this build does not know.
	f.Add([]byte(`[{"name":"d","deleted":true,"stamp":{"wall":1,"origin":"n2"}},{"name":"d","deleted":true,"stamp":{"wall":1,"origin":"n2"},"future_field":{"x":1}}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var raws []json.RawMessage
		if json.Unmarshal(data, &raws) != nil || len(raws) > 64 {
			return
		}
		var recs []depEntry
		for _, raw := range raws {
			var r DeploymentRecord
			if json.Unmarshal(raw, &r) == nil {
				recs = append(recs, depEntry{rec: r, raw: raw})
			}
		}
		clk := clock.NewFake(time.UnixMilli(1 << 40))
		for version := protocol.Min; version <= protocol.Max; version++ {
			state := func(order []depEntry) string {
				s := NewStore(clk, time.Duration(1<<62), func() int { return version })
				for _, r := range order {
					s.mergeDeployment(r)
				}
				var out strings.Builder
				for _, d := range s.depEntries() {
					b, _ := json.Marshal(d.rec)
					out.Write(b)
					out.WriteString(" ")
					out.Write(d.raw)
					out.WriteString("\n")
				}
				return out.String()
			}
			rev := make([]depEntry, len(recs))
			for i, r := range recs {
				rev[len(recs)-1-i] = r
			}
			fwd := state(recs)
			if back := state(rev); back != fwd {
				t.Fatalf("protocol %d: order matters:\n%s\n%s", version, fwd, back)
			}
			if twice := state(append(append([]depEntry{}, recs...), rev...)); twice != fwd {
				t.Fatalf("protocol %d: not idempotent:\n%s\n%s", version, fwd, twice)
			}
		}
	})
}
