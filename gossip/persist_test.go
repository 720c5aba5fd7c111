package gossip

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/testmem"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
)

// FuzzLoadDeployments feeds the deployments.json loader anything: it
// never panics, its errors name the file, what it takes in (records that
// pass the same checks as a peer's) is what a peer's message can carry
// (push/pull sends the whole store), and what it allocates is a small
// multiple of the file plus a constant.
func FuzzLoadDeployments(f *testing.F) {
	spec := placement.Deployment{Name: "chat", Model: "m", Replicas: 2, Labels: map[string]string{"zone": "a"}, Args: []string{"--x"}}
	good, _ := json.MarshalIndent(deploymentsOnDisk{FormatVersion: 1, Deployments: []DeploymentRecord{
		{Name: "chat", Spec: &spec, Stamp: Stamp{Wall: 1700000000000, Logical: 3, Origin: "n1"}},
		{Name: "old", Deleted: true, Stamp: Stamp{Wall: 1700000000001, Origin: "n2"}},
	}}, "", "  ")
	f.Add(good)
	f.Add(good[:len(good)/2]) // truncated, as by a full disk
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"format_version":1,"deployments":[{"name":"a"}]}`))
	f.Add([]byte(`{"format_version":1,"deployments":[{"name":"a","spec":{"name":"b","model":"m"}}]}`))
	f.Add([]byte(`{"format_version":1,"deployments":[{"name":"a","deleted":true,"stamp":{"wall":9223372036854775807,"logical":4294967295}}]}`))
	f.Add([]byte(`{"x":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`))
	f.Add([]byte(`{"deployments":[` + strings.Repeat(`{"name":"a","deleted":true},`, 2000) + `{"name":"a","deleted":true}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		const path = "/data/deployments.json"
		var (
			recs []DeploymentRecord
			err  error
		)
		clk := clock.NewFake(time.UnixMilli(1700000000000))
		store, hlc := NewStore(clk, time.Hour), NewHLC("n", clk)
		got := testmem.Allocated(func() {
			if recs, err = parseDeployments(b, path); err == nil {
				for _, r := range recs {
					if _, bad := checkDeployment(r, clk.Now()); bad != nil {
						continue
					}
					hlc.Witness(r.Stamp)
					store.MergeDeployment(r)
				}
				hlc.Now()
			}
		})
		if limit := 64*uint64(len(b)) + 1<<20; testmem.Exact() && got > limit {
			t.Fatalf("a %d-byte file allocated %d bytes, over its budget of %d", len(b), got, limit)
		}
		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		held := store.Deployments()
		wire, err := encode(message{Deployments: held})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := decode(wire); err != nil {
			t.Fatalf("a peer would drop what the store took in: %v", err)
		}
	})
}

// Tombstones past the TTL are forgotten by the hourly collection, which
// runs on the cluster's clock; live deployments stay.
func TestTombstonesAreCollectedHourlyOnTheClusterClock(t *testing.T) {
	clk := clock.NewFake(time.Now())
	a := startNode(t, "a", 0, "", func(c *Config) { c.Clock = clk; c.TombstoneTTL = time.Minute })
	for _, name := range []string{"chat", "gone"} {
		if _, err := a.PutDeployment(*specNamed(name)); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok, err := a.DeleteDeployment("gone"); !ok || err != nil {
		t.Fatalf("delete: %v, %v", ok, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clk.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("the collection ticker never armed: %v", err)
	}
	clk.Advance(time.Hour)
	testwait.Until(t, 5*time.Second, "the tombstone collected", func() (bool, string) {
		_, held := a.store.Deployment("gone")
		return !held, fmt.Sprintf("held: %v", a.Deployments())
	})
	if _, ok := a.Deployment("chat"); !ok {
		t.Error("the collection forgot a live deployment")
	}
}
