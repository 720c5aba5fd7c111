package containerd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// GPUDeviceKind is the CDI kind NVIDIA's toolkit generates for GPUs.
const GPUDeviceKind = "nvidia.com/gpu"

// CDIGenerateCommand is what makes the CDI spec on a node. Recent toolkits
// name each device by index and by UUID; llmgw asks for UUIDs because
// indices shift when a GPU falls off the bus.
const CDIGenerateCommand = "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"

// gpuSpecOpt resolves the GPUs to CDI devices and returns the spec option
// that injects them, or nil when there are none.
//
// It reads the spec directories into a cache of its own, without automatic
// refresh, instead of containerd's pkg/cdi.WithCDIDevices: that one uses the
// CDI library's process-wide registry, which starts a file watcher on first
// use and cannot be pointed at other directories. The injection itself is
// the same library call.
func (r *Runtime) gpuSpecOpt(uuids []string) (oci.SpecOpts, error) {
	if len(uuids) == 0 {
		return nil, nil
	}
	cache, _ := cdi.NewCache(cdi.WithSpecDirs(r.cdiDirs...), cdi.WithAutoRefresh(false))
	known := cache.ListDevices()
	devices := make([]string, len(uuids))
	var missing []string
	for i, u := range uuids {
		devices[i] = GPUDeviceKind + "=" + u
		if !slices.Contains(known, devices[i]) {
			missing = append(missing, devices[i])
		}
	}
	if len(missing) > 0 {
		var nvidia int
		for _, d := range known {
			if strings.HasPrefix(d, GPUDeviceKind+"=") {
				nvidia++
			}
		}
		var specErrs []error
		byPath := cache.GetErrors()
		paths := make([]string, 0, len(byPath))
		for p := range byPath {
			paths = append(paths, p)
		}
		slices.Sort(paths)
		for _, p := range paths {
			specErrs = append(specErrs, fmt.Errorf("%s: %w", p, errors.Join(byPath[p]...)))
		}
		if nvidia == 0 {
			return nil, fmt.Errorf("no NVIDIA CDI spec in %s, so GPUs %s cannot be given to containers; generate one on this node with `%s` (NVIDIA Container Toolkit)%s",
				strings.Join(r.cdiDirs, ", "), strings.Join(uuids, ", "), CDIGenerateCommand, specErrors(specErrs))
		}
		return nil, fmt.Errorf("the NVIDIA CDI spec in %s has no device %s; regenerate it with `%s --device-name-strategy=index --device-name-strategy=uuid` (it may predate a GPU change)%s",
			strings.Join(r.cdiDirs, ", "), strings.Join(missing, ", "), CDIGenerateCommand, specErrors(specErrs))
	}
	return func(ctx context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if _, err := cache.InjectDevices(s, devices...); err != nil {
			return fmt.Errorf("CDI injection of %s: %w", strings.Join(devices, ", "), err)
		}
		return nil
	}, nil
}

func specErrors(errs []error) string {
	if len(errs) == 0 {
		return ""
	}
	return " (spec errors: " + errors.Join(errs...).Error() + ")"
}
