package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/bearer"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// apiServer is the node's HTTP API: its routes, the source allowlist and
// the token checks here, one file per resource beside it
// (endpoint_*.go). It reads the node through narrow interfaces and asks
// it for one thing, a change of what the cluster runs.
type apiServer struct {
	node      apiNode
	gossip    apiGossip
	shards    apiShards
	isolation interface{ since() time.Time }
	hops      *hops
	drops     *dropRules
	conf      apiConfig
	clock     clock.Clock
	log       *slog.Logger
	// closed is closed once the node stopped: follow streams end.
	closed <-chan struct{}
	// follows counts the open follow=1 log streams, per caller.
	follows followSlots

	srv *http.Server
	ln  net.Listener
	// serving holds the server's goroutine.
	serving sync.WaitGroup
	// tools are the MCP tools this node serves (SetMCPTools).
	tools toolNames
}

// apiNode is what the API reads and asks of its node (*Node): the read
// model of the last pass, and the one way in to change what the cluster
// runs, with the checks every interface gets.
type apiNode interface {
	Status() *status.Snapshot
	Place(ctx context.Context, d placement.Deployment) (status.DeploymentInfo, error)
	Unplace(name string) error
	ChangeAdapter(ctx context.Context, deployment string, add *placement.Adapter, remove string) (status.DeploymentInfo, error)
}

// apiGossip is what the API reads of this node's gossip state
// (*gossip.Cluster).
type apiGossip interface {
	Local() gossip.NodeRecord
	Address() string
	Stats() gossip.Stats
	LastHeard() time.Time
	Members() []gossip.Member
	Deployments() []gossip.DeploymentRecord
}

// apiShards is what the API reads of the runner: the shards held here
// and, when it is a logPather, their engines' log files.
type apiShards interface {
	Shards() []gossip.ShardRecord
}

// apiConfig is what the API says of the node, fixed at its start.
type apiConfig struct {
	name, token string
	// allowFrom, when non-empty, limits every request to these networks.
	allowFrom []*net.IPNet
	// testHooks serves /v1/test/partition. TEST ONLY.
	testHooks                             bool
	weightsDir, runtime, profile, version string
	leaseTTL                              time.Duration
	started                               time.Time
	// gatewayPD is Config.GatewayPD (nil: no gateway, or none to show).
	gatewayPD func() map[string]map[string]string
}

// maxBody bounds request bodies: a deployment spec is a few KiB.
const maxBody = 1 << 20

// maxHopBody bounds the body of a signed hop: MCP's own limit.
const maxHopBody = 1 << 20

func (s *apiServer) routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /status.json", s.handleStatus)
	mux.HandleFunc("GET /v1/cluster", s.handleCluster)
	mux.HandleFunc("GET /v1/deployments", s.handleDeployments)
	mux.HandleFunc("POST /v1/deployments", s.authorized(s.handlePlace))
	mux.HandleFunc("DELETE /v1/deployments/{name}", s.authorized(s.handleUnplace))
	mux.HandleFunc("POST /v1/deployments/{name}/adapters", s.authorized(s.handleAdapterAdd))
	mux.HandleFunc("DELETE /v1/deployments/{name}/adapters/{adapter}", s.authorized(s.handleAdapterRemove))
	mux.HandleFunc("GET /v1/plan", s.handlePlan)
	mux.HandleFunc("GET /v1/shards", s.handleShards)
	mux.HandleFunc("GET /v1/prometheus/targets", s.handlePrometheusTargets)
	mux.HandleFunc("GET /v1/shards/{shard}/logs", s.handleLogs)
	mux.HandleFunc("GET /v1/weights/headers", s.handleWeightsHeaders)
	if s.conf.testHooks {
		mux.HandleFunc("POST /v1/test/partition", s.authorized(s.handlePartition))
	}
}

// serve serves h, behind the source allowlist, on ln until shutdown.
// Timeouts are set so a slow or stuck client cannot hold a connection
// forever. The listen backlog is Go's default, which is the kernel's
// net.core.somaxconn (4096 on this project's machines), not the 5 some
// frameworks use: bursts of clients are queued, not refused.
func (s *apiServer) serve(ln net.Listener, h http.Handler) {
	s.ln = ln
	s.srv = &http.Server{
		Handler:           s.guard(h),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	s.serving.Go(func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("HTTP API stopped", "err", err)
		}
	})
}

// shutdown stops serving, waiting for requests in flight until ctx ends.
func (s *apiServer) shutdown(ctx context.Context) {
	_ = s.srv.Shutdown(ctx)
	s.serving.Wait()
}

// addr is the address the API listens on.
func (s *apiServer) addr() string { return s.ln.Addr().String() }

// toolNames are the MCP tools a node serves, for /status.json: MCP sets
// them once it registered, after the server started. The zero value is
// ready.
type toolNames struct {
	mu    sync.Mutex
	names []string
}

func (t *toolNames) set(names []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.names = slices.Clone(names)
}

// get is what set recorded, never nil.
func (t *toolNames) get() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string{}, t.names...)
}

// guard applies the source allowlist to every request.
func (s *apiServer) guard(h http.Handler) http.Handler {
	if len(s.conf.allowFrom) == 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		ip := net.ParseIP(host)
		if err != nil || ip == nil || !allowed(s.conf.allowFrom, ip) {
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
// one.
func (s *apiServer) authorized(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.checkToken(w, r) {
			return
		}
		h(w, r)
	}
}

// hasToken reports whether r carries the cluster token, writing nothing:
// for reads that show more to token holders. The comparison takes time
// that shows neither the token nor its length (bearer.Equal).
func (s *apiServer) hasToken(r *http.Request) bool {
	tok, ok := bearer.Token(r.Header.Get("Authorization"))
	return ok && bearer.Equal(tok, s.conf.token)
}

// checkToken writes the error and returns false unless r carries the
// cluster token (MCP reaches it through requireTokenOrHop).
func (s *apiServer) checkToken(w http.ResponseWriter, r *http.Request) bool {
	tok, ok := bearer.Token(r.Header.Get("Authorization"))
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="llmgw"`)
		writeError(w, http.StatusUnauthorized, "this call needs the cluster token: Authorization: Bearer <token> (llmgw clients take it from --token, --token-file, LLMGW_TOKEN or LLMGW_TOKEN_FILE)")
		return false
	}
	if !bearer.Equal(tok, s.conf.token) {
		writeError(w, http.StatusForbidden, "wrong cluster token")
		return false
	}
	return true
}

// requireTokenOrHop wraps h so that it needs the cluster token, or a hop
// signed for MCP by another node holding the same token. A signed
// request's body is read (at most maxHopBody) to check its digest and
// handed on unchanged.
func (s *apiServer) requireTokenOrHop(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(hopHeader) == "" {
			if s.checkToken(w, r) {
				h.ServeHTTP(w, r)
			}
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxHopBody))
		if err != nil {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("a forwarded call's body over %d bytes: %v", maxHopBody, err))
			return
		}
		if _, err := s.hops.verify(r, "mcp", body); err != nil {
			writeError(w, http.StatusForbidden, err.Error())
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
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
