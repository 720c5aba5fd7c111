package supervisor

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/spec"
	"github.com/llmgw/llmgw/supervisor/status"
)

// maxBody bounds request bodies: a deployment spec is a few KiB.
const maxBody = 1 << 20

// newHTTPServer sets timeouts so a slow or stuck client cannot hold a
// connection forever. The listen backlog is Go's default, which is the
// kernel's net.core.somaxconn (4096 on this project's machines), not the 5 some
// frameworks use: bursts of clients are queued, not refused.
func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
}

func (n *Node) routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /status.json", n.handleStatus)
	mux.HandleFunc("GET /v1/cluster", n.handleCluster)
	mux.HandleFunc("GET /v1/deployments", n.handleDeployments)
	mux.HandleFunc("POST /v1/deployments", n.authorized(n.handlePlace))
	mux.HandleFunc("DELETE /v1/deployments/{name}", n.authorized(n.handleUnplace))
	mux.HandleFunc("GET /v1/plan", n.handlePlan)
	mux.HandleFunc("GET /v1/shards", n.handleShards)
	mux.HandleFunc("GET /v1/shards/{shard}/logs", n.handleLogs)
	mux.HandleFunc("GET /v1/weights/headers", n.handleWeightsHeaders)
	if n.cfg.TestHooks {
		mux.HandleFunc("POST /v1/test/partition", n.authorized(n.handlePartition))
	}
}

// guard applies the source allowlist to every request.
func (n *Node) guard(h http.Handler) http.Handler {
	if len(n.cfg.AllowFrom) == 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		ip := net.ParseIP(host)
		if err != nil || ip == nil || !allowed(n.cfg.AllowFrom, ip) {
			writeError(w, http.StatusForbidden, fmt.Sprintf("source %s is not in --allow-from", host))
			return
		}
		h.ServeHTTP(w, r)
	})
}

func allowed(nets []*net.IPNet, ip net.IP) bool {
	for _, c := range nets {
		if c.Contains(ip) {
			return true
		}
	}
	return false
}

// authorized requires the cluster token: 401 without one, 403 for a wrong
// one. The comparison takes constant time.
func (n *Node) authorized(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !n.checkToken(w, r) {
			return
		}
		h(w, r)
	}
}

// bearerToken is the credentials of an "Authorization: Bearer <token>"
// header. The scheme is case-insensitive (RFC 9110 section 11.1), so
// "bearer" and "BEARER" are the same scheme; one or more spaces may follow
// it. This is the one place the header is parsed.
func bearerToken(header string) (string, bool) {
	scheme, tok, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimLeft(tok, " ")
	return tok, tok != ""
}

// hasToken reports whether r carries the cluster token, writing nothing:
// for reads that show more to token holders.
func (n *Node) hasToken(r *http.Request) bool {
	tok, ok := bearerToken(r.Header.Get("Authorization"))
	return ok && n.cfg.Token != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(n.cfg.Token)) == 1
}

// checkToken writes the error and returns false unless r carries the
// cluster token (MCP reaches it through RequireTokenOrHop).
func (n *Node) checkToken(w http.ResponseWriter, r *http.Request) bool {
	tok, ok := bearerToken(r.Header.Get("Authorization"))
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="llmgw"`)
		writeError(w, http.StatusUnauthorized, "this call needs the cluster token: Authorization: Bearer <token> (llmgw clients take it from --token, --token-file, LLMGW_TOKEN or LLMGW_TOKEN_FILE)")
		return false
	}
	if n.cfg.Token == "" || subtle.ConstantTimeCompare([]byte(tok), []byte(n.cfg.Token)) != 1 {
		writeError(w, http.StatusForbidden, "wrong cluster token")
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

func (n *Node) handleCluster(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, status.ClusterInfo{Self: n.cfg.Name, Members: n.Status().Members()})
}

func (n *Node) handleStatus(w http.ResponseWriter, r *http.Request) {
	rec := n.cluster.Local()
	plan := n.Plan()
	body := map[string]any{
		"name":          n.cfg.Name,
		"api":           n.APIAddr(),
		"gossip":        n.cluster.Address(),
		"profile":       n.cfg.Profile.Name,
		"version":       n.cfg.Version,
		"started_at":    n.started,
		"uptime_s":      n.clock.Now().Sub(n.started).Round(100 * time.Millisecond).Seconds(),
		"tools":         n.mcpTools(),
		"record":        rec,
		"gossip_stats":  n.cluster.Stats(),
		"assigned_here": plan.ForNode(n.cfg.Name),
		"lease_ttl":     n.cfg.LeaseTTL.String(),
		"isolated":      false,
	}
	// Isolated: this node hears no peer although it expects some (see
	// isolation.go); last_heard is when it last heard one.
	if since := n.Isolated(); !since.IsZero() {
		body["isolated"], body["isolated_since"] = true, since
	}
	if heard := n.cluster.LastHeard(); !heard.IsZero() {
		body["last_heard"] = heard
	}
	writeJSON(w, http.StatusOK, body)
}

func (n *Node) handleDeployments(w http.ResponseWriter, r *http.Request) {
	out := n.Status().Deployments(n.clock.Now())
	// Reading needs no token, but env is where hub and registry secrets
	// go, and args may carry an API key: without the token they are
	// shown redacted.
	if !n.hasToken(r) {
		for i := range out {
			out[i].Deployment = spec.Redact(out[i].Deployment)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (n *Node) handlePlace(w http.ResponseWriter, r *http.Request) {
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
	info, err := n.Place(d)
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

func (n *Node) handleUnplace(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	err := n.Unplace(name)
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

func (n *Node) handlePlan(w http.ResponseWriter, r *http.Request) {
	snap := n.Status()
	p := PlanInfo{Node: n.cfg.Name, ComputedAt: snap.BuiltAt(), Plan: snap.Plan(), Deployments: snap.PlannedFrom()}
	var known []placement.Deployment
	for _, rec := range n.cluster.Deployments() {
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

func (n *Node) handleShards(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, n.Status().Shards(n.clock.Now()))
}

// handlePartition sets the test-only drop rules: {"drop": ["n3","n4"]}.
func (n *Node) handlePartition(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Drop []string `json:"drop"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "want {\"drop\": [node names]}: "+err.Error())
		return
	}
	n.mu.Lock()
	n.dropped = map[string]bool{}
	for _, d := range req.Drop {
		n.dropped[d] = true
	}
	n.mu.Unlock()
	n.log.Warn("TEST HOOK: dropping gossip to and from nodes", "nodes", req.Drop)
	writeJSON(w, http.StatusOK, map[string]any{"drop": req.Drop})
}
