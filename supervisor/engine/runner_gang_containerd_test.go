package engine

import (
	"testing"
)

// TestGangOverContainerd runs a pp 2 gang's members as containers of a
// real containerd, one runner per node: with host networking, rank 1's
// container dials rank 0's rendezvous at the node's address, rank 0
// becomes ready only once it has, and a member's crash (its task killed)
// restarts every member under a new generation. It skips only where no
// containerd answers (CI starts one with .ci/containerd.sh).
func TestGangOverContainerd(t *testing.T) {
	open := containerdWithImage(t, "llmgw-gang-test", "llmgw/gang-test:1")
	h := newGangHarnessWith(t, 2, "llmgw/gang-test:1", func(node string, c *Config) {
		c.Runtime, c.Self = open(), "/llmgw"
		c.PortMin, c.PortMax = 21100, 21999
	}, "n1", "n2")
	gen := h.waitServing("the gang serving from containers", 0)
	r0, r1 := h.rec(0), h.rec(1)
	if r0.Container == "" || r1.Container == "" || r0.Container == r1.Container {
		t.Fatalf("containers rank 0 %q, rank 1 %q: want one each", r0.Container, r1.Container)
	}
	if r0.URL == "" || r1.URL != "" {
		t.Errorf("URLs rank 0 %q, rank 1 %q: want only rank 0's", r0.URL, r1.URL)
	}
	pid0 := r0.PID
	h.kill(r1.PID)
	if got := h.waitServing("the gang serving again", gen); got <= gen {
		t.Errorf("generation %d after %d", got, gen)
	}
	if h.rec(0).PID == pid0 {
		t.Errorf("rank 0's container task (pid %d) was not restarted with the gang", pid0)
	}
}
