package fakeengine

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// KVTransfer is the engine's part in prefill/decode disaggregation, in
// one of two protocols (see the package doc): vLLM's NixlConnector
// (Connector set, from --kv-transfer-config) or SGLang's bootstrap
// (Mode set, from --disaggregation-mode). The zero KVTransfer is an
// engine that takes no part.
type KVTransfer struct {
	// Connector is vLLM's kv_connector; the fake models "NixlConnector"
	// only. Role is kv_role (kv_both, kv_producer, kv_consumer): every
	// role serves both legs, as NixlConnector does; it is reported, not
	// enforced. LoadFailurePolicy is kv_load_failure_policy, "fail"
	// (vLLM's default, vllm/config/kv_transfer.py KVTransferConfig) or
	// "recompute". EngineID is engine_id (vLLM draws a UUID when it is
	// not given; so does the fake). NoEnforceCompat is
	// kv_connector_extra_config.enforce_handshake_compat=false.
	Connector         string
	Role              string
	LoadFailurePolicy string
	EngineID          string
	NoEnforceCompat   bool
	// SideChannelHost and SideChannelPort are VLLM_NIXL_SIDE_CHANNEL_HOST
	// (default localhost) and VLLM_NIXL_SIDE_CHANNEL_PORT (default
	// 5600): the fake listens there, and names them in its prefill
	// answers. TPSize is the answers' tp_size (--tensor-parallel-size).
	SideChannelHost string
	SideChannelPort int
	TPSize          int
	// AbortRequestTimeout is VLLM_NIXL_ABORT_REQUEST_TIMEOUT (default
	// 480 s): how long a prefill holds a finished request's blocks for a
	// decode to read them.
	AbortRequestTimeout time.Duration

	// Mode is SGLang's --disaggregation-mode, "prefill" or "decode" (""
	// or "null": none), TransferBackend --disaggregation-transfer-backend
	// (mooncake or nixl), BootstrapPort --disaggregation-bootstrap-port
	// (default 8998), which a prefill serves. BootstrapTimeout is
	// SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT (a prefill waiting for its
	// decode), WaitingTimeout SGLANG_DISAGGREGATION_WAITING_TIMEOUT (a
	// decode waiting for the KV); both 300 s by default.
	Mode             string
	TransferBackend  string
	BootstrapPort    int
	BootstrapTimeout time.Duration
	WaitingTimeout   time.Duration

	// Listener, when set, is served as the side channel (vLLM) or the
	// bootstrap port (an SGLang prefill) instead of listening on the
	// address above; its address is the one advertised. The Server
	// closes it (Server.Close).
	Listener net.Listener

	// The fake's own knobs (FAKE_ENGINE_KV_*). TransferPer1KTokens is
	// the transfer's time per thousand prompt tokens, waited by the
	// decode (zero: none; the CLI's default is DefaultKVTransferPer1K).
	// CompatVersion stands for the engine's version in the handshake's
	// compatibility hash: two engines whose values differ refuse each
	// other, as two vLLM releases do. FailTransfers makes this engine's
	// side channel (or bootstrap port) refuse every read.
	TransferPer1KTokens time.Duration
	CompatVersion       string
	FailTransfers       bool
}

// Defaults of the disaggregation knobs, each the real engine's.
const (
	DefaultNixlSideChannelPort     = 5600
	DefaultNixlAbortRequestTimeout = 480 * time.Second
	DefaultSGLangBootstrapPort     = 8998
	DefaultSGLangBootstrapTimeout  = 300 * time.Second
	DefaultSGLangWaitingTimeout    = 300 * time.Second
	// DefaultKVTransferPer1K is the CLI's transfer time per thousand
	// prompt tokens: small beside a prefill.
	DefaultKVTransferPer1K = 5 * time.Millisecond
)

// The fake-only variables of disaggregation, read under every form of
// the command.
const (
	EnvKVTransferPer1KTokens = "FAKE_ENGINE_KV_TRANSFER_PER_1K_TOKENS"
	EnvKVCompatVersion       = "FAKE_ENGINE_KV_COMPAT_VERSION"
	EnvKVTransferFail        = "FAKE_ENGINE_KV_TRANSFER_FAIL"
	// EnvStepInterference (true or 1) turns Config.StepInterference on
	// under a personality, whose real engine has no such flag.
	EnvStepInterference = "FAKE_ENGINE_STEP_INTERFERENCE"
)

