//go:build !cgo

package gpu

import "context"

// noNVML stands in for NVML in a binary built without cgo, which go-nvml
// needs: such a node reports no GPUs rather than failing to build.
type noNVML struct{}

// System returns a Probe that reports no GPUs: this binary was built without
// cgo, and NVML cannot be loaded without it.
func System() Probe { return noNVML{} }

func (noNVML) Discover(ctx context.Context) (Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return Snapshot{}, err
	}
	return Snapshot{Warnings: []string{"built without cgo: NVML cannot be loaded"}}, nil
}

func (noNVML) Close() error { return nil }

func (noNVML) Telemetry(ctx context.Context) ([]Telemetry, error) { return nil, ctx.Err() }
