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
	"slices"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
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

// hasToken reports whether r carries the cluster token, writing nothing:
// for reads that show more to token holders.
func (n *Node) hasToken(r *http.Request) bool {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && n.cfg.Token != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(n.cfg.Token)) == 1
}

// CheckToken writes the error and returns false unless r carries the
// cluster token. Other packages' handlers (MCP) use it too.
func (n *Node) checkToken(w http.ResponseWriter, r *http.Request) bool {
	auth := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(auth, "Bearer ")
	if auth == "" || !ok {
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

// RequireToken wraps h so that it needs the cluster token.
func (n *Node) RequireToken(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.checkToken(w, r) {
			h.ServeHTTP(w, r)
		}
	})
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

// MemberInfo is one node in /v1/cluster.
type MemberInfo struct {
	Name         string               `json:"name"`
	State        gossip.MemberState   `json:"state"`
	Gossip       string               `json:"gossip"`
	API          string               `json:"api"`
	Labels       map[string]string    `json:"labels,omitempty"`
	GPUs         []placement.GPU      `json:"gpus"`
	Shards       []gossip.ShardRecord `json:"shards,omitempty"`
	Version      gossip.Version       `json:"version"`
	LastChange   time.Time            `json:"last_change,omitzero"`
	SeenAt       time.Time            `json:"seen_at,omitzero"`
	StartedAt    time.Time            `json:"started_at,omitzero"`
	AgentVersion string               `json:"agent_version,omitempty"`
	Runtime      string               `json:"runtime,omitempty"`
	Probes       gossip.ProbeSummary  `json:"probes,omitzero"`
}

// ClusterInfo is the body of /v1/cluster.
type ClusterInfo struct {
	Self    string       `json:"self"`
	Members []MemberInfo `json:"members"`
}

// Members describes every member this node knows.
func (n *Node) Members() []MemberInfo {
	var out []MemberInfo
	for _, m := range n.cluster.Members() {
		mi := MemberInfo{Name: m.Name, State: m.State, Gossip: m.Address, LastChange: m.Since, SeenAt: m.SeenAt}
		if r := m.Record; r != nil {
			mi.API, mi.Labels, mi.GPUs, mi.Shards = r.API, r.Labels, r.GPUs, r.Shards
			mi.Version, mi.StartedAt, mi.AgentVersion, mi.Runtime, mi.Probes = r.Version, r.StartedAt, r.AgentVersion, r.Runtime, r.Probes
			if mi.Gossip == "" {
				mi.Gossip = r.Gossip
			}
		}
		if mi.GPUs == nil {
			mi.GPUs = []placement.GPU{}
		}
		out = append(out, mi)
	}
	return out
}

func (n *Node) handleCluster(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, ClusterInfo{Self: n.cfg.Name, Members: n.Members()})
}

func (n *Node) handleStatus(w http.ResponseWriter, r *http.Request) {
	rec := n.cluster.Local()
	plan, _ := n.Plan()
	writeJSON(w, http.StatusOK, map[string]any{
		"name":          n.cfg.Name,
		"api":           n.APIAddr(),
		"gossip":        n.cluster.Address(),
		"profile":       n.cfg.Profile.Name,
		"version":       n.cfg.Version,
		"started_at":    n.started,
		"record":        rec,
		"gossip_stats":  n.cluster.Stats(),
		"assigned_here": plan.ForNode(n.cfg.Name),
		"lease_ttl":     n.cfg.LeaseTTL.String(),
	})
}

// DeploymentInfo is one deployment in /v1/deployments.
type DeploymentInfo struct {
	placement.Deployment
	SpecVersion string       `json:"spec_version"`
	Stamp       gossip.Stamp `json:"stamp"`
	Placed      int          `json:"placed"`
	Ready       int          `json:"ready"`
	Nodes       []string     `json:"nodes"`
	Why         []string     `json:"why,omitempty"`
}

