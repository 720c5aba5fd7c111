package engine

import (
	"fmt"
	"hash/fnv"
	"net"
	"strconv"
)

// allocPort takes a port from the range that nothing on this host listens
// on. Checking by binding matters when several nodes share one host (the
// demo, the scenarios). The caller holds r.mu.
//
// The scan starts at an offset derived from the node name, so agents that
// share a host rarely race for the same port; when they do, the loser finds
// the port taken at its next start and moves (see ensurePort).
func (r *Runner) allocPort(id string) (int, error) {
	span := r.cfg.PortMax - r.cfg.PortMin + 1
	h := fnv.New32a()
	h.Write([]byte(r.cfg.Node))
	off := int(h.Sum32() % uint32(span))
	for i := 0; i < span; i++ {
		p := r.cfg.PortMin + (off+i)%span
		if _, used := r.ports[p]; used || !portFree(p) {
			continue
		}
		r.ports[p] = id
		return p, nil
	}
	return 0, fmt.Errorf("no free engine port in %d-%d", r.cfg.PortMin, r.cfg.PortMax)
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("0.0.0.0", strconv.Itoa(p)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// ensurePort moves an engine that is about to (re)start to a free port when
// something else took its port meanwhile.
func (r *Runner) ensurePort(e *managed) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := e.state.Spec.HTTPPort
	if old > 0 && portFree(old) {
		return
	}
	delete(r.ports, old)
	p, err := r.allocPort(e.id)
	if err != nil {
		r.log.Error("no free port for engine", "engine", e.id, "err", err)
		return
	}
	e.state.Spec.HTTPPort = p
	r.log.Warn("engine port taken by another process; moving", "engine", e.id, "from", old, "to", p)
}
