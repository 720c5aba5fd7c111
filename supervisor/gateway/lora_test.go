package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/load"
)

// loraWorld is deployment chat (engine given) with adapters sql, code and
// late, on two replicas: n1's engine lists sql, n2's sql and code; none
// lists late.
func loraWorld(engine string, u1, u2 string) *world {
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat", Engine: engine, Replicas: 2, MaxLoras: 2, Adapters: []placement.Adapter{
		{Name: "sql", Source: "a/sql"}, {Name: "code", Source: "a/code"}, {Name: "late", Source: "a/late"}}})
	w.node("n1", gossip.StateAlive)
	w.node("n2", gossip.StateAlive)
	w.hold(cp{dep: "chat", replica: 0, node: "n1", url: u1, adapters: []string{"sql"}})
	w.hold(cp{dep: "chat", replica: 1, node: "n2", url: u2, adapters: []string{"code", "sql"}})
	return w
}

// A request naming an adapter goes only to replicas whose engine lists
// it, and the engine is asked for it by its name; one that no replica
// lists yet is a 503 saying so; an unknown name is a 404 that lists the
// adapters among the served models.
func TestAdapterRoutesToReplicasThatListIt(t *testing.T) {
	u1, u2 := newUpstream(t, chatOK), newUpstream(t, chatOK)
	h := newHarness(t, Config{}, loraWorld("vllm", u1.URL, u2.URL).snapshot())
	for range 6 {
		if a := h.post("/v1/chat/completions", chatBody("code", false)); a.status != 200 {
			t.Fatalf("code: %d %s", a.status, a.body)
		}
	}
	if u1.hits.Load() != 0 || u2.hits.Load() != 6 {
		t.Errorf("code (listed on n2 only): n1 %d, n2 %d requests, want 0 and 6", u1.hits.Load(), u2.hits.Load())
	}
	var sent struct{ Model string }
	_ = json.Unmarshal(u2.lastBody(), &sent)
	if sent.Model != "code" {
		t.Errorf("vLLM was asked for %q, want the adapter's name", sent.Model)
	}
	a := h.post("/v1/chat/completions", chatBody("late", false))
	if a.status != http.StatusServiceUnavailable || !strings.Contains(a.apiError(t).Error.Message, "LoRA adapter late of deployment chat is registered on no ready replica yet") {
		t.Errorf("late, listed nowhere: %d %s", a.status, a.body)
	}
	a = h.post("/v1/chat/completions", chatBody("nope", false))
	if a.status != http.StatusNotFound || !strings.Contains(a.body, "served models: chat, code, late, sql") {
		t.Errorf("nope: %d %s", a.status, a.body)
	}
}

// SGLang names an adapter as <base>:<adapter>.
func TestSGLangAdapterModel(t *testing.T) {
	u1, u2 := newUpstream(t, chatOK), newUpstream(t, chatOK)
	h := newHarness(t, Config{}, loraWorld("sglang", u1.URL, u2.URL).snapshot())
	if a := h.post("/v1/chat/completions", chatBody("code", false)); a.status != 200 {
		t.Fatalf("code: %d %s", a.status, a.body)
	}
	var sent struct{ Model string }
	_ = json.Unmarshal(u2.lastBody(), &sent)
	if sent.Model != "chat:code" {
		t.Errorf("SGLang was asked for %q, want chat:code", sent.Model)
	}
}

// A deployment's own name wins over an adapter of that name; of two
// deployments with an adapter of one name, the one that sorts first.
func TestAdapterNames(t *testing.T) {
	w := newWorld()
	w.deploy(placement.Deployment{Name: "a", MaxLoras: 1, Adapters: []placement.Adapter{{Name: "x", Source: "s/x"}, {Name: "c", Source: "s/c"}}})
	w.deploy(placement.Deployment{Name: "b", MaxLoras: 1, Adapters: []placement.Adapter{{Name: "x", Source: "s/x"}}})
	w.deploy(placement.Deployment{Name: "c"})
	tb := BuildTable(w.snapshot(), t0)
	if dep, ok := tb.adapter("x"); !ok || dep != "a" {
		t.Errorf("x: %q %v, want a's (a sorts before b)", dep, ok)
	}
	if _, ok := tb.adapter("c"); ok {
		t.Error("c names a deployment, yet resolved as an adapter")
	}
	if e, _, err := tb.resolve("c"); err != nil || e.Name != "c" {
		t.Errorf("c resolved to %+v, %v", e, err)
	}
}

// The adapter affinity, as llm-d's scorer orders it: active in a slot,
// then a free slot, then waiting, then full; no reading in between.
func TestLoRAScore(t *testing.T) {
	full := &load.LoRA{Max: 2, Running: []string{"a", "b"}, Waiting: []string{"c"}}
	for _, tc := range []struct {
		l    *load.LoRA
		a    string
		want int
	}{
		{full, "a", loraActive},
		{&load.LoRA{Max: 2, Running: []string{"a"}}, "x", loraFree},
		{nil, "x", loraUnknown},
		{full, "c", loraWaiting},
		{full, "x", loraFull},
	} {
		if got := loraScore(tc.l, tc.a); got != tc.want {
			t.Errorf("%+v, %s: %d, want %d", tc.l, tc.a, got, tc.want)
		}
	}
}

