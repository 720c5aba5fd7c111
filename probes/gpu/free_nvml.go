//go:build cgo

package gpu

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

var _ FreeReader = (*NVML)(nil)

// FreeMemory implements FreeReader with NVML's own Free figure (v2 when
// the library has it, v1 otherwise; both count reserved memory as not
// free).
func (n *NVML) FreeMemory(ctx context.Context, indices []int) ([]uint64, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ok, err := n.ready()
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("gpu: free memory: no NVML library on this host")
	}
	out := make([]uint64, 0, len(indices))
	for _, i := range indices {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		h, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("gpu: free memory of GPU %d: handle: %w", i, ret)
		}
		free, err := n.free(h)
		if err != nil {
			return nil, fmt.Errorf("gpu: free memory of GPU %d: %w", i, err)
		}
		out = append(out, free)
	}
	return out, nil
}

func (n *NVML) free(h nvml.Device) (uint64, error) {
	if n.hasV2 {
		m, ret := h.GetMemoryInfo_v2()
		switch ret {
		case nvml.SUCCESS:
			return m.Free, nil
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
		default:
			return 0, fmt.Errorf("memory info v2: %w", ret)
		}
	}
	m, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("memory info: %w", ret)
	}
	return m.Free, nil
}
