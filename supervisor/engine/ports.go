package engine

import (
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"strconv"
	"sync"
)

// ports is the runner's engine ports: which port of the range each engine
// holds (its HTTP port, and rank 0's gang rendezvous).
//
// Its lock is a leaf, taken after Runner.mu and never before it: its
// methods are called with Runner.mu held or not, and take no other lock,
// but ensure, which takes Runner.mu (as e.mu) first.
type ports struct {
	// node seeds the scan's offset (see alloc); min and max bound the
	// range.
	node     string
	min, max int

	mu sync.Mutex
	// taken maps each port held to its engine ID.
	taken map[int]string
}

func newPorts(node string, min, max int) *ports {
	return &ports{node: node, min: min, max: max, taken: map[int]string{}}
}

// alloc takes for engine id a port from the range that nothing on this
// host listens on. Checking by binding matters when several nodes share
// one host (the demo, the scenarios).
//
// The scan starts at an offset derived from the node name, so agents that
// share a host rarely race for the same port; when they do, the loser finds
// the port taken at its next start and moves (see ensure).
func (p *ports) alloc(id string) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.allocLocked(id)
}

// allocLocked is alloc with p.mu held.
func (p *ports) allocLocked(id string) (int, error) {
	span := p.max - p.min + 1
	h := fnv.New32a()
	h.Write([]byte(p.node))
	off := int(h.Sum32() % uint32(span))
	for i := 0; i < span; i++ {
		port := p.min + (off+i)%span
		if _, used := p.taken[port]; used || !portFree(port) {
			continue
		}
		p.taken[port] = id
		return port, nil
	}
	return 0, fmt.Errorf("no free engine port in %d-%d", p.min, p.max)
}

// hold records that engine id holds port (an adopted engine's).
func (p *ports) hold(port int, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.taken[port] = id
}

// release gives back every port engine id holds.
func (p *ports) release(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for port, owner := range p.taken {
		if owner == id {
			delete(p.taken, port)
		}
	}
}

// rendezvous is the port rank 0's engine id is to listen on for its gang:
// the previous generation's (prev), when id still holds it and it is free,
// so members that kept its address meet it there; else a new one.
func (p *ports) rendezvous(id string, prev int) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if owner, ok := p.taken[prev]; ok && owner == id && portFree(prev) {
		return prev, nil
	}
	return p.allocLocked(id)
}

// ensure moves engine e, about to (re)start, to a free port when something
// else took its port meanwhile. It takes e.mu (then p.mu).
func (p *ports) ensure(e *managed, log *slog.Logger) {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.state.Spec.HTTPPort
	if old > 0 && portFree(old) {
		return
	}
	p.mu.Lock()
	delete(p.taken, old)
	port, err := p.allocLocked(e.id)
	p.mu.Unlock()
	if err != nil {
		log.Error("no free port for engine", "engine", e.id, "err", err)
		return
	}
	e.state.Spec.HTTPPort = port
	log.Warn("engine port taken by another process; moving", "engine", e.id, "from", old, "to", port)
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("0.0.0.0", strconv.Itoa(p)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}
