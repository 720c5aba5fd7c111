package gossip

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testmem"
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
		now := func() time.Time { return time.UnixMilli(1700000000000) }
		store, hlc := NewStore(now, time.Hour), NewHLC("n", now)
		got := testmem.Allocated(func() {
			if recs, err = parseDeployments(b, path); err == nil {
				for _, r := range recs {
					if _, bad := checkDeployment(r, now()); bad != nil {
						continue
					}
					hlc.Witness(r.Stamp)
					store.MergeDeployment(r)
				}
				hlc.Now()
			}
		})
		if limit := 64*uint64(len(b)) + 1<<20; got > limit {
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
