package gossip

import (
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/placement"
)

// An agent older than a spec field decodes a deployment without it and
// relays that copy at the write's stamp, in every push/pull. A newer node
// keeps the copy with the field, whichever it hears first: otherwise one
// older node would strip start_timeout from the whole cluster.
func TestACopyRelayedByAnOlderAgentDoesNotStripFields(t *testing.T) {
	stamp := Stamp{Wall: 1e12, Origin: "new"}
	full := placement.Deployment{Name: "chat", Model: "m", StartTimeout: placement.Duration(3 * time.Hour)}
	stripped := full
	stripped.StartTimeout = 0 // what a 9f0749d agent reads of it, and sends back
	for _, order := range [][]placement.Deployment{{full, stripped}, {stripped, full}} {
		s := NewStore(clock.NewFake(time.UnixMilli(1e12)), time.Hour)
		for _, d := range order {
			s.MergeDeployment(DeploymentRecord{Name: d.Name, Spec: &d, Stamp: stamp})
		}
		got, _ := s.Deployment("chat")
		if got.Spec == nil || got.Spec.StartTimeout != full.StartTimeout {
			t.Errorf("merged %v then %v: holds %+v, want start_timeout 3h", order[0].StartTimeout, order[1].StartTimeout, got.Spec)
		}
	}
}
