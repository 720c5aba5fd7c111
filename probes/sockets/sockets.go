// Package sockets answers one question from /proc: which process listens
// on a TCP port. The runner asks it before it believes an engine is ready:
// an HTTP answer on the engine's port proves only that *something* serves
// there (a stale engine of another agent on the same host, say).
package sockets

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// FS is the /proc tree to read; tests point it at a fixture.
type FS struct{ Root string }

// Host reads the real /proc.
func Host() FS { return FS{Root: "/proc"} }

// ErrNoListener: nothing listens on the port (in this network namespace).
var ErrNoListener = errors.New("no socket listens on the port")

// listenInodes returns the socket inodes listening on port, as the
// "socket:[N]" link targets that /proc/PID/fd shows.
func (f FS) listenInodes(port int) (map[string]bool, error) {
	inodes := map[string]bool{}
	read := 0
	for _, name := range []string{"net/tcp", "net/tcp6"} {
		b, err := os.ReadFile(filepath.Join(f.Root, name))
		if err != nil {
			continue // no IPv6, say
		}
		read++
		lines := strings.Split(string(b), "\n")
		for _, l := range lines[1:] {
			fs := strings.Fields(l)
			// sl local_address rem_address st ... uid timeout inode
			if len(fs) < 10 || fs[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, hexPort, ok := strings.Cut(fs[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); ok && err == nil && int(p) == port {
				inodes["socket:["+fs[9]+"]"] = true
			}
		}
	}
	if read == 0 {
		return nil, fmt.Errorf("read %s/net/tcp: no TCP tables", f.Root)
	}
	return inodes, nil
}

// Owner returns the pid of a process, among root and its descendants, that
// holds a socket listening on port. It returns found=false with a nil
// error when the listener belongs to some other process, and
// ErrNoListener when nothing listens.
func (f FS) Owner(port, root int) (pid int, found bool, err error) {
	inodes, err := f.listenInodes(port)
	if err != nil {
		return 0, false, err
	}
	if len(inodes) == 0 {
		return 0, false, ErrNoListener
	}
	// If root's descriptors cannot be seen (no such pid in our pid
	// namespace, /proc mounted hidepid, a non-dumpable process), "not
	// found" would mean "cannot tell", not "someone else's".
	if _, err := os.ReadDir(filepath.Join(f.Root, strconv.Itoa(root), "fd")); err != nil {
		return 0, false, fmt.Errorf("read the descriptors of pid %d: %w", root, err)
	}
	pid = f.holder(f.tree(root), inodes)
	return pid, pid > 0, nil
}

// OwnerAmong returns which of pids holds a socket listening on port; 0 if
// none of them (or nothing listens).
func (f FS) OwnerAmong(port int, pids []int) (int, error) {
	inodes, err := f.listenInodes(port)
	if err != nil || len(inodes) == 0 {
		return 0, err
	}
	return f.holder(pids, inodes), nil
}

// holder returns the first of pids with an fd on one of inodes, or 0.
func (f FS) holder(pids []int, inodes map[string]bool) int {
	for _, p := range pids {
		if f.holds(p, inodes) {
			return p
		}
	}
	return 0
}

// holds reports whether pid has an fd on one of inodes.
func (f FS) holds(pid int, inodes map[string]bool) bool {
	dir := filepath.Join(f.Root, strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if t, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && inodes[t] {
			return true
		}
	}
	return false
}

// tree returns root and every process descended from it.
func (f FS) tree(root int) []int {
	children := map[int][]int{}
	ents, _ := os.ReadDir(f.Root)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp := f.Parent(pid); pp > 0 {
			children[pp] = append(children[pp], pid)
		}
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// Parent reads a process's parent pid from /proc/PID/stat; 0 if unknown.
func (f FS) Parent(pid int) int {
	b, err := os.ReadFile(filepath.Join(f.Root, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	// The command name may hold spaces and parentheses: fields start
	// after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	fs := strings.Fields(string(b[i+1:]))
	if len(fs) < 2 {
		return 0
	}
	p, _ := strconv.Atoi(fs[1])
	return p
}
