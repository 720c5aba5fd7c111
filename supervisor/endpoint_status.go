package supervisor

import (
	"net/http"
	"time"
)

// handleStatus is /status.json: this node as it sees itself (its record,
// gossip counters, what is assigned here, whether it is isolated, whether
// it had settled when its last pass began: `llmgw node upgrade` waits for
// that before it trusts what is assigned here).
func (s *apiServer) handleStatus(w http.ResponseWriter, r *http.Request) {
	rec := s.gossip.Local()
	snap := s.node.Status()
	plan := snap.Plan()
	body := map[string]any{
		"settled":       snap.Settled(),
		"name":          s.conf.name,
		"api":           s.addr(),
		"gossip":        s.gossip.Address(),
		"profile":       s.conf.profile,
		"version":       s.conf.version,
		"started_at":    s.conf.started,
		"uptime_s":      s.clock.Since(s.conf.started).Round(100 * time.Millisecond).Seconds(),
		"tools":         s.tools.get(),
		"record":        rec,
		"gossip_stats":  s.gossip.Stats(),
		"assigned_here": plan.ForNode(s.conf.name),
		"lease_ttl":     s.conf.leaseTTL.String(),
		"isolated":      false,
	}
	// Isolated: this node hears no peer although it expects some (see
	// isolation.go); last_heard is when it last heard one.
	if since := s.isolation.since(); !since.IsZero() {
		body["isolated"], body["isolated_since"] = true, since
	}
	if heard := s.gossip.LastHeard(); !heard.IsZero() {
		body["last_heard"] = heard
	}
	writeJSON(w, http.StatusOK, body)
}
