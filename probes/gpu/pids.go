package gpu

import (
	"bytes"
	"io/fs"
	"slices"
	"strconv"
)

// OwnPIDs returns roots and every live descendant of them, read from a
// procfs (fs.FS rooted at /proc; os.DirFS("/proc") in production).
//
// The supervisor knows one PID per engine, but the GPU memory is held by
// whichever processes created CUDA contexts: vLLM's EngineCore and its
// tensor-parallel workers are children of the API server, and a containerd
// engine's process is a child of the container's init. Matching only the
// root PID would call our own workers' memory foreign. PIDs that have
// exited are dropped from the walk but roots are always kept.
func OwnPIDs(procfs fs.FS, roots []int) map[int]bool {
	own := make(map[int]bool, len(roots))
	for _, r := range roots {
		own[r] = true
	}
	entries, err := fs.ReadDir(procfs, ".")
	if err != nil {
		return own
	}
	children := make(map[int][]int)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		stat, err := fs.ReadFile(procfs, e.Name()+"/stat")
		if err != nil {
			continue // exited between ReadDir and ReadFile
		}
		if ppid, ok := parentPID(stat); ok {
			children[ppid] = append(children[ppid], pid)
		}
	}
	queue := slices.Clone(roots)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if !own[c] {
				own[c] = true
				queue = append(queue, c)
			}
		}
	}
	return own
}

// parentPID reads field 4 of /proc/<pid>/stat. The command name (field 2)
// is in parentheses and may itself contain spaces and ')', so the fields
// are counted from the last ')'.
func parentPID(stat []byte) (int, bool) {
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, false
	}
	fields := bytes.Fields(stat[end+1:])
	if len(fields) < 2 { // state, ppid
		return 0, false
	}
	ppid, err := strconv.Atoi(string(fields[1]))
	if err != nil {
		return 0, false
	}
	return ppid, true
}
