package fakeengine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
)

// adapterDir makes an adapter's directory, with an adapter_config.json of
// rank r when r > 0.
func adapterDir(t *testing.T, r int) string {
	t.Helper()
	dir := t.TempDir()
	if r > 0 {
		if err := os.WriteFile(filepath.Join(dir, "adapter_config.json"), fmt.Appendf(nil, `{"r": %d, "lora_alpha": 16}`, r), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// errorBody is vLLM's error shape.
func errorBody(t *testing.T, body string) (msg, typ string, code int) {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	return e.Error.Message, e.Error.Type, e.Error.Code
}

type card struct {
	ID          string  `json:"id"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen *int    `json:"max_model_len"`
}

func modelCards(t *testing.T, base string) []card {
	t.Helper()
	code, body := get(t, base+"/v1/models")
	if code != 200 {
		t.Fatalf("/v1/models = %d %s", code, body)
	}
	var list struct {
		Data []card `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	return list.Data
}

// The runtime endpoints load, list and unload as vLLM's
// OpenAIServingModels does, with its answers and error messages.
func TestVLLMLoRALoadListUnload(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "base", EnableLoRA: true, RuntimeLoRA: true, MaxLoRAs: 2})
	a1, wide := adapterDir(t, 8), adapterDir(t, 32)
	missing := filepath.Join(t.TempDir(), "nope")

	code, hdr, body := post(t, ts.URL+"/v1/load_lora_adapter", fmt.Sprintf(`{"lora_name":"a1","lora_path":%q}`, a1))
	if code != 200 || body != "Success: LoRA adapter 'a1' added successfully." || hdr.Get("Content-Type") != "" {
		t.Fatalf("load = %d %q (content type %q)", code, body, hdr.Get("Content-Type"))
	}
	for _, tc := range []struct {
		body        string
		code        int
		typ, msg    string
		wantMessage string
	}{
		{body: fmt.Sprintf(`{"lora_name":"a1","lora_path":%q}`, a1), code: 400, typ: "InvalidUserInput",
			msg: "The lora adapter 'a1' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True."},
		{body: `{"lora_name":"a2"}`, code: 400, typ: "InvalidUserInput", msg: "Both 'lora_name' and 'lora_path' must be provided."},
		{body: fmt.Sprintf(`{"lora_name":"a2","lora_path":%q}`, missing), code: 404, typ: "NotFoundError",
			msg: "Loading lora a2 failed: No adapter found for " + missing},
		{body: fmt.Sprintf(`{"lora_name":"a3","lora_path":%q}`, wide), code: 500, typ: "InternalServerError",
			msg: "Call to add_lora method failed: LoRA rank 32 is greater than max_lora_rank 16."},
	} {
		code, _, body := post(t, ts.URL+"/v1/load_lora_adapter", tc.body)
		msg, typ, c := errorBody(t, body)
		if code != tc.code || c != tc.code || typ != tc.typ || msg != tc.msg {
			t.Errorf("load %s = %d %s %d %q, want %d %s %q", tc.body, code, typ, c, msg, tc.code, tc.typ, tc.msg)
		}
	}
	// In place: the same name, a new path.
	a1b := adapterDir(t, 0)
	if code, _, body := post(t, ts.URL+"/v1/load_lora_adapter", fmt.Sprintf(`{"lora_name":"a1","lora_path":%q,"load_inplace":true}`, a1b)); code != 200 {
		t.Fatalf("load in place = %d %s", code, body)
	}

	cards := modelCards(t, ts.URL)
	if len(cards) != 2 || cards[0].ID != "base" || cards[0].Parent != nil || cards[0].MaxModelLen == nil {
		t.Fatalf("models = %+v, want the base then a1", cards)
	}
	if c := cards[1]; c.ID != "a1" || c.Root != a1b || c.Parent == nil || *c.Parent != "base" || c.MaxModelLen != nil {
		t.Errorf("adapter card = %+v, want id a1, root %s, parent base, max_model_len null", c, a1b)
	}

	code, _, body = post(t, ts.URL+"/v1/unload_lora_adapter", `{"lora_name":"zz"}`)
	if msg, typ, _ := errorBody(t, body); code != 404 || typ != "NotFoundError" || msg != "The lora adapter 'zz' cannot be found." {
		t.Errorf("unload unknown = %d %s %q", code, typ, msg)
	}
	code, _, body = post(t, ts.URL+"/v1/unload_lora_adapter", `{}`)
	if msg, _, _ := errorBody(t, body); code != 400 || msg != "'lora_name' needs to be provided to unload a LoRA adapter." {
		t.Errorf("unload without a name = %d %q", code, msg)
	}
	code, _, body = post(t, ts.URL+"/v1/unload_lora_adapter", `{"lora_name":"a1"}`)
	if code != 200 || body != "Success: LoRA adapter 'a1' removed successfully." {
		t.Errorf("unload = %d %q", code, body)
	}
	if cards := modelCards(t, ts.URL); len(cards) != 1 {
		t.Errorf("models after unload = %+v, want the base alone", cards)
	}
}

// vLLM mounts the runtime endpoints only with
// VLLM_ALLOW_RUNTIME_LORA_UPDATING, refuses a load without --enable-lora,
// and its key guards them as every /v1 path.
func TestVLLMRuntimeLoRAEndpointsNeedTheVariable(t *testing.T) {
	dir := adapterDir(t, 0)
	load := fmt.Sprintf(`{"lora_name":"a1","lora_path":%q}`, dir)
	for _, env := range []string{"", "0", "yes"} {
		cfg, _, err := ParseCommandLine(PersonalityVLLM, []string{"serve", "base", "--enable-lora"}, func(k string) string {
			return map[string]string{EnvVLLMRuntimeLoRA: env}[k]
		})
		if err != nil {
			t.Fatal(err)
		}
		ts, _ := newTestServer(t, cfg)
		if code, _, _ := post(t, ts.URL+"/v1/load_lora_adapter", load); code != 404 {
			t.Errorf("%s=%q: load = %d, want 404 (no such route)", EnvVLLMRuntimeLoRA, env, code)
		}
	}
	cfg, _, err := ParseCommandLine(PersonalityVLLM, []string{"serve", "base", "--enable-lora", "--api-key", "k"}, func(k string) string {
		return map[string]string{EnvVLLMRuntimeLoRA: "True"}[k]
	})
	if err != nil || !cfg.RuntimeLoRA {
		t.Fatalf("ParseCommandLine = %+v, %v: want RuntimeLoRA", cfg, err)
	}
	cfg.HealthDelayPerRunning = time.Nanosecond
	ts, _ := newTestServer(t, cfg)
	if code, _ := do(t, "POST", ts.URL+"/v1/load_lora_adapter", "", load); code != 401 {
		t.Errorf("load without the key = %d, want 401", code)
	}
	if code, body := do(t, "POST", ts.URL+"/v1/load_lora_adapter", "Bearer k", load); code != 200 {
		t.Errorf("load with the key = %d %s", code, body)
	}

	ts, _ = newTestServer(t, Config{Model: "base", RuntimeLoRA: true})
	code, _, body := post(t, ts.URL+"/v1/load_lora_adapter", load)
	if msg, _, _ := errorBody(t, body); code != 500 || msg != "Call to add_lora method failed: LoRA is not enabled. Use --enable-lora to enable LoRA." {
		t.Errorf("load without --enable-lora = %d %q", code, msg)
	}
	// A static adapter without --enable-lora stops vLLM at start.
	if _, err := NewServer(Config{Model: "base", LoRAModules: []LoRAModule{{Name: "a1", Path: dir}}}); err == nil || !strings.Contains(err.Error(), "LoRA is not enabled") {
		t.Errorf("NewServer with --lora-modules and no --enable-lora = %v", err)
	}
}

func chatAs(t *testing.T, base, model, extra string) (int, string, string) {
	t.Helper()
	code, _, body := post(t, base+"/v1/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]%s}`, model, extra))
	if code != 200 {
		return code, "", body
	}
	var r struct {
		Model   string `json:"model"`
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || len(r.Choices) != 1 {
		t.Fatalf("chat body %q: %v", body, err)
	}
	return code, r.Model, r.Choices[0].Message.Content
}

// A request naming an adapter is answered as it: the model field is the
// adapter's name and the content names it; the base model's answer is
// unchanged, and an unknown name stays vLLM's 404.
func TestVLLMAnswersAsTheAdapter(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "base", EnableLoRA: true, LoRAModules: []LoRAModule{{Name: "a1", Path: adapterDir(t, 16)}}})
	if code, model, content := chatAs(t, ts.URL, "a1", ""); code != 200 || model != "a1" || content != "fake base [adapter a1] reply: hi" {
		t.Errorf("chat as a1 = %d model %q content %q", code, model, content)
	}
	if code, model, content := chatAs(t, ts.URL, "base", ""); code != 200 || model != "base" || content != "fake base reply: hi" {
		t.Errorf("chat as base = %d model %q content %q", code, model, content)
	}
	code, _, body := post(t, ts.URL+"/v1/completions", `{"model":"a1","prompt":"yo","stream":true}`)
	if code != 200 || !strings.Contains(body, `"model":"a1"`) || !strings.Contains(body, "[adapter") {
		t.Errorf("streamed completion as a1 = %d %s", code, body)
	}
	code, _, body = post(t, ts.URL+"/v1/chat/completions", `{"model":"a2","messages":[{"role":"user","content":"hi"}]}`)
	if msg, typ, _ := errorBody(t, body); code != 404 || typ != "NotFoundError" || msg != "The model `a2` does not exist." {
		t.Errorf("chat as an unknown adapter = %d %s %q", code, typ, msg)
	}
}

// loraSeries is the vllm:lora_requests_info series: labels to value.
func loraSeries(t *testing.T, base string) map[[3]string]float64 {
	t.Helper()
	out := map[[3]string]float64{}
	f, ok := scrape(t, base)[MetricLoRAInfo]
	if !ok {
		return out
	}
	for _, m := range f.GetMetric() {
		var k [3]string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "max_lora":
				k[0] = l.GetValue()
			case "running_lora_adapters":
				k[1] = l.GetValue()
			case "waiting_lora_adapters":
				k[2] = l.GetValue()
			}
		}
		out[k] = m.GetGauge().GetValue()
	}
	return out
}

