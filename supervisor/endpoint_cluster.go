package supervisor

import (
	"net/http"

	"github.com/llmgw/llmgw/supervisor/status"
)

// handleCluster is /v1/cluster: every member as this node's last pass saw
// it, with the cluster version it ran at.
func (s *apiServer) handleCluster(w http.ResponseWriter, r *http.Request) {
	snap := s.node.Status()
	writeJSON(w, http.StatusOK, status.ClusterInfo{Self: s.conf.name, Members: snap.Members(),
		ActiveVersion: snap.ActiveVersion(), VersionsMixedSince: snap.VersionsMixedSince()})
}