// nixl reports whether the engine runs vLLM's NixlConnector.
func (k *KVTransfer) nixl() bool { return k.Connector != "" }

// sglang reports whether the engine is one half of an SGLang pair.
func (k *KVTransfer) sglang() bool { return k.Mode == "prefill" || k.Mode == "decode" }

// active reports whether the engine serves a side channel or takes part.
func (k *KVTransfer) active() bool { return k.nixl() || k.sglang() }

// listens reports whether the engine opens a port of its own: vLLM's side
// channel, or an SGLang prefill's bootstrap port.
func (k *KVTransfer) listens() bool { return k.nixl() || k.Mode == "prefill" }

// listenAddr is where Run opens that port.
func (k *KVTransfer) listenAddr(host string) string {
	if k.nixl() {
		return net.JoinHostPort(k.SideChannelHost, strconv.Itoa(k.SideChannelPort))
	}
	return net.JoinHostPort(host, strconv.Itoa(k.BootstrapPort))
}

// defaults fills the zero knobs and checks the rest.
func (k *KVTransfer) defaults() error {
	if k.Mode == "null" {
		k.Mode = ""
	}
	if k.nixl() && k.Mode != "" {
		return errors.New("fake engine: a kv-transfer-config and a disaggregation mode are two protocols; give one")
	}
	if k.nixl() {
		if k.Connector != "NixlConnector" {
			return fmt.Errorf("fake engine: kv_connector %q: the fake engine models NixlConnector only", k.Connector)
		}
		switch k.Role {
		case "kv_both", "kv_producer", "kv_consumer":
		default:
			//lint:ignore ST1005 vLLM's own words (KVTransferConfig.__post_init__)
			return fmt.Errorf("Unsupported kv_role: %s. Supported roles are ('kv_producer', 'kv_consumer', 'kv_both')", k.Role)
		}
		switch k.LoadFailurePolicy {
		case "":
			k.LoadFailurePolicy = "fail"
		case "fail", "recompute":
		default:
			return fmt.Errorf("fake engine: kv_load_failure_policy %q: want fail or recompute", k.LoadFailurePolicy)
		}
		if k.EngineID == "" {
			k.EngineID = newUUID()
		}
		if k.SideChannelHost == "" {
			k.SideChannelHost = "localhost"
		}
		if k.SideChannelPort == 0 {
			k.SideChannelPort = DefaultNixlSideChannelPort
		}
		if k.AbortRequestTimeout == 0 {
			k.AbortRequestTimeout = DefaultNixlAbortRequestTimeout
		}
		if k.TPSize == 0 {
			k.TPSize = 1
		}
	}
	if k.Mode != "" {
		if !k.sglang() {
			return fmt.Errorf("sglang.launch_server: argument --disaggregation-mode: invalid choice: '%s' (choose from 'null', 'prefill', 'decode')", k.Mode)
		}
		switch k.TransferBackend {
		case "":
			k.TransferBackend = "mooncake"
		case "mooncake", "nixl":
		default:
			return fmt.Errorf("fake engine: --disaggregation-transfer-backend %q: the fake engine models mooncake and nixl", k.TransferBackend)
		}
		if k.BootstrapPort == 0 {
			k.BootstrapPort = DefaultSGLangBootstrapPort
		}
		if k.BootstrapTimeout == 0 {
			k.BootstrapTimeout = DefaultSGLangBootstrapTimeout
		}
		if k.WaitingTimeout == 0 {
			k.WaitingTimeout = DefaultSGLangWaitingTimeout
		}
	}
	if k.TransferPer1KTokens < 0 || k.AbortRequestTimeout < 0 || k.BootstrapTimeout < 0 || k.WaitingTimeout < 0 {
		return errors.New("fake engine: the KV transfer's durations must not be negative")
	}
	return nil
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// vllmKVTransferConfig is vLLM's KVTransferConfig as --kv-transfer-config
// spells it (vllm/config/kv_transfer.py). A field it lacks is refused, as
// vLLM's pydantic dataclass refuses it; the fake reads the first few and
// accepts the rest.
type vllmKVTransferConfig struct {
	KVConnector            string         `json:"kv_connector"`
	EngineID               *string        `json:"engine_id"`
	KVBufferDevice         *string        `json:"kv_buffer_device"`
	KVBufferSize           *float64       `json:"kv_buffer_size"`
	KVRole                 *string        `json:"kv_role"`
	KVRank                 *int           `json:"kv_rank"`
	KVParallelSize         *int           `json:"kv_parallel_size"`
	KVIP                   *string        `json:"kv_ip"`
	KVPort                 *int           `json:"kv_port"`
	KVConnectorExtraConfig map[string]any `json:"kv_connector_extra_config"`
	KVConnectorModulePath  *string        `json:"kv_connector_module_path"`
	EnablePermuteLocalKV   *bool          `json:"enable_permute_local_kv"`
	KVLoadFailurePolicy    string         `json:"kv_load_failure_policy"`
}

// ParseVLLMKVTransferConfig reads --kv-transfer-config's JSON into k.
func ParseVLLMKVTransferConfig(raw string, k *KVTransfer) error {
	var c vllmKVTransferConfig
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return fmt.Errorf("--kv-transfer-config: %v", err)
	}
	k.Connector = c.KVConnector
	if c.KVRole != nil {
		k.Role = *c.KVRole
	}
	if c.EngineID != nil {
		k.EngineID = *c.EngineID
	}
	k.LoadFailurePolicy = c.KVLoadFailurePolicy
	if v, ok := c.KVConnectorExtraConfig["enforce_handshake_compat"]; ok {
		on, isBool := v.(bool)
		if !isBool {
			return errors.New("--kv-transfer-config: kv_connector_extra_config.enforce_handshake_compat: want true or false")
		}
		k.NoEnforceCompat = !on
	}
	return nil
}

