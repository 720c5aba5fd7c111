package supervisor

import (
	"net/http"

	"github.com/llmgw/llmgw/supervisor/status"
)

// handleCluster is /v1/cluster: every member as this node's last pass saw
// it.
func (s *apiServer) handleCluster(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, status.ClusterInfo{Self: s.conf.name, Members: s.node.Status().Members()})
}
