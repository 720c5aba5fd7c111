package supervisor

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/status"
)

// Two adapters added at once through two nodes both land: each change
// checks, once the write had time to spread, that the spec every node
// converged to still holds it, and applies itself again when the other
// write replaced it. Removing one through a third node leaves the rest.
func TestAdapterChangesThroughTwoNodesBothLand(t *testing.T) {
	_, nodes := threeNodes(t)
	spec := []byte(`{"name":"chat","model":"m/tiny","engine":"fake","replicas":1,"max_loras":2,"adapters":[{"name":"base","source":"org/base"}]}`)
	if code := call(t, "POST", api(nodes[0], "/v1/deployments"), testToken, spec, nil); code != 200 {
		t.Fatalf("place: HTTP %d", code)
	}
	for _, n := range nodes {
		testwait.Until(t, 5*time.Second, n.Name()+" knows chat", func() (bool, string) {
			var deps []status.DeploymentInfo
			call(t, "GET", api(n, "/v1/deployments"), "", nil, &deps)
			return len(deps) == 1, fmt.Sprint(len(deps))
		})
	}
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i, name := range []string{"x", "y"} {
		wg.Go(func() {
			body, _ := json.Marshal(map[string]string{"name": name, "source": "org/" + name})
			codes[i] = call(t, "POST", api(nodes[1+i], "/v1/deployments/chat/adapters"), testToken, body, nil)
		})
	}
	wg.Wait()
	if codes[0] != 200 || codes[1] != 200 {
		t.Fatalf("adding x and y at once: HTTP %v", codes)
	}
	names := func(n *Node) []string {
		var deps []status.DeploymentInfo
		call(t, "GET", api(n, "/v1/deployments"), "", nil, &deps)
		var out []string
		for _, d := range deps {
			for _, a := range d.Adapters {
				out = append(out, a.Name)
			}
		}
		slices.Sort(out)
		return out
	}
	for _, n := range nodes {
		testwait.Until(t, 5*time.Second, n.Name()+" holds base, x and y", func() (bool, string) {
			got := names(n)
			return slices.Equal(got, []string{"base", "x", "y"}), fmt.Sprint(got)
		})
	}
	if code := call(t, "DELETE", api(nodes[0], "/v1/deployments/chat/adapters/x"), testToken, nil, nil); code != 200 {
		t.Fatalf("removing x: HTTP %d", code)
	}
	for _, n := range nodes {
		testwait.Until(t, 5*time.Second, n.Name()+" holds base and y", func() (bool, string) {
			got := names(n)
			return slices.Equal(got, []string{"base", "y"}), fmt.Sprint(got)
		})
	}
	// Bad input changes nothing and names the field.
	var e struct{ Error string }
	if code := call(t, "POST", api(nodes[0], "/v1/deployments/chat/adapters"), testToken, []byte(`{"name":"z","source":"../etc"}`), &e); code != 400 {
		t.Errorf("a source with '..': HTTP %d %s, want 400", code, e.Error)
	}
	if code := call(t, "POST", api(nodes[0], "/v1/deployments/nope/adapters"), testToken, []byte(`{"name":"z","source":"org/z"}`), nil); code != 404 {
		t.Errorf("no such deployment: HTTP %d, want 404", code)
	}
}
