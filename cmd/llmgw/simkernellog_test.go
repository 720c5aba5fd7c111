package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/status"
)

// Simulated GPUs read driver faults from --sim-kernel-log, so the path
// from a kernel line to the cluster's view runs without a GPU: notices
// count for nothing, an NV_ERR line that names no GPU faults every GPU of
// the node, and the record carries the count and the line.
func TestSimKernelLogFaultsReachTheRecord(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "kmsg.txt")
	stamp := func() string { return "[" + time.Now().Format("Mon Jan _2 15:04:05 2006") + "] " }
	if err := os.WriteFile(logFile, []byte(stamp()+"NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)\n"+
		stamp()+"NVRM: Persistence mode is deprecated and will be removed in a future release. Please use nvidia-persistenced instead.\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, "n1", t.TempDir(), "--simulate-gpus", "2xH100-80GB", "--sim-kernel-log", logFile)
	self := func() status.MemberInfo {
		resp, err := http.Get(n.api + "/v1/cluster")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var ci status.ClusterInfo
		if err := json.NewDecoder(resp.Body).Decode(&ci); err != nil {
			t.Fatal(err)
		}
		for _, m := range ci.Members {
			if m.Name == "n1" {
				return m
			}
		}
		t.Fatalf("n1 not in its own cluster view: %+v", ci)
		return status.MemberInfo{}
	}
	if m := self(); m.Probes.DriverFaultsRecent != 0 || m.Probes.DriverFaultsBoot != 0 || m.GPUs[0].Faulted {
		t.Fatalf("a clean log: probes %+v, GPU 0 faulted %v", m.Probes, m.GPUs[0].Faulted)
	}
	f, err := os.OpenFile(logFile, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(stamp() + "NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051) returned from _memdescAllocInternal(pMemDesc) @ mem_desc.c:1359\n")
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 20*time.Second, "the NV_ERR line in n1's record", func() (bool, string) {
		m := self()
		ok := m.Probes.DriverFaultsRecent == 1 && strings.Contains(m.Probes.LastDriverFault, "NV_ERR_NO_MEMORY") &&
			len(m.GPUs) == 2 && m.GPUs[0].Faulted && m.GPUs[1].Faulted
		return ok, "probes " + toJSON(m.Probes)
	})
}

// --sim-kernel-log is for simulated GPUs only.
func TestSimKernelLogNeedsSimulatedGPUs(t *testing.T) {
	dir := t.TempDir()
	_, err := run(t, "node", "up", "--name", "n1", "--data-dir", dir, "--sim-kernel-log", filepath.Join(dir, "k.txt"), "--runtime", "none")
	if err == nil || !strings.Contains(err.Error(), "--sim-kernel-log") || !strings.Contains(err.Error(), "--simulate-gpus") {
		t.Fatalf("err = %v; want one naming both flags", err)
	}
}

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
