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
