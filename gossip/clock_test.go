package gossip

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
)

func within(d, want, tol time.Duration) bool { return d >= want-tol && d <= want+tol }

// Each node estimates its peers' clocks from the wall time in their acks,
// and its own against the cluster's (the median). A node past the bound
// says so in its log, shows in every node's members, and refuses to write:
// its stamps would be refused everywhere else.
func TestClockOffsetIsEstimatedAndAWrongClockRefusesWrites(t *testing.T) {
	skew := MaxClockOffset + 10*time.Second
	a := startNode(t, "a", 0, t.TempDir(), nil)
	b := startNode(t, "b", 0, t.TempDir(), nil)
	c := startNode(t, "c", 0, t.TempDir(), func(cfg *Config) { cfg.Clock = clock.Offset(clock.Real(), func() time.Duration { return skew }) })
	mustJoin(t, b, a)
	mustJoin(t, c, a)
	const tol = time.Second
	testwait.Until(t, 10*time.Second, "c knows its clock is off", func() (bool, string) {
		off, n := c.ClockOffset()
		return n == 2 && within(off, skew, tol), fmt.Sprintf("%v from %d peers", off, n)
	})
	testwait.Until(t, 10*time.Second, "a knows its clock is right and c's is not", func() (bool, string) {
		off, n := a.ClockOffset()
		var cOff *time.Duration
		for _, m := range a.Members() {
			if m.Name == "c" {
				cOff = m.ClockOffset
			}
		}
		return n == 2 && within(off, 0, tol) && cOff != nil && within(*cOff, skew, tol), fmt.Sprintf("a %v from %d peers, c %v", off, n, cOff)
	})
	_, err := c.PutDeployment(placement.Deployment{Name: "chat", Model: "m", Replicas: 1})
	if !errors.Is(err, ErrClockOutOfBounds) || !strings.Contains(err.Error(), "clock") {
		t.Fatalf("a place on the node with the wrong clock: %v, want ErrClockOutOfBounds", err)
	}
	if _, ok := c.store.Deployment("chat"); ok {
		t.Fatal("the refused place is in the store")
	}
	if _, err := a.PutDeployment(placement.Deployment{Name: "chat", Model: "m", Replicas: 1}); err != nil {
		t.Fatalf("a place on a node with a good clock: %v", err)
	}
	testwait.Until(t, 5*time.Second, "c learns a's place", func() (bool, string) {
		_, ok := c.Deployment("chat")
		return ok, ""
	})
	if _, _, err := c.DeleteDeployment("chat"); !errors.Is(err, ErrClockOutOfBounds) {
		t.Fatalf("an unplace on the node with the wrong clock: %v, want ErrClockOutOfBounds", err)
	}
	if d, _ := c.store.Deployment("chat"); d.Deleted {
		t.Fatal("the refused unplace is in the store")
	}
	testwait.Until(t, 5*time.Second, "c logs that its clock is off", func() (bool, string) {
		l := c.log.String()
		return strings.Contains(l, "clock") && strings.Contains(l, "level=ERROR"), l
	})
}
