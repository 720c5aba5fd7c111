package supervisor

import (
	"maps"
	"net/http"
	"time"

	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// PlanInfo is the body of /v1/plan.
type PlanInfo struct {
	Node       string    `json:"node"`
	ComputedAt time.Time `json:"computed_at"`
	// Deployments are the specs the plan was computed from: name → spec
	// version. Two nodes with equal plans over different inputs have not
	// converged, they have only not heard the same news yet.
	Deployments map[string]string `json:"deployments"`
	// Current is false while this node knows deployments (or versions of
	// them) that its last plan did not see: the next pass will differ.
	Current bool           `json:"current"`
	Plan    placement.Plan `json:"plan"`
}

// handlePlan is /v1/plan: this node's last plan, and what it was computed
// from.
func (s *apiServer) handlePlan(w http.ResponseWriter, r *http.Request) {
	snap := s.node.Status()
	p := PlanInfo{Node: s.conf.name, ComputedAt: snap.BuiltAt(), Plan: snap.Plan(), Deployments: snap.PlannedFrom()}
	var known []placement.Deployment
	for _, rec := range s.gossip.Deployments() {
		if !rec.Deleted && rec.Spec != nil {
			known = append(known, *rec.Spec)
		}
	}
	p.Current = maps.Equal(p.Deployments, status.SpecVersions(known))
	if p.Plan.Assignments == nil {
		p.Plan.Assignments = []placement.Assignment{}
	}
	if p.Plan.Unplaced == nil {
		p.Plan.Unplaced = []placement.Unplaced{}
	}
	writeJSON(w, http.StatusOK, p)
}