// Deployments lists live deployments with how much of each is placed.
func (n *Node) Deployments() []DeploymentInfo {
	plan, view := n.Plan()
	lease := leases(view)
	members := n.cluster.Members()
	var out []DeploymentInfo
	for _, rec := range n.cluster.Deployments() {
		if rec.Deleted || rec.Spec == nil {
			continue
		}
		d := rec.Spec.WithDefaults()
		info := DeploymentInfo{Deployment: d, SpecVersion: d.SpecVersion(), Stamp: rec.Stamp, Nodes: []string{}}
		replicas := map[string]bool{}
		serving := map[string]map[string]bool{} // replica → shards with a valid lease
		nodes := map[string]bool{}
		planned := map[string]bool{} // heldKey of every current-version assignment
		for _, a := range plan.Assignments {
			if a.Deployment != d.Name || a.SpecVersion != info.SpecVersion {
				continue
			}
			k := heldKey(a.Node, a.ShardID, a.SpecVersion)
			planned[k] = true
			// Draining shards (replicas scaled away, a copy on a faulted
			// GPU) are not what was asked for, so they are not "placed";
			// but a copy on a faulted GPU still serves its replica.
			if !a.Draining {
				replicas[a.ReplicaID] = true
				nodes[a.Node] = true
			}
			if lease[k] == placement.LeaseValid {
				if serving[a.ReplicaID] == nil {
					serving[a.ReplicaID] = map[string]bool{}
				}
				serving[a.ReplicaID][a.ShardID] = true
			}
		}
		for r, shards := range serving {
			if replicas[r] && len(shards) == d.PipelineParallel {
				info.Ready++
			}
		}
		info.Placed = len(replicas)
		for node := range nodes {
			info.Nodes = append(info.Nodes, node)
		}
		sort.Strings(info.Nodes)
		for _, u := range plan.Unplaced {
			if u.Deployment == d.Name {
				info.Why = append(info.Why, u.ShardID+": "+u.Reason)
			}
		}
		// Placed but failing to start (a missing image or engine binary):
		// the holder says why in its record. Only holders the plan still
		// counts on: a dead node's last record, or an old version's, would
		// keep an error that no longer holds.
		for _, m := range members {
			if m.Record == nil {
				continue
			}
			for _, s := range m.Record.Shards {
				if s.Deployment == d.Name && s.Error != "" && planned[heldKey(m.Name, s.ShardID, s.SpecVersion)] {
					info.Why = append(info.Why, fmt.Sprintf("%s on %s: start failed: %s", s.ShardID, m.Name, s.Error))
				}
			}
		}
		out = append(out, info)
	}
	return out
}

// leases indexes every held shard's lease in a view by heldKey, so a
// listing of all shards costs one pass over the view, not one per shard.
func leases(v placement.View) map[string]placement.LeaseState {
	out := map[string]placement.LeaseState{}
	for _, nd := range v.Nodes {
		for _, s := range nd.Shards {
			out[heldKey(nd.Name, s.ShardID, s.SpecVersion)] = s.Lease
		}
	}
	return out
}

func heldKey(node, shard, spec string) string { return node + "/" + shard + "@" + spec }