// latest is the series a reader takes: the largest value.
func latest(series map[[3]string]float64) ([3]string, float64) {
	var best [3]string
	bv := -1.0
	for k, v := range series {
		if v > bv {
			best, bv = k, v
		}
	}
	return best, bv
}

// At most --max-loras distinct adapters run at once: a request on another
// adapter waits while the base model and the running adapter pass it, as
// vLLM's scheduler skips it; the gauge shows it, under newer vLLM's labels
// (every adapter with a request, in both) and older vLLM's (split).
func TestMaxLoRAsRunningOthersWait(t *testing.T) {
	for _, split := range []bool{false, true} {
		t.Run(fmt.Sprintf("split=%v", split), func(t *testing.T) {
			var tick atomic.Int64
			start := time.Unix(1_700_000_000, 0)
			now := func() time.Time { return start.Add(time.Duration(tick.Add(1)) * time.Millisecond) }
			ts, _ := newTestServer(t, Config{
				Model: "base", EnableLoRA: true, MaxLoRAs: 1, TokenDelay: time.Hour, Now: now, LoRAInfoSplit: split,
				LoRAModules: []LoRAModule{{Name: "a1", Path: adapterDir(t, 0)}, {Name: "a2", Path: adapterDir(t, 0)}},
			})
			if s := loraSeries(t, ts.URL); len(s) != 0 {
				t.Fatalf("lora gauge before any request = %v, want no series", s)
			}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			send := func(model string) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions", strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"x","max_tokens":3}`, model)))
					if resp, err := http.DefaultClient.Do(req); err == nil {
						resp.Body.Close()
					}
				}()
			}
			until := func(what string, running, waiting float64) {
				testwait.Until(t, 10*time.Second, what, func() (bool, string) {
					fams := scrape(t, ts.URL)
					r, w := value(t, fams, MetricRunning, "base"), value(t, fams, MetricWaiting, "base")
					return r == running && w == waiting, fmt.Sprintf("running %v waiting %v, want %v %v", r, w, running, waiting)
				})
			}
			defer func() { cancel(); wg.Wait() }()
			send("a1")
			until("a1 runs", 1, 0)
			send("a2")
			until("a2 waits: a second adapter is one too many", 1, 1)
			send("base")
			until("the base model passes a2", 2, 1)
			send("a1")
			until("a1's second request passes a2", 3, 1)

			got, _ := latest(loraSeries(t, ts.URL))
			want := [3]string{"1", "a1,a2", "a1,a2"}
			if split {
				want = [3]string{"1", "a1", "a2"}
			}
			if got != want {
				t.Errorf("latest lora_requests_info {max_lora, running, waiting} = %q, want %q", got, want)
			}
			cancel()
			wg.Wait()
			until("all gone", 0, 0)
			got, v := latest(loraSeries(t, ts.URL))
			if got != [3]string{"1", "", ""} || v < float64(start.Unix()) {
				t.Errorf("latest series when idle = %q at %v, want empty labels at a time after the start", got, v)
			}
		})
	}
}

