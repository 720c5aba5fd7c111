package fakeengine

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"time"
)

// SGLang's pair meets as its KV managers do (python/sglang/srt/
// disaggregation/mooncake/conn.py and common/conn.py): the proxy sends the
// same body, with bootstrap_host, bootstrap_port and bootstrap_room, to
// both servers at once; the decode's KVReceiver registers with the
// prefill's bootstrap port for that room, the prefill's KVSender waits for
// it (KVPoll.Bootstrapping) up to SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT,
// runs its prefill and sends the KV, and the decode, which waits up to
// SGLANG_DISAGGREGATION_WAITING_TIMEOUT, decodes from it. The fake's
// bootstrap port speaks the side channel's JSON lines: the decode sends
// {"room", "tokens", "hash"}, the prefill answers, once its prefill is
// done, {"ok": true, "tokens", "hash"} or {"ok": false, "error"}.

// serveBootstrap takes a decode's registration for a room and hands its
// connection to the prefill request of that room (which answers on it and
// closes it), whichever arrives first.
func (s *Server) serveBootstrap(c net.Conn) {
	var m sideMsg
	if err := json.NewDecoder(bufio.NewReader(c)).Decode(&m); err != nil {
		s.kv.forget(c)
		return
	}
	if s.cfg.KV.FailTransfers {
		_ = json.NewEncoder(c).Encode(sideMsg{Reason: LoadFailTransfer, Error: "KV transfer failed (scripted by " + EnvKVTransferFail + ")"})
		s.kv.forget(c)
		return
	}
	ch := s.room(m.Room)
	select {
	case ch <- c:
		// The prefill request of the room owns it now.
	default:
		_ = json.NewEncoder(c).Encode(sideMsg{Reason: LoadFailTransfer, Error: fmt.Sprintf("bootstrap_room %d already has a decode", m.Room)})
		s.kv.forget(c)
	}
}

// room is the meeting point of a bootstrap room.
func (s *Server) room(id uint64) chan net.Conn {
	s.kv.mu.Lock()
	defer s.kv.mu.Unlock()
	ch := s.kv.rooms[id]
	if ch == nil {
		ch = make(chan net.Conn, 1)
		s.kv.rooms[id] = ch
	}
	return ch
}

// waitFor waits for ch until d passes on the engine's clock (Config.Sleep);
// false means it passed, or ctx ended, first.
func waitFor[T any](ctx context.Context, sleep func(context.Context, time.Duration) bool, d time.Duration, ch <-chan T) (T, bool) {
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	expired := make(chan struct{})
	go func() {
		sleep(tctx, d)
		close(expired)
	}()
	var zero T
	select {
	case v := <-ch:
		return v, true
	case <-expired:
		// A value sent just as the time ran out still counts.
		select {
		case v := <-ch:
			return v, true
		default:
			return zero, false
		}
	}
}

// sglangHandOff is a prefill sending its KV to the decode of its room,
// waiting for the decode's registration up to the bootstrap timeout
// (counted from when its prefill is done). The failure is the prefill
// request's too, as SGLang's KVSender.failure_exception fails it.
func (s *Server) sglangHandOff(ctx context.Context, room uint64, pr prompt, n int, start time.Time) *loadFailure {
	ch := s.room(room)
	defer func() {
		s.kv.mu.Lock()
		delete(s.kv.rooms, room)
		s.kv.mu.Unlock()
	}()
	c, ok := waitFor(ctx, s.cfg.Sleep, s.cfg.KV.BootstrapTimeout, ch)
	if !ok {
		s.m.sglBootstrapFailed.Inc()
		return &loadFailure{LoadFailTimeout, fmt.Sprintf("Request %d timed out after %.1fs waiting for decode handshake", room, s.now().Sub(start).Seconds())}
	}
	defer s.kv.forget(c)
	_ = json.NewEncoder(c).Encode(sideMsg{OK: true, Room: room, Tokens: n, Hash: promptHash(pr)})
	return nil
}

// sglangLoadKV is a decode registering with its prefill's bootstrap port for
// its room and waiting, up to the waiting timeout, for the KV.
func (s *Server) sglangLoadKV(ctx context.Context, b bootstrap, pr prompt, n int) *loadFailure {
	room := *b.BootstrapRoom
	if b.BootstrapHost == nil || b.BootstrapPort == nil {
		s.m.sglBootstrapFailed.Inc()
		return &loadFailure{LoadFailConnect, fmt.Sprintf("bootstrap_room %d without bootstrap_host and bootstrap_port", room)}
	}
	addr := net.JoinHostPort(*b.BootstrapHost, strconv.Itoa(*b.BootstrapPort))
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	var d net.Dialer
	c, err := d.DialContext(dctx, "tcp", addr)
	cancel()
	if err != nil {
		s.m.sglBootstrapFailed.Inc()
		return &loadFailure{LoadFailConnect, fmt.Sprintf("Failed to connect to the bootstrap server %s for bootstrap_room %d: %v", addr, room, err)}
	}
	defer c.Close()
	start := s.now()
	if err := json.NewEncoder(c).Encode(sideMsg{Room: room, Tokens: n, Hash: promptHash(pr)}); err != nil {
		s.m.sglBootstrapFailed.Inc()
		return &loadFailure{LoadFailConnect, fmt.Sprintf("bootstrap_room %d: %v", room, err)}
	}
	got := make(chan sideMsg, 1)
	go func() {
		var m sideMsg
		if err := json.NewDecoder(bufio.NewReader(c)).Decode(&m); err != nil {
			m = sideMsg{Reason: LoadFailTransfer, Error: "the prefill closed the connection: " + err.Error()}
		}
		got <- m
	}()
	m, ok := waitFor(ctx, s.cfg.Sleep, s.cfg.KV.WaitingTimeout, got)
	if !ok {
		_ = c.Close() // ends the reader
		<-got
		s.m.sglTransferFailed.Inc()
		return &loadFailure{LoadFailTimeout, fmt.Sprintf("Request %d timed out after %.1fs waiting for KV transfer", room, s.now().Sub(start).Seconds())}
	}
	if !m.OK {
		s.m.sglTransferFailed.Inc()
		return &loadFailure{m.Reason, fmt.Sprintf("KV transfer failed for bootstrap_room %d: %s", room, m.Error)}
	}
	if m.Hash != promptHash(pr) || m.Tokens != n {
		s.m.sglTransferFailed.Inc()
		return &loadFailure{LoadFailMismatch, fmt.Sprintf("bootstrap_room %d: the prefill's KV is another prompt's (%d tokens, %d here)", room, m.Tokens, n)}
	}
	if !s.sleep(ctx, s.transferTime(n)) {
		return &loadFailure{LoadFailTransfer, "client left during the transfer"}
	}
	return nil
}
