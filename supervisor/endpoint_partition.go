package supervisor

import (
	"encoding/json"
	"net/http"
	"sync"
)

// dropRules are the test partition's: the peers whose gossip this node
// drops (gossip.Config.Drop), set through POST /v1/test/partition. TEST
// ONLY: the route exists with Config.TestHooks alone. The zero value
// drops nothing.
type dropRules struct {
	mu   sync.Mutex
	drop map[string]bool
}

// dropped says whether gossip to and from peer is dropped.
func (d *dropRules) dropped(peer string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.drop[peer]
}

func (d *dropRules) set(peers []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.drop = map[string]bool{}
	for _, p := range peers {
		d.drop[p] = true
	}
}

// handlePartition sets the test-only drop rules: {"drop": ["n3","n4"]}.
func (s *apiServer) handlePartition(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Drop []string `json:"drop"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "want {\"drop\": [node names]}: "+err.Error())
		return
	}
	s.drops.set(req.Drop)
	s.log.Warn("TEST HOOK: dropping gossip to and from nodes", "nodes", req.Drop)
	writeJSON(w, http.StatusOK, map[string]any{"drop": req.Drop})
}
