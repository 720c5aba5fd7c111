//go:build cgo

package gpu

import (
	"context"
	"testing"
)

// TestFreeMemoryH200Fixture: the free figure is NVML's own (reserved
// memory counted as not free), not total minus Discover's used, which
// would overstate it by what the driver reserves.
func TestFreeMemoryH200Fixture(t *testing.T) {
	for _, syms := range [][]string{{symMemoryInfoV2}, nil} {
		h := newH200(t, syms...)
		free, err := NewNVML(h.lib).FreeMemory(context.Background(), []int{0})
		if err != nil {
			t.Fatal(err)
		}
		if len(free) != 1 || free[0] != h.v2.Free {
			t.Fatalf("symbols %v: free %v, want [%d]", syms, free, h.v2.Free)
		}
		if h.v2.Total-h.v2.Used == free[0] {
			t.Fatalf("fixture cannot tell free from total-used")
		}
	}
	if _, err := NewNVML(newH200(t).lib).FreeMemory(context.Background(), []int{3}); err == nil {
		t.Fatal("GPU 3 of a one-GPU host: want an error")
	}
}