// kvTransferParams is the kv_transfer_params of a request or an answer,
// as vLLM's toy proxy and NixlConnector write them
// (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py
// send_request_to_service; NixlConnectorScheduler.request_finished).
type kvTransferParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteBlockIDs  []int   `json:"remote_block_ids"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteRequestID *string `json:"remote_request_id"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	TPSize          *int    `json:"tp_size"`
}

// bootstrap is SGLang's disaggregation fields of a request (mini_lb.py
// adds them to the body sent to both servers).
type bootstrap struct {
	BootstrapHost *string `json:"bootstrap_host"`
	BootstrapPort *int    `json:"bootstrap_port"`
	BootstrapRoom *uint64 `json:"bootstrap_room"`
}

func (b bootstrap) given() bool { return b.BootstrapRoom != nil }

// lease is a finished prefill's blocks, held for a decode to read.
type lease struct {
	tokens  int
	hash    string
	blocks  int
	expires time.Time
}

// kvState is the engine's side of the transfers: the leases a prefill
// holds, the rooms an SGLang prefill meets its decodes in, and the
// connections its port serves.
type kvState struct {
	mu       sync.Mutex
	leases   map[string]*lease
	nextID   int
	rooms    map[uint64]chan net.Conn
	ln       net.Listener
	conns    map[net.Conn]struct{}
	closed   bool
	wg       sync.WaitGroup
	hostPort struct {
		host string
		port int
	}
}

// compatHash is the handshake's compatibility hash: vLLM hashes its
// version, the connector's version, the model, dtype and KV layout
// (compute_nixl_compatibility_hash); the fake hashes what stands for them.
func (s *Server) compatHash() string {
	h := sha256.Sum256([]byte(fmt.Sprintf("%s|%s|%s|block_size=%d", s.cfg.KV.CompatVersion, s.cfg.KV.Connector, s.cfg.Model, s.cfg.BlockSize)))
	return hex.EncodeToString(h[:])
}

