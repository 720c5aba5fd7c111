// Package testmem measures what code allocates, for tests that bound the
// memory a decoder may take for its input.
package testmem

import "runtime"

// Allocated is how many bytes f allocates. It counts the whole process, so
// callers run nothing beside it.
func Allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Exact reports whether Allocated counts what the code itself allocates.
// Under the race detector it does not: sync.Pool drops a share of what is
// put back, at random, so encoding/json and others allocate anew what they
// would have reused, and a budget a decoder keeps would fail for nothing.
// Tests check their budgets only when Exact.
func Exact() bool { return !raceEnabled }
