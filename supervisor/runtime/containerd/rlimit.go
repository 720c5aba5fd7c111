package containerd

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Engines want far more than containerd's default spec gives (1024 open
// files, and the daemon's locked-memory limit): vLLM keeps a socket per
// client, and NCCL over RDMA pins memory and fails with errors that look
// like network faults when it cannot.
var wantRlimits = []specs.POSIXRlimit{
	{Type: "RLIMIT_MEMLOCK", Hard: ^uint64(0), Soft: ^uint64(0)},
	{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20},
}

// capSysResource is the capability bit that allows raising a hard limit.
const capSysResource = 24

// daemonLimits is what the daemon's own process allows: runc, started by
// the shim the daemon starts, can raise a container's hard limits only with
// CAP_SYS_RESOURCE (which root normally has, but not in every sandbox).
type daemonLimits struct {
	known    bool
	canRaise bool
	hard     map[string]uint64
}

// probeDaemonLimits finds the daemon's pid from the socket's peer
// credentials (containerd 1.6 does not report it over its API) and reads its
// capabilities and limits from /proc. Anything unknown is reported as
// unknown, and the wanted limits are then used as they are.
func probeDaemonLimits(socket string) daemonLimits {
	conn, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		return daemonLimits{}
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return daemonLimits{}
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || credErr != nil || cred == nil || cred.Pid <= 0 {
		// A daemon in another pid namespace shows as pid 0.
		return daemonLimits{}
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cred.Pid))
	if err != nil {
		return daemonLimits{}
	}
	limits, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", cred.Pid))
	if err != nil {
		return daemonLimits{}
	}
	return parseDaemonLimits(string(status), string(limits))
}

func parseDaemonLimits(status, limits string) daemonLimits {
	d := daemonLimits{hard: map[string]uint64{}}
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return daemonLimits{}
			}
			d.canRaise = caps&(1<<capSysResource) != 0
			d.known = true
		}
	}
	names := map[string]string{"Max open files": "RLIMIT_NOFILE", "Max locked memory": "RLIMIT_MEMLOCK"}
	sc := bufio.NewScanner(strings.NewReader(limits))
	for sc.Scan() {
		line := sc.Text()
		for prefix, kind := range names {
			rest, ok := strings.CutPrefix(line, prefix)
			if !ok {
				continue
			}
			f := strings.Fields(rest)
			if len(f) < 2 {
				continue
			}
			if f[1] == "unlimited" {
				d.hard[kind] = ^uint64(0)
			} else if n, err := strconv.ParseUint(f[1], 10, 64); err == nil {
				d.hard[kind] = n
			}
		}
	}
	return d
}

// rlimits are the wanted limits, cut to the daemon's hard limits when it
// could not raise them.
func (d daemonLimits) rlimits() []specs.POSIXRlimit {
	out := slices.Clone(wantRlimits)
	if !d.known || d.canRaise {
		return out
	}
	for i, l := range out {
		if h, ok := d.hard[l.Type]; ok && h < l.Hard {
			out[i].Hard = h
			out[i].Soft = min(l.Soft, h)
		}
	}
	return out
}

// withRlimits replaces the spec's limits of the same types.
func withRlimits(limits []specs.POSIXRlimit) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		for _, l := range limits {
			s.Process.Rlimits = slices.DeleteFunc(s.Process.Rlimits, func(x specs.POSIXRlimit) bool { return x.Type == l.Type })
			s.Process.Rlimits = append(s.Process.Rlimits, l)
		}
		return nil
	}
}