// promptHash identifies a prompt's content, so a decode can tell the
// blocks it read are its prompt's.
func promptHash(p prompt) string {
	h := sha256.New()
	h.Write([]byte{p.kind})
	h.Write(p.data)
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// startKV serves the side channel or bootstrap port, if the engine has
// one.
func (s *Server) startKV() {
	k := &s.kv
	k.leases = map[string]*lease{}
	k.rooms = map[uint64]chan net.Conn{}
	k.conns = map[net.Conn]struct{}{}
	ln := s.cfg.KV.Listener
	if ln == nil {
		return
	}
	k.ln = ln
	host, port := s.cfg.KV.SideChannelHost, s.cfg.KV.SideChannelPort
	if a, ok := ln.Addr().(*net.TCPAddr); ok {
		port = a.Port
		if host == "" {
			host = a.IP.String()
		}
	}
	k.hostPort.host, k.hostPort.port = host, port
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			k.mu.Lock()
			if k.closed {
				k.mu.Unlock()
				_ = c.Close()
				return
			}
			k.conns[c] = struct{}{}
			k.wg.Add(1)
			k.mu.Unlock()
			go func() {
				defer k.wg.Done()
				if s.cfg.KV.nixl() {
					s.serveSideChannel(c)
				} else {
					s.serveBootstrap(c)
				}
			}()
		}
	}()
}

// Close closes the side channel or bootstrap port and every connection on
// it, and waits for their handlers. Run calls it; a test that built the
// Server with a KV listener calls it too.
func (s *Server) Close() {
	k := &s.kv
	k.mu.Lock()
	k.closed = true
	if k.ln != nil {
		_ = k.ln.Close()
	}
	for c := range k.conns {
		_ = c.Close()
	}
	k.mu.Unlock()
	k.wg.Wait()
}

// forget drops a connection from the tracked ones and closes it.
func (k *kvState) forget(c net.Conn) {
	k.mu.Lock()
	delete(k.conns, c)
	k.mu.Unlock()
	_ = c.Close()
}

// sideMsg is one line of the fake's side-channel protocol (JSON, one
// object a line): the decode sends {"op":"handshake"}, the prefill
// answers {"engine_id", "compatibility_hash"}; the decode then sends
// {"op":"read", "request_id", "block_ids"} and the prefill answers
// {"ok", "tokens", "hash"} or {"ok": false, "error"}, freeing the blocks
// once read.
type sideMsg struct {
	Op                string `json:"op,omitempty"`
	EngineID          string `json:"engine_id,omitempty"`
	CompatibilityHash string `json:"compatibility_hash,omitempty"`
	RequestID         string `json:"request_id,omitempty"`
	BlockIDs          []int  `json:"block_ids,omitempty"`
	Room              uint64 `json:"room,omitempty"`
	OK                bool   `json:"ok"`
	Tokens            int    `json:"tokens,omitempty"`
	Hash              string `json:"hash,omitempty"`
	Error             string `json:"error,omitempty"`
	// Reason is a failed read's loadFailure reason.
	Reason string `json:"reason,omitempty"`
}

// serveSideChannel is a prefill's end of the NIXL side channel: the
// handshake, then reads of held blocks.
func (s *Server) serveSideChannel(c net.Conn) {
	defer s.kv.forget(c)
	dec, enc := json.NewDecoder(bufio.NewReader(c)), json.NewEncoder(c)
	for {
		var m sideMsg
		if err := dec.Decode(&m); err != nil {
			return
		}
		switch m.Op {
		case "handshake":
			_ = enc.Encode(sideMsg{OK: true, EngineID: s.cfg.KV.EngineID, CompatibilityHash: s.compatHash()})
		case "read":
			_ = enc.Encode(s.readLease(m))
		default:
			_ = enc.Encode(sideMsg{Error: fmt.Sprintf("unknown op %q", m.Op)})
			return
		}
	}
}

