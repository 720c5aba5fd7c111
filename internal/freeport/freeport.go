// Package freeport hands out loopback ports that are free for both TCP and
// UDP, for tests and for the scenario runner, which start real nodes
// (memberlist binds both protocols on one number) on one machine.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Picker hands out ports it has not handed out before. It picks below the
// kernel's ephemeral range: a port the kernel handed out and took back
// (":0") is soon handed to some outgoing connection of the nodes
// themselves, which then holds it when the node binds. A Picker is safe for
// concurrent use.
type Picker struct {
	mu    sync.Mutex
	given map[int]bool
	low   int
}

// New returns a Picker.
func New() *Picker { return &Picker{given: map[int]bool{}, low: ephemeralLow()} }

// Next returns a port free on 127.0.0.1 for TCP and UDP.
func (p *Picker) Next() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	port, err := pick(p.low, func(port int) bool { return !p.given[port] })
	if err == nil {
		p.given[port] = true
	}
	return port, err
}

// Loopback returns a port free on 127.0.0.1 for TCP and UDP, picked at
// random below the kernel's ephemeral range, for tests that start and stop
// nodes themselves. Not one the kernel hands out for ":0": closed again
// until the node binds it, such a port went to an outgoing connection of
// the machine's other tests ("address already in use" in a loaded run of
// the suite). Unlike a Picker it keeps no memory, so callers need not
// share one. Another process may still take the port before the caller
// binds it; callers that can, pick again then (supervisortest.Start).
func Loopback() (int, error) {
	return pick(ephemeralLow(), func(int) bool { return true })
}

// pick draws ports at random from 10000 up to low, the bottom of the
// ephemeral range, until one that ok accepts is free.
func pick(low int, ok func(port int) bool) (int, error) {
	for range 200 {
		if port := 10000 + rand.IntN(max(low-10000, 1000)); ok(port) && free(port) {
			return port, nil
		}
	}
	return 0, errors.New("no free port on 127.0.0.1")
}

func free(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
	l.Close()
	if err != nil {
		return false
	}
	u.Close()
	return true
}

// ephemeralLow is the bottom of the kernel's ephemeral port range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	v, err := strconv.Atoi(f[0])
	if err != nil || v < 11000 {
		return 32768
	}
	return v
}
