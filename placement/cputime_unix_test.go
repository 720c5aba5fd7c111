//go:build unix

package placement

import "syscall"

// cpuTime is the process's user plus system CPU time in nanoseconds. The
// benchmarks report it per operation beside wall time: on a shared machine
// wall time says as much about the neighbours as about the code.
func cpuTime() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