// readLease hands a decode the blocks of a finished prefill and frees
// them, as the prefill frees them once the decode's notification says
// they were read.
func (s *Server) readLease(m sideMsg) sideMsg {
	if s.cfg.KV.FailTransfers {
		return sideMsg{Reason: LoadFailTransfer, Error: "NIXL transfer failed (scripted by " + EnvKVTransferFail + ")"}
	}
	s.sweepLeases()
	k := &s.kv
	k.mu.Lock()
	l := k.leases[m.RequestID]
	if l != nil && len(m.BlockIDs) == l.blocks {
		delete(k.leases, m.RequestID)
	}
	k.mu.Unlock()
	if l == nil {
		return sideMsg{Reason: LoadFailMissing, Error: fmt.Sprintf("no blocks held for request %s (never prefilled here, already read, or expired)", m.RequestID)}
	}
	if len(m.BlockIDs) != l.blocks {
		return sideMsg{Reason: LoadFailMismatch, Error: fmt.Sprintf("request %s holds %d blocks, %d asked for", m.RequestID, l.blocks, len(m.BlockIDs))}
	}
	s.sched.freeHeld(l.blocks)
	return sideMsg{OK: true, Tokens: l.tokens, Hash: l.hash}
}

// holdLease keeps a finished prefill's full blocks for a decode to read,
// for AbortRequestTimeout, and returns their ids. A prompt shorter than a
// block has none and holds nothing (NixlConnectorScheduler.request_finished:
// delay_free_blocks only with block ids).
func (s *Server) holdLease(id string, p prompt, n int) []int {
	blocks := n / s.cfg.BlockSize
	ids := make([]int, 0, blocks)
	if blocks == 0 {
		return ids
	}
	s.sweepLeases()
	k := &s.kv
	k.mu.Lock()
	for range blocks {
		ids = append(ids, k.nextID)
		k.nextID++
	}
	if old := k.leases[id]; old != nil {
		s.sched.freeHeld(old.blocks)
	}
	k.leases[id] = &lease{tokens: n, hash: promptHash(p), blocks: blocks, expires: s.now().Add(s.cfg.KV.AbortRequestTimeout)}
	k.mu.Unlock()
	s.sched.hold(blocks)
	return ids
}

// sweepLeases frees the blocks whose lease has run out, counting each
// request in vllm:nixl_num_kv_expired_reqs.
func (s *Server) sweepLeases() {
	k := &s.kv
	now := s.now()
	k.mu.Lock()
	var freed int
	for id, l := range k.leases {
		if !now.Before(l.expires) {
			delete(k.leases, id)
			freed += l.blocks
			s.m.kvExpired.Inc()
			s.logf("NIXL: releasing the blocks of request %s: no decode read them within %s", id, s.cfg.KV.AbortRequestTimeout)
		}
	}
	k.mu.Unlock()
	if freed > 0 {
		s.sched.freeHeld(freed)
	}
}

// HeldKVRequests is how many finished prefills hold blocks for a decode.
func (s *Server) HeldKVRequests() int {
	s.sweepLeases()
	s.kv.mu.Lock()
	defer s.kv.mu.Unlock()
	return len(s.kv.leases)
}

// loadFailure is why a decode could not load the KV it was sent to; its
// reason labels fakeengine_kv_load_failures_total.
type loadFailure struct {
	reason string
	msg    string
}

func (f *loadFailure) Error() string { return f.msg }

// The reasons of fakeengine_kv_load_failures_total.
const (
	LoadFailConnect   = "connect"   // the side channel or bootstrap port did not answer
	LoadFailHandshake = "handshake" // the compatibility hash (or engine id) differs
	LoadFailMissing   = "missing"   // the blocks are not held (never, read, expired)
	LoadFailTransfer  = "transfer"  // the transfer itself failed
	LoadFailMismatch  = "mismatch"  // the blocks are another prompt's
	LoadFailTimeout   = "timeout"   // SGLang: no KV within the waiting timeout
)

