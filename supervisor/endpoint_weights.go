package supervisor

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/llmgw/llmgw/probes/weights"
)

// handleWeightsHeaders answers another node's gpu_memory: auto lookup with
// the headers of a model in this node's weights dir: config and tensor
// list, never the weights. It needs the token or a hop signed for
// "weights". The asking side is Node.peerHeaders (weights.go).
func (s *apiServer) handleWeightsHeaders(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(hopHeader) != "" {
		if _, err := s.hops.verify(r, "weights", nil); err != nil {
			writeError(w, http.StatusForbidden, err.Error())
			return
		}
	} else if !s.checkToken(w, r) {
		return
	}
	model := r.URL.Query().Get("model")
	path, ok := weights.Find(s.conf.weightsDir, model)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("%s: model %q is not in this node's weights dir", s.conf.name, model))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	m, err := weights.LoadPath(ctx, path)
	if err != nil {
		writeError(w, http.StatusUnprocessableEntity, fmt.Sprintf("%s: %v", s.conf.name, err))
		return
	}
	m.Name = model
	writeJSON(w, http.StatusOK, m)
}
