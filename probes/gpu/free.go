package gpu

import "context"

// FreeReader reads the free memory of some GPUs now, for a caller about to
// start an engine whose own start rule or memory flag depends on it (vLLM
// refuses to start unless free ≥ its fraction × total; SGLang's
// --mem-fraction-static is a fraction of free memory). Discover's
// MemoryUsed is not enough: it leaves out what the driver reserves, which
// is not free either.
type FreeReader interface {
	// FreeMemory returns the free bytes of each GPU named by index, in
	// the order given.
	FreeMemory(ctx context.Context, indices []int) ([]uint64, error)
}