// nixlLoad is a decode reading a prefill's blocks over its side channel:
// the handshake (refused on another compatibility hash, as
// NixlConnectorWorker._nixl_handshake raises), then the read, then the
// transfer's time. It returns the tokens loaded.
func (s *Server) nixlLoad(ctx context.Context, p *kvTransferParams, pr prompt, n int) (int, *loadFailure) {
	if p.RemoteHost == nil || p.RemotePort == nil || p.RemoteEngineID == nil || p.RemoteRequestID == nil {
		return 0, &loadFailure{LoadFailMissing, "kv_transfer_params: do_remote_prefill without remote_host, remote_port, remote_engine_id and remote_request_id"}
	}
	addr := net.JoinHostPort(*p.RemoteHost, strconv.Itoa(*p.RemotePort))
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return 0, &loadFailure{LoadFailConnect, fmt.Sprintf("NIXL handshake with %s failed: %v", addr, err)}
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	dec, enc := json.NewDecoder(bufio.NewReader(c)), json.NewEncoder(c)
	var hs sideMsg
	if err := enc.Encode(sideMsg{Op: "handshake"}); err != nil {
		return 0, &loadFailure{LoadFailConnect, fmt.Sprintf("NIXL handshake with %s failed: %v", addr, err)}
	}
	if err := dec.Decode(&hs); err != nil {
		return 0, &loadFailure{LoadFailConnect, fmt.Sprintf("NIXL handshake with %s failed: %v", addr, err)}
	}
	if local := s.compatHash(); !s.cfg.KV.NoEnforceCompat && hs.CompatibilityHash != local {
		// vLLM's words (NixlConnectorWorker._nixl_handshake).
		return 0, &loadFailure{LoadFailHandshake, fmt.Sprintf("NIXL compatibility hash mismatch. Local: %s, Remote: %s. "+
			"Prefill and decode instances have incompatible configurations. This may be due to: different vLLM versions, "+
			"models, dtypes, KV cache layouts, attention backends, etc. Both instances must use identical configurations."+
			`Disable this check using --kv-transfer-config '{"kv_connector_extra_config": {"enforce_handshake_compat": false}}'`, local, hs.CompatibilityHash)}
	}
	if hs.EngineID != *p.RemoteEngineID {
		return 0, &loadFailure{LoadFailHandshake, fmt.Sprintf("Remote NIXL agent engine ID mismatch. Expected %s, received %s.", *p.RemoteEngineID, hs.EngineID)}
	}
	var got sideMsg
	if err := enc.Encode(sideMsg{Op: "read", RequestID: *p.RemoteRequestID, BlockIDs: p.RemoteBlockIDs}); err != nil {
		return 0, &loadFailure{LoadFailTransfer, fmt.Sprintf("NIXL transfer from %s failed: %v", addr, err)}
	}
	if err := dec.Decode(&got); err != nil {
		return 0, &loadFailure{LoadFailTransfer, fmt.Sprintf("NIXL transfer from %s failed: %v", addr, err)}
	}
	if !got.OK {
		return 0, &loadFailure{cmp.Or(got.Reason, LoadFailTransfer), fmt.Sprintf("NIXL transfer of request %s from %s failed: %s", *p.RemoteRequestID, addr, got.Error)}
	}
	if got.Hash != promptHash(pr) || got.Tokens != n {
		return 0, &loadFailure{LoadFailMismatch, fmt.Sprintf("the blocks of request %s are another prompt's (%d tokens held, %d here)", *p.RemoteRequestID, got.Tokens, n)}
	}
	if !s.sleep(ctx, s.transferTime(n)) {
		return 0, &loadFailure{LoadFailTransfer, "client left during the transfer"}
	}
	return n, nil
}

// transferTime is the KV transfer's time for a prompt of n tokens.
func (s *Server) transferTime(n int) time.Duration {
	return time.Duration(int64(s.cfg.KV.TransferPer1KTokens) * int64(n) / 1000)
}

// requestID is the answer's id: vLLM's "chatcmpl-" or "cmpl-" and the
// X-Request-Id header when given (OpenAIServing._base_request_id), so
// that both legs of a disaggregated request, which carry the same header,
// are named alike; the fake's counter otherwise.
func (s *Server) requestID(prefix string, r *http.Request) string {
	if h := r.Header.Get("X-Request-Id"); h != "" {
		return prefix + "-" + h
	}
	return s.id(prefix)
}