// Among the replicas that list it, the one where the adapter is active
// gets the request.
func TestAdapterPrefersItsActiveReplica(t *testing.T) {
	u1, u2 := newUpstream(t, chatOK), newUpstream(t, chatOK)
	h := newHarness(t, Config{}, loraWorld("vllm", u1.URL, u2.URL).snapshot())
	rt := h.gw.routing.Load()
	for _, lr := range rt.routes["chat"] {
		if lr.Node == "n1" {
			lr.rep.lora.Store(&load.LoRA{Max: 1, Running: []string{"sql"}})
		} else {
			lr.rep.lora.Store(&load.LoRA{Max: 1, Running: []string{"code"}})
		}
	}
	for range 6 {
		if a := h.post("/v1/chat/completions", chatBody("sql", false)); a.status != 200 {
			t.Fatalf("sql: %d %s", a.status, a.body)
		}
	}
	if u1.hits.Load() != 6 {
		t.Errorf("sql active on n1, full with code on n2: n1 got %d of 6", u1.hits.Load())
	}
}

// /v1/models lists each adapter a ready replica lists, with its
// deployment as parent.
func TestModelsListAdapters(t *testing.T) {
	u1, u2 := newUpstream(t, chatOK), newUpstream(t, chatOK)
	h := newHarness(t, Config{}, loraWorld("vllm", u1.URL, u2.URL).snapshot())
	a := h.do(t.Context(), http.MethodGet, "/v1/models", "")
	var list struct {
		Data []modelCard `json:"data"`
	}
	if err := json.Unmarshal([]byte(a.body), &list); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range list.Data {
		got = append(got, c.ID+"<"+c.Parent+">"+c.Root)
	}
	if want := "chat<>org/chat code<chat>a/code sql<chat>a/sql"; strings.Join(got, " ") != want {
		t.Errorf("models %v, want %s (late is listed by no replica)", got, want)
	}
}

// Cache blocks are per adapter: one prompt has another prefix key under
// another adapter.
func TestPrefixKeyIncludesTheAdapter(t *testing.T) {
	body := []byte(`{"model":"x","messages":[{"role":"system","content":"` + strings.Repeat("you are a helpful assistant ", 20) + `"},{"role":"user","content":"hi"}]}`)
	keyOf := func(adapter string) uint64 {
		r := &Request{Body: body, Adapter: adapter, ep: chatEndpoint}
		k, ok := r.PrefixKey(4096)
		if !ok {
			t.Fatal("no prefix key")
		}
		return k
	}
	if keyOf("") == keyOf("sql") || keyOf("sql") == keyOf("code") {
		t.Error("the adapter does not change the prefix key")
	}
}

// The per-key metrics carry the adapter, and at most maxAdapterLabels
// names of it.
func TestAdapterLabelsAreBounded(t *testing.T) {
	var s labelSet
	if s.label("") != "" || s.label("sql") != "sql" {
		t.Fatal("the deployment's empty label or a first adapter's name changed")
	}
	for i := range maxAdapterLabels + 10 {
		s.label(fmt.Sprintf("a%d", i))
	}
	if got := s.label("sql"); got != "sql" {
		t.Errorf("a name seen early: %q", got)
	}
	if got := s.label("late-comer"); got != "other" {
		t.Errorf("a name past the bound: %q, want other", got)
	}
}

// llama.cpp loads a deployment's adapters at start, numbered in the
// spec's order: a request for one is sent as the deployment's model with
// that adapter on, by its index, for this request alone.
func TestLlamaCppAdapterByIndex(t *testing.T) {
	u := newUpstream(t, chatOK)
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat", Engine: "llamacpp", Adapters: []placement.Adapter{{Name: "sql", Source: "/a/sql.gguf"}, {Name: "code", Source: "/a/code.gguf"}}})
	w.node("n1", gossip.StateAlive)
	w.hold(cp{dep: "chat", node: "n1", url: u.URL, adapters: []string{"sql", "code"}})
	h := newHarness(t, Config{}, w.snapshot())
	if a := h.post("/v1/chat/completions", chatBody("code", false)); a.status != 200 {
		t.Fatalf("code: %d %s", a.status, a.body)
	}
	var sent struct {
		Model string `json:"model"`
		LoRA  []struct {
			ID    int     `json:"id"`
			Scale float64 `json:"scale"`
		} `json:"lora"`
	}
	if err := json.Unmarshal(u.lastBody(), &sent); err != nil {
		t.Fatal(err)
	}
	if sent.Model != "chat" || len(sent.LoRA) != 1 || sent.LoRA[0].ID != 1 || sent.LoRA[0].Scale != 1 {
		t.Errorf("llama.cpp was sent model %q and lora %+v, want chat and [{1 1}]", sent.Model, sent.LoRA)
	}
	if a := h.post("/v1/chat/completions", chatBody("chat", false)); a.status != 200 || strings.Contains(string(u.lastBody()), `"lora"`) {
		t.Errorf("the base model: %d, sent %s", a.status, u.lastBody())
	}
}