// vLLM's LoRA flags map onto the Config; --max-lora-rank takes vLLM's
// choices only.
func TestVLLMLoRAFlags(t *testing.T) {
	cfg, _, err := ParseCommandLine(PersonalityVLLM, []string{"serve", "base", "--enable-lora", "--max-loras", "4",
		"--max-lora-rank=64", "--max_cpu_loras", "8", "--lora-modules", "a=/x", `{"name":"b","path":"/y","base_model_name":"base"}`}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	want := []LoRAModule{{Name: "a", Path: "/x"}, {Name: "b", Path: "/y", BaseModelName: "base"}}
	if !cfg.EnableLoRA || cfg.MaxLoRAs != 4 || cfg.MaxLoRARank != 64 || cfg.MaxCPULoRAs != 8 || fmt.Sprint(cfg.LoRAModules) != fmt.Sprint(want) || cfg.RuntimeLoRA {
		t.Errorf("cfg = %+v", cfg)
	}
	for _, args := range [][]string{
		{"--max-lora-rank", "24"},
		{"--lora-modules", "{not json"},
		{"--max-loras", "0"},
	} {
		_, _, err := ParseCommandLine(PersonalityVLLM, append([]string{"serve", "base", "--enable-lora"}, args...), func(string) string { return "" })
		var ce *CommandLineError
		if !errors.As(err, &ce) || ce.Flag != args[0] {
			t.Errorf("%v: err = %v, want a CommandLineError on %s", args, err, args[0])
		}
	}
	if _, err := NewServer(Config{Model: "m", EnableLoRA: true, MaxLoRAs: 4, MaxCPULoRAs: 2}); err == nil {
		t.Error("max_cpu_loras below max_loras accepted")
	}
}

// SGLang: --lora-paths loads at start, the request names the adapter as
// model "BASE:ADAPTER" or lora_path and is answered under the model it
// sent, and a load past --max-loaded-loras is refused with SGLang's
// message.
func TestSGLangLoRA(t *testing.T) {
	a1, a2 := adapterDir(t, 0), adapterDir(t, 0)
	cfg, _, err := ParseCommandLine(PersonalitySGLang, []string{"--model-path", "org/base", "--served-model-name", "base",
		"--max-loras-per-batch", "1", "--max-loaded-loras", "1", "--lora-target-modules", "all", "--lora-paths", "a1=" + a1}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.EnableLoRA || cfg.MaxLoRAs != 1 || cfg.MaxLoadedLoRAs != 1 {
		t.Fatalf("cfg = %+v: want LoRA on by --lora-paths", cfg)
	}
	cfg.SGLangCheapHealth = true
	ts, _ := newTestServer(t, cfg)

	if code, model, content := chatAs(t, ts.URL, "base:a1", ""); code != 200 || model != "base:a1" || content != "fake base [adapter a1] reply: hi" {
		t.Errorf("chat as base:a1 = %d model %q content %q", code, model, content)
	}
	if code, model, content := chatAs(t, ts.URL, "base", `,"lora_path":"a1"`); code != 200 || model != "base" || !strings.Contains(content, "[adapter a1]") {
		t.Errorf("chat with lora_path a1 = %d model %q content %q", code, model, content)
	}
	code, _, body := chatAs(t, ts.URL, "base:zz", "")
	if msg, _, _ := errorBody(t, body); code != 400 || msg != "The following requested LoRA adapters are not loaded: zz\nLoaded adapters: odict_keys(['a1'])." {
		t.Errorf("chat as base:zz = %d %q", code, msg)
	}

	type result struct {
		Success        bool              `json:"success"`
		ErrorMessage   *string           `json:"error_message"`
		LoadedAdapters map[string]string `json:"loaded_adapters"`
	}
	call := func(path, body string) (int, result) {
		code, _, b := post(t, ts.URL+path, body)
		var r result
		if err := json.Unmarshal([]byte(b), &r); err != nil {
			t.Fatalf("%s: %q: %v", path, b, err)
		}
		return code, r
	}
	code, r := call("/load_lora_adapter", fmt.Sprintf(`{"lora_name":"a2","lora_path":%q}`, a2))
	wantMsg := fmt.Sprintf("Cannot load LoRA adapter a2 at path %s. Maximum number of loaded LoRA adapters is 1. Please unload some LoRA adapters before loading new ones.", a2)
	if code != 400 || r.Success || r.ErrorMessage == nil || *r.ErrorMessage != wantMsg {
		t.Errorf("load past the cap = %d %+v", code, r)
	}
	code, r = call("/unload_lora_adapter", `{"lora_name":"a1"}`)
	if code != 200 || !r.Success || r.ErrorMessage != nil || len(r.LoadedAdapters) != 0 {
		t.Errorf("unload a1 = %d %+v", code, r)
	}
	code, r = call("/load_lora_adapter", fmt.Sprintf(`{"lora_name":"a2","lora_path":%q}`, a2))
	if code != 200 || !r.Success || r.LoadedAdapters["a2"] != a2 {
		t.Errorf("load a2 after the unload = %d %+v", code, r)
	}
	code, r = call("/unload_lora_adapter", `{"lora_name":"a1"}`)
	if code != 400 || r.ErrorMessage == nil || *r.ErrorMessage != "LoRA with name a1 does not exist. Loaded LoRAs: odict_keys(['a2'])" {
		t.Errorf("unload a1 twice = %d %+v", code, r)
	}
	cards := modelCards(t, ts.URL)
	if len(cards) != 2 || cards[1].ID != "a2" || cards[1].Root != a2 || cards[1].Parent == nil || *cards[1].Parent != "base" {
		t.Errorf("models = %+v", cards)
	}
	// SGLang exports no vLLM LoRA gauge.
	cfg.NoMetrics = false
	ts, _ = newTestServer(t, cfg)
	if _, ok := scrape(t, ts.URL)[MetricLoRAInfo]; ok {
		t.Error("sglang exports vllm:lora_requests_info")
	}
}

// The plain fake takes the same LoRA flags as `vllm serve`, through
// `llmgw engine fake` (MainForTests's flag set).
func TestPlainFakeLoRAFlagsParse(t *testing.T) {
	m, err := ParseLoRAModule("a=/x")
	if err != nil || m != (LoRAModule{Name: "a", Path: "/x"}) {
		t.Fatalf("ParseLoRAModule = %+v, %v", m, err)
	}
	if _, err := ParseLoRAModule("a=/x=y"); err == nil {
		t.Error("a=/x=y accepted")
	}
}

// SGLang serves a model whose name has a colon (qwen:7b) as itself: the
// base:adapter reading applies only to a name that is not the served one.
func TestSGLangServesAColonName(t *testing.T) {
	s, err := NewServer(Config{Model: "qwen:7b", Personality: PersonalitySGLang, SGLangCheapHealth: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if adapter, as, fail := s.resolveModel("qwen:7b", ""); fail != nil || adapter != "" || as != "qwen:7b" {
		t.Errorf("qwen:7b: adapter %q, answered as %q, failure %+v", adapter, as, fail)
	}
}
