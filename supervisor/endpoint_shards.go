package supervisor

import "net/http"

// handleShards is /v1/shards: every shard, planned or held, with its
// lease as this node judges it. A shard's log is endpoint_logs.go's.
func (s *apiServer) handleShards(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.node.Status().Shards(s.clock.Now()))
}