func (n *Node) handleDeployments(w http.ResponseWriter, r *http.Request) {
	out := n.Deployments()
	if out == nil {
		out = []DeploymentInfo{}
	}
	// Reading needs no token, but env is where hub and registry secrets
	// go, and args may carry an API key: without the token they are
	// shown redacted.
	if !n.hasToken(r) {
		for i := range out {
			out[i].Deployment = redactSpec(out[i].Deployment)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// redacted replaces a secret-bearing value in what callers without the
// token see.
const redacted = "(redacted: send the cluster token to see it)"

// redactSpec returns d with env values and the values of key-like
// arguments (--api-key X, --hf-token=X, ...) redacted.
func redactSpec(d placement.Deployment) placement.Deployment {
	if len(d.Env) > 0 {
		env := make(map[string]string, len(d.Env))
		for k := range d.Env {
			env[k] = redacted
		}
		d.Env = env
	}
	if len(d.Args) > 0 {
		args := slices.Clone(d.Args)
		for i := 0; i < len(args); i++ {
			name, _, hasValue := strings.Cut(args[i], "=")
			if !secretFlag(name) {
				continue
			}
			if hasValue {
				args[i] = name + "=" + redacted
			} else if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				args[i+1] = redacted
				i++
			}
		}
		d.Args = args
	}
	return d
}

// secretFlag reports whether an engine flag's value is likely a secret.
func secretFlag(name string) bool {
	if !strings.HasPrefix(name, "-") {
		return false
	}
	n := strings.ToLower(name)
	for _, w := range []string{"key", "token", "secret", "password", "passwd", "credential"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// DecodeSpec reads a deployment from JSON or YAML.
func DecodeSpec(body []byte, contentType string) (placement.Deployment, error) {
	js := body
	trimmed := strings.TrimSpace(string(body))
	if !strings.HasPrefix(trimmed, "{") || strings.Contains(contentType, "yaml") {
		// The YAML reader takes the first document only: the rest of a
		// multi-document body would vanish without a word.
		if yamlDocuments(body) > 1 {
			return placement.Deployment{}, fmt.Errorf("%w: the body holds several YAML documents; send one deployment per request", placement.ErrInvalidDeployment)
		}
		var err error
		// Strict: a key given twice is an error, not "the last one wins".
		if js, err = yaml.YAMLToJSONStrict(body); err != nil {
			return placement.Deployment{}, fmt.Errorf("%w: spec is neither JSON nor valid YAML: %w", placement.ErrInvalidDeployment, err)
		}
	}
	return placement.DecodeDeployment(js)
}

// yamlDocuments counts the YAML documents in body that hold anything: a
// "---" at the start of a line separates documents (inside a block scalar
// it would be indented), and comments or blank lines alone are no document.
func yamlDocuments(body []byte) int {
	docs, content := 0, false
	for _, line := range strings.Split(string(body), "\n") {
		t := strings.TrimRight(line, " \t\r")
		if t == "---" || strings.HasPrefix(t, "--- ") || t == "..." {
			if content {
				docs++
			}
			content = false
			continue
		}
		if s := strings.TrimSpace(t); s != "" && !strings.HasPrefix(s, "#") {
			content = true
		}
	}
	if content {
		docs++
	}
	return docs
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
	spec, err := DecodeSpec(body, r.Header.Get("Content-Type"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	rec, err := n.cluster.PutDeployment(spec)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	n.log.Info("deployment placed", "name", spec.Name, "model", spec.Model, "replicas", spec.Replicas, "spec_version", spec.SpecVersion())
	info := DeploymentInfo{Deployment: spec, SpecVersion: spec.SpecVersion(), Stamp: rec.Stamp, Nodes: []string{}}
	// Placing a spec that already runs (same version: only replicas or
	// nothing changed) answers with what runs, not with zeros.
	for _, d := range n.Deployments() {
		if d.Name == spec.Name && d.SpecVersion == info.SpecVersion {
			info.Placed, info.Ready, info.Nodes = min(d.Placed, spec.Replicas), min(d.Ready, spec.Replicas), d.Nodes
		}
	}
	writeJSON(w, http.StatusOK, info)
}

func (n *Node) handleUnplace(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	_, ok, err := n.cluster.DeleteDeployment(name)
	switch {
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
	case !ok:
		writeError(w, http.StatusNotFound, fmt.Sprintf("no deployment named %q", name))
	default:
		n.log.Info("deployment removed", "name", name)
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
	n.mu.Lock()
	p := PlanInfo{Node: n.cfg.Name, ComputedAt: n.planAt, Plan: n.plan, Deployments: specVersions(n.view.Deployments)}
	n.mu.Unlock()
	var known []placement.Deployment
	for _, rec := range n.cluster.Deployments() {
		if !rec.Deleted && rec.Spec != nil {
			known = append(known, *rec.Spec)
		}
	}
	p.Current = maps.Equal(p.Deployments, specVersions(known))
	if p.Plan.Assignments == nil {
		p.Plan.Assignments = []placement.Assignment{}
	}
	if p.Plan.Unplaced == nil {
		p.Plan.Unplaced = []placement.Unplaced{}
	}
	writeJSON(w, http.StatusOK, p)
}

// specVersions maps each deployment's name to its spec version.
func specVersions(ds []placement.Deployment) map[string]string {
	out := make(map[string]string, len(ds))
	for _, d := range ds {
		out[d.Name] = d.WithDefaults().SpecVersion()
	}
	return out
}

// ShardInfo is one row of /v1/shards.
type ShardInfo struct {
	ShardID     string               `json:"shard_id"`
	ReplicaID   string               `json:"replica_id"`
	Deployment  string               `json:"deployment"`
	SpecVersion string               `json:"spec_version"`
	Node        string               `json:"node,omitempty"`
	GPUs        []int                `json:"gpus"`
	Lease       placement.LeaseState `json:"lease"`
	Status      gossip.ShardStatus   `json:"status"`
	Draining    bool                 `json:"draining,omitempty"`
	URL         string               `json:"url,omitempty"`
	PID         int                  `json:"pid,omitempty"`
	Container   string               `json:"container,omitempty"`
	Restarts    int                  `json:"restarts"`
	LastExit    *int                 `json:"last_exit,omitempty"`
	StartedAt   time.Time            `json:"started_at,omitzero"`
	Load        gossip.ShardLoad     `json:"load,omitzero"`
	Reason      string               `json:"reason,omitempty"`
}

// Shards lists every shard: planned, held, or unplaced.
func (n *Node) Shards() []ShardInfo {
	plan, view := n.Plan()
	lease := leases(view)
	type heldShard struct {
		node string
		rec  gossip.ShardRecord
	}
	held := map[string]heldShard{}
	for _, m := range n.cluster.Members() {
		if m.Record == nil {
			continue
		}
		for _, s := range m.Record.Shards {
			held[heldKey(m.Name, s.ShardID, s.SpecVersion)] = heldShard{m.Name, s}
		}
	}
	var out []ShardInfo
	for _, a := range plan.Assignments {
		k := heldKey(a.Node, a.ShardID, a.SpecVersion)
		si := ShardInfo{ShardID: a.ShardID, ReplicaID: a.ReplicaID, Deployment: a.Deployment, SpecVersion: a.SpecVersion,
			Node: a.Node, GPUs: a.GPUs, Draining: a.Draining, Status: gossip.ShardPending, Lease: lease[k]}
		if h, ok := held[k]; ok {
			fillHeld(&si, h.rec)
			delete(held, k)
		}
		out = append(out, si)
	}
	// What is left is held but not planned.
	for k, h := range held {
		s := h.rec
		si := ShardInfo{ShardID: s.ShardID, ReplicaID: s.ReplicaID, Deployment: s.Deployment, SpecVersion: s.SpecVersion,
			Node: h.node, GPUs: s.GPUs, Lease: lease[k], Reason: "not in the plan: its node stops it"}
		if si.Lease == placement.LeaseLapsed {
			si.Reason = "lease lapsed (holder dead, restarted or not renewing); not routable"
		}
		fillHeld(&si, s)
		out = append(out, si)
	}
	for _, u := range plan.Unplaced {
		out = append(out, ShardInfo{ShardID: u.ShardID, ReplicaID: u.ReplicaID, Deployment: u.Deployment, GPUs: []int{}, Status: gossip.ShardUnplaced, Lease: placement.LeaseLapsed, Reason: u.Reason})
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].ShardID != out[j].ShardID {
			return out[i].ShardID < out[j].ShardID
		}
		if out[i].Node != out[j].Node {
			return out[i].Node < out[j].Node
		}
		return out[i].SpecVersion < out[j].SpecVersion
	})
	return out
}

// fillHeld copies what the holder reports; si.Lease is already judged.
func fillHeld(si *ShardInfo, s gossip.ShardRecord) {
	si.Status, si.URL, si.PID, si.Container = s.Status, s.URL, s.PID, s.Container
	si.Restarts, si.LastExit, si.StartedAt = s.Restarts, s.LastExit, s.StartedAt
	// Load only from a holder with a valid lease: a dead node's last
	// record still carries its last reading, which every consumer (MCP
	// load, the page, llmgw top) would otherwise add to its replacement's.
	if si.Lease == placement.LeaseValid {
		si.Load = s.Load
	}
	if s.Error != "" && si.Reason == "" {
		si.Reason = "start failed: " + s.Error
	}
}

func (n *Node) handleShards(w http.ResponseWriter, r *http.Request) {
	out := n.Shards()
	if out == nil {
		out = []ShardInfo{}
	}
	writeJSON(w, http.StatusOK, out)
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
