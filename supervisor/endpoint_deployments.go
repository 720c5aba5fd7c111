package supervisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/spec"
	"github.com/llmgw/llmgw/supervisor/status"
)

// handleDeployments is GET /v1/deployments: every deployment with where
// it runs.
func (s *apiServer) handleDeployments(w http.ResponseWriter, r *http.Request) {
	out := s.node.Status().Deployments(s.clock.Now())
	if s.conf.gatewayPD != nil {
		pd := s.conf.gatewayPD()
		for i := range out {
			out[i].PDOutcomes = pd[out[i].Name]
		}
	}
	// Reading needs no token, but env is where hub and registry secrets
	// go, and args may carry an API key: without the token they are
	// shown redacted.
	if !s.hasToken(r) {
		for i := range out {
			out[i].Deployment = spec.Redact(out[i].Deployment)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// handlePlace is POST /v1/deployments: a spec, as JSON or YAML, through
// Node.Place.
func (s *apiServer) handlePlace(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("spec larger than %d bytes", maxBody))
			return
		}
		writeError(w, http.StatusBadRequest, "read body: "+err.Error())
		return
	}
	d, err := spec.Decode(body, r.Header.Get("Content-Type"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	info, err := s.node.Place(r.Context(), d)
	writePlaced(w, info, err)
}

// writePlaced answers a write of a deployment's spec: the deployment as
// it stands, or what was wrong.
func writePlaced(w http.ResponseWriter, info status.DeploymentInfo, err error) {
	switch {
	case errors.Is(err, placement.ErrInvalidDeployment):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, gossip.ErrClockOutOfBounds):
		// This node's clock, not the request, is wrong: another node can
		// take the same request.
		writeError(w, http.StatusServiceUnavailable, err.Error())
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
	default:
		writeJSON(w, http.StatusOK, info)
	}
}

// handleUnplace is DELETE /v1/deployments/{name}, through Node.Unplace.
func (s *apiServer) handleUnplace(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	err := s.node.Unplace(name)
	switch {
	case errors.Is(err, ErrNoDeployment):
		writeError(w, http.StatusNotFound, fmt.Sprintf("no deployment named %q", name))
	case errors.Is(err, gossip.ErrClockOutOfBounds):
		writeError(w, http.StatusServiceUnavailable, err.Error())
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
	default:
		writeJSON(w, http.StatusOK, map[string]string{"removed": name})
	}
}

// handleAdapterAdd is POST /v1/deployments/{name}/adapters, a body
// {"name", "source"}: one LoRA adapter added (or re-sourced), through
// Node.ChangeAdapter.
func (s *apiServer) handleAdapterAdd(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		writeError(w, http.StatusBadRequest, "read body: "+err.Error())
		return
	}
	var a placement.Adapter
	if err := json.Unmarshal(body, &a); err != nil {
		writeError(w, http.StatusBadRequest, `body: want {"name": "sql", "source": "adapters/sql-lora"}: `+err.Error())
		return
	}
	s.adapterAnswer(w, r, func() (status.DeploymentInfo, error) {
		return s.node.ChangeAdapter(r.Context(), r.PathValue("name"), &a, "")
	})
}

// handleAdapterRemove is DELETE /v1/deployments/{name}/adapters/{adapter}.
func (s *apiServer) handleAdapterRemove(w http.ResponseWriter, r *http.Request) {
	s.adapterAnswer(w, r, func() (status.DeploymentInfo, error) {
		return s.node.ChangeAdapter(r.Context(), r.PathValue("name"), nil, r.PathValue("adapter"))
	})
}

func (s *apiServer) adapterAnswer(w http.ResponseWriter, r *http.Request, change func() (status.DeploymentInfo, error)) {
	info, err := change()
	if errors.Is(err, ErrNoDeployment) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no deployment named %q", r.PathValue("name")))
		return
	}
	writePlaced(w, info, err)
}
