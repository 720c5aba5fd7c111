package containerd

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"strings"

	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/llmgw/llmgw/supervisor/runtime"
)

// InfinibandDir holds the RDMA device nodes (uverbs*, rdma_cm) the
// kernel's RDMA stack makes.
const InfinibandDir = "/dev/infiniband"

// fabricSpecOpts gives a gang member on a node with RDMA devices what NCCL
// needs to use them (GPUDirect RDMA): the device nodes under devDir
// (InfinibandDir) and CAP_IPC_LOCK, without which registering memory
// with the adapter fails. The memlock limit is already unlimited for
// every engine (wantRlimits). A single-node engine, or a node without
// RDMA devices, gets neither: its collectives never leave the machine.
// devDir missing although the node lists RDMA devices (the uverbs module
// not loaded) is logged, and NCCL falls back to sockets as it would.
func fabricSpecOpts(spec runtime.EngineSpec, devDir string, log *slog.Logger) []oci.SpecOpts {
	if !spec.Gang || len(spec.RDMADevices) == 0 {
		return nil
	}
	opts := []oci.SpecOpts{oci.WithAddedCapabilities([]string{"CAP_IPC_LOCK"})}
	if _, err := os.Stat(devDir); errors.Is(err, fs.ErrNotExist) {
		log.Warn("RDMA devices listed but no device nodes: the gang's collectives will use TCP", "engine", spec.ID,
			"devices", strings.Join(spec.RDMADevices, ","), "missing", devDir)
		return opts
	}
	return append(opts, oci.WithDevices(devDir, "", "rwm"))
}
