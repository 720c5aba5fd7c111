package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/placement/fit/fittest"
	"github.com/llmgw/llmgw/probes/weights/weightstest"
	"github.com/llmgw/llmgw/supervisor/status"
)

// A spec field that the cluster's active protocol version does not know
// (start_timeout, before protocol 2) is refused at place, by the API with
// 400 and an error that names the field and the version it needs, until
// that version is active: a node of the previous release would run the
// deployment without it. Places without the field, and unplaces, work
// meanwhile; once the version is active the field is taken, as a change
// of settings that rolls nothing.
func TestPlaceRefusesAFieldTheActiveVersionDoesNotKnow(t *testing.T) {
	clk := clock.NewFake(time.Now())
	h := newHarness(t)
	// A model's headers in a's weights dir, for gpu_memory: auto below.
	cfg := h.config("a")
	cfg.WeightsDir = t.TempDir()
	if _, err := weightstest.WriteHubCache(cfg.WeightsDir, "meta-llama/Llama-3.1-8B", fittest.Llama31_8B(), 2); err != nil {
		t.Fatal(err)
	}
	h.cfgs["a"] = cfg
	a, _ := startAtV1(t, h, "a", clk)

	timed := `{"name":"chat","model":"m/tiny","engine":"fake","replicas":1,"start_timeout":"3h"}`
	code, _, msg := placeRaw(t, a, timed)
	if code != http.StatusBadRequest {
		t.Fatalf("placing start_timeout at protocol 1: HTTP %d (%s), want 400", code, msg)
	}
	for _, want := range []string{"start_timeout needs cluster protocol 2", "the cluster runs protocol 1", "leave start_timeout out"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal does not say %q: %s", want, msg)
		}
	}
	if _, ok := a.Cluster().Deployment("chat"); ok {
		t.Fatal("the refused spec was stored")
	}
	// The same refusal for every interface (MCP calls Place too).
	spec, err := placement.DecodeDeployment([]byte(timed))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Place(context.Background(), spec); !errors.Is(err, placement.ErrInvalidDeployment) {
		t.Fatalf("Place: %v, want an error wrapping placement.ErrInvalidDeployment", err)
	}

	// Without the field, place and unplace work at protocol 1.
	plain := `{"name":"chat","model":"m/tiny","engine":"fake","replicas":1}`
	var placed status.DeploymentInfo
	if code := call(t, "POST", api(a, "/v1/deployments"), testToken, []byte(plain), &placed); code != 200 {
		t.Fatalf("placing chat without start_timeout at protocol 1: HTTP %d", code)
	}
	// The stored spec is what the previous release (9f0749d) stored for
	// the same request, byte for byte (its decoder already wrote engine,
	// tensor_parallel and pipeline_parallel, which SpecVersion defaults
	// alike): no default of a field added since (start_timeout's 2 h) is
	// written into it, so it reads the same to both releases.
	stored, _ := a.Cluster().Deployment("chat")
	const previous = `{"name":"chat","model":"m/tiny","engine":"fake","replicas":1,"tensor_parallel":1,"pipeline_parallel":1}`
	if b, _ := json.Marshal(stored.Spec); string(b) != previous {
		t.Errorf("stored spec %s, want what 9f0749d stored: %s", b, previous)
	}
	if code := call(t, "DELETE", api(a, "/v1/deployments/chat"), testToken, nil, nil); code != 200 {
		t.Fatalf("unplacing chat at protocol 1: HTTP %d", code)
	}
	if code := call(t, "POST", api(a, "/v1/deployments"), testToken, []byte(plain), &placed); code != 200 {
		t.Fatalf("placing chat again: HTTP %d", code)
	}

	// gpu_memory: auto without max_num_seqs chooses the count below
	// protocol 3 too, but stores it as a plain cap: fit.seqs_chosen is
	// protocol 3's, and a node of the previous release would drop it and
	// hash the spec to another version. Given by hand, it is refused as
	// start_timeout is.
	code, auto, msg := placeRaw(t, a, `{"name":"llama","model":"meta-llama/Llama-3.1-8B","engine":"fake","gpu_memory":"auto","max_model_len":8192}`)
	if d := auto.Deployment; code != http.StatusOK || d.Fit == nil || d.MaxNumSeqs != 16 || d.Fit.SeqsChosen {
		t.Fatalf("gpu_memory auto at protocol 1: HTTP %d (%s), spec %+v; want max_num_seqs 16 without fit.seqs_chosen", code, msg, d)
	}
	code, _, msg = placeRaw(t, a, `{"name":"llama2","model":"m/tiny","engine":"fake","gpu_memory":"40GiB","fit":{"seqs_chosen":true}}`)
	if code != http.StatusBadRequest || !strings.Contains(msg, "fit.seqs_chosen needs cluster protocol 3") {
		t.Fatalf("fit.seqs_chosen at protocol 1: HTTP %d (%s), want 400 naming the field", code, msg)
	}
	if code := call(t, "DELETE", api(a, "/v1/deployments/llama"), testToken, nil, nil); code != 200 {
		t.Fatalf("unplacing llama: HTTP %d", code)
	}

	// Alone, a rises to protocol 2 on its clock; then the field is taken.
	testwait.Until(t, 15*time.Second, "a rises to protocol 2", func() (bool, string) {
		clk.Advance(time.Second)
		v := a.GossipStats().ActiveVersion
		return v >= protocol.V2, fmt.Sprint(v)
	})
	var tuned status.DeploymentInfo
	if code := call(t, "POST", api(a, "/v1/deployments"), testToken, []byte(timed), &tuned); code != 200 {
		t.Fatalf("placing start_timeout at protocol 2: HTTP %d", code)
	}
	if tuned.Change != status.ChangeSettings || tuned.SpecVersion != placed.SpecVersion {
		t.Errorf("adding start_timeout: change %q, spec version %s; want %q and %s (no engine rolls)", tuned.Change, tuned.SpecVersion, status.ChangeSettings, placed.SpecVersion)
	}
}
