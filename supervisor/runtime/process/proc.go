package process

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// procStat is what the runtime reads of /proc/<pid>/stat.
type procStat struct {
	state byte // R, S, D, Z, X, ...
	pgrp  int
	// startTime is field 22: clock ticks after boot at which the process
	// started. With the pid and the boot ID it names one process for the
	// machine's uptime, which is what guards against pid reuse.
	startTime uint64
}

// dead is true for zombies: they hold a pid but no longer run, and nobody
// but their parent can reap them.
func (s procStat) dead() bool { return s.state == 'Z' || s.state == 'X' }

// readStat parses /proc/<pid>/stat. The command name (field 2) is in
// parentheses and may itself contain spaces and parentheses, so fields are
// counted from the last ')'.
func readStat(proc string, pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	return parseStat(b)
}

func parseStat(b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, errors.New("proc stat: no ')'")
	}
	// fields[0] is field 3 (state).
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 20 {
		return procStat{}, fmt.Errorf("proc stat: %d fields after the command name", len(fields))
	}
	pgrp, err := strconv.Atoi(fields[2])
	if err != nil {
		return procStat{}, fmt.Errorf("proc stat pgrp: %w", err)
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("proc stat starttime: %w", err)
	}
	if len(fields[0]) != 1 {
		return procStat{}, fmt.Errorf("proc stat state %q", fields[0])
	}
	return procStat{state: fields[0][0], pgrp: pgrp, startTime: start}, nil
}

// bootID identifies this boot: start times restart from zero after a reboot.
func bootID(proc string) string {
	b, err := os.ReadFile(filepath.Join(proc, "sys", "kernel", "random", "boot_id"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// groupMembers returns the live (non-zombie) processes of process group
// pgrp that started no earlier than notBefore. The second condition keeps a
// recycled group ID from matching strangers: a member of the engine's group
// was born after the engine.
func groupMembers(proc string, pgrp int, notBefore uint64) ([]int, error) {
	entries, err := os.ReadDir(proc)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(proc, pid)
		if err != nil {
			// Gone between ReadDir and here.
			continue
		}
		if st.pgrp == pgrp && !st.dead() && st.startTime >= notBefore {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
