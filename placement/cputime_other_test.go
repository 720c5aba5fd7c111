//go:build !unix

package placement

func cpuTime() int64 { return 0 }