// computePrompt gives a running request its prompt's KV: computed here
// (the prefill time), or loaded from the prefill engine its
// kv_transfer_params or bootstrap room names (the transfer's time, no
// prefill). ok false with no message means the client left; a message
// means the request fails with it (500).
func (s *Server) computePrompt(ctx context.Context, ex exchange, n int, start time.Time) (ok bool, fail string) {
	k := &s.cfg.KV
	d := ex.disagg
	loaded := func() bool {
		s.m.prompt.Add(float64(n))
		s.m.bySource.WithLabelValues(SourceExternalKV).Add(float64(n))
		s.m.kvTransfers.Inc()
		if s.cache != nil {
			s.cache.insert(ex.prompt.blockHashes(s.cfg.BlockSize))
		}
		return true
	}
	switch {
	case k.nixl() && d.KVTransferParams != nil && d.KVTransferParams.DoRemotePrefill:
		if len(d.KVTransferParams.RemoteBlockIDs) == 0 {
			// A prompt shorter than a block: the prefill sent nothing,
			// and the decode computes it.
			return s.prefill(ctx, ex.prompt, n), ""
		}
		_, lf := s.nixlLoad(ctx, d.KVTransferParams, ex.prompt, n)
		if lf == nil {
			return loaded(), ""
		}
		if ctx.Err() != nil {
			return false, ""
		}
		s.m.nixlFailed.Inc()
		s.m.kvLoadFailures.WithLabelValues(lf.reason).Inc()
		s.logf("NIXL: KV load failed (policy %s): %s", k.LoadFailurePolicy, lf.msg)
		if k.LoadFailurePolicy == "fail" {
			return false, "Internal server error"
		}
		s.m.kvRecomputed.WithLabelValues(RecomputeLoadFailure).Inc()
		return s.prefill(ctx, ex.prompt, n), ""
	case k.nixl() && d.KVTransferParams != nil && d.KVTransferParams.DoRemoteDecode:
		s.m.kvPrefill.Inc()
		return s.prefill(ctx, ex.prompt, n), ""
	case k.Mode == "decode" && d.given():
		if lf := s.sglangLoadKV(ctx, d.bootstrap, ex.prompt, n); lf != nil {
			if ctx.Err() != nil {
				return false, ""
			}
			s.m.kvLoadFailures.WithLabelValues(lf.reason).Inc()
			s.logf("SGLang decode: %s", lf.msg)
			return false, lf.msg
		}
		return loaded(), ""
	case k.Mode == "prefill" && d.given():
		s.m.kvPrefill.Inc()
		if !s.prefill(ctx, ex.prompt, n) {
			return false, ""
		}
		if lf := s.sglangHandOff(ctx, *d.BootstrapRoom, ex.prompt, n, start); lf != nil {
			if ctx.Err() != nil {
				return false, ""
			}
			s.m.kvLoadFailures.WithLabelValues(lf.reason).Inc()
			s.logf("SGLang prefill: %s", lf.msg)
			return false, lf.msg
		}
		return true, ""
	case k.nixl() && d.KVTransferParams == nil, k.Mode == "decode":
		// Served whole: not disaggregated, and the metrics say so.
		s.m.kvRecomputed.WithLabelValues(RecomputeNoParams).Inc()
	}
	return s.prefill(ctx, ex.prompt, n), ""
}

// prefillParams is a vLLM answer's kv_transfer_params: for a prefill leg
// (do_remote_decode) that finished length-capped, the params its decode
// needs, its blocks held for it; nil otherwise, as
// NixlConnectorScheduler.request_finished returns them.
func (s *Server) prefillParams(id string, ex exchange, n int, finish string) any {
	p := ex.disagg.KVTransferParams
	if p == nil || !p.DoRemoteDecode || p.DoRemotePrefill || finish != "length" {
		return nil
	}
	return map[string]any{
		"do_remote_prefill": true,
		"do_remote_decode":  false,
		"remote_block_ids":  s.holdLease(id, ex.prompt, n),
		"remote_engine_id":  s.cfg.KV.EngineID,
		"remote_request_id": id,
		"remote_host":       s.kv.hostPort.host,
		"remote_port":       s.kv.hostPort.port,
		"tp_size":           s.cfg.KV.TPSize,
	}
}
