package fakeengine

import (
	"cmp"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// With an API key, vLLM's inference paths outside /v1 answer without it
// and run the model (the prompt-token counter moves, the answer carries
// choices or data), while /v1 paths, /v1/score included, still answer 401:
// vLLM's AuthenticationMiddleware guards only /v1.
func TestFakeUnguardedVLLMPaths(t *testing.T) {
	for _, p := range []Personality{PersonalityNone, PersonalityVLLM} {
		t.Run(cmp.Or(string(p), "plain"), func(t *testing.T) {
			ts, _ := newTestServer(t, Config{Model: "m1", APIKey: "k", Personality: p})
			prompt := func() float64 { return value(t, scrape(t, ts.URL), MetricPromptTokens, "m1") }
			call := func(path, body string) map[string]any {
				t.Helper()
				before := prompt()
				code, got := do(t, "POST", ts.URL+path, "", body)
				if code != 200 {
					t.Fatalf("POST %s %s without the key = %d %s, want 200", path, body, code, got)
				}
				if after := prompt(); after <= before {
					t.Errorf("POST %s: %s stayed at %v; the model did not run", path, MetricPromptTokens, after)
				}
				var m map[string]any
				if err := json.Unmarshal([]byte(got), &m); err != nil {
					t.Fatalf("POST %s: %v in %s", path, err, got)
				}
				return m
			}

			for _, path := range []string{"/v1/chat/completions", "/v1/score", "/v1/rerank"} {
				if code, body := do(t, "POST", ts.URL+path, "", `{"model":"m1"}`); code != 401 || strings.TrimSpace(body) != `{"error":"Unauthorized"}` {
					t.Errorf("POST %s without the key = %d %s, want vLLM's 401", path, code, body)
				}
			}

			chat := call("/invocations", `{"model":"m1","messages":[{"role":"user","content":"hello there"}]}`)
			if chat["object"] != "chat.completion" || len(chat["choices"].([]any)) != 1 ||
				!strings.Contains(chat["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string), "hello there") {
				t.Errorf("/invocations with messages answered %v, want a chat completion", chat)
			}
			cmpl := call("/invocations", `{"model":"m1","prompt":"once upon a time","max_tokens":3}`)
			if cmpl["object"] != "text_completion" || len(cmpl["choices"].([]any)) != 1 {
				t.Errorf("/invocations with prompt answered %v, want a completion", cmpl)
			}
			emb := call("/invocations", `{"model":"m1","input":"hello world"}`)
			if d := emb["data"].([]any); len(d) != 1 || d[0].(map[string]any)["object"] != "embedding" {
				t.Errorf("/invocations with input answered %v, want an embedding", emb)
			}

			pool := call("/pooling", `{"model":"m1","input":["hello world","bye"]}`)
			if pool["object"] != "list" || !strings.HasPrefix(pool["id"].(string), "pool-") || len(pool["data"].([]any)) != 2 {
				t.Fatalf("/pooling answered %v", pool)
			}
			d0 := pool["data"].([]any)[0].(map[string]any)
			raw, _ := json.Marshal(d0["data"])
			if d0["object"] != "pooling" || d0["index"] != 0.0 {
				t.Errorf("/pooling data[0] = %v", d0)
			}
			code, got := do(t, "POST", ts.URL+"/v1/embeddings", "Bearer k", `{"model":"m1","input":"hello world"}`)
			var want embeddingResponse
			if err := json.Unmarshal([]byte(got), &want); code != 200 || err != nil || len(want.Data) != 1 {
				t.Fatalf("/v1/embeddings with the key = %d %s", code, got)
			}
			if got, w := floats(t, raw), floats(t, want.Data[0].Embedding); len(got) != EmbeddingDims || !slices.Equal(got, w) {
				t.Errorf("/pooling vector %v, want the embedding %v", got, w)
			}

			score := call("/score", `{"model":"m1","text_1":"hello world","text_2":["hello world","something else"]}`)
			data := score["data"].([]any)
			if score["object"] != "list" || len(data) != 2 {
				t.Fatalf("/score answered %v", score)
			}
			same, other := data[0].(map[string]any), data[1].(map[string]any)
			if same["object"] != "score" || same["index"] != 0.0 || other["index"] != 1.0 {
				t.Errorf("/score data %v", data)
			}
			if s := same["score"].(float64); math.Abs(s-1) > 1e-5 {
				t.Errorf("a text scored against itself = %v, want 1", s)
			}
			if s := other["score"].(float64); s >= 0.999 || s < -1 {
				t.Errorf("two texts scored %v, want a cosine below 1", s)
			}
			rerank := call("/rerank", `{"model":"m1","query":"hello world","documents":["something else","hello world"],"top_n":1}`)
			if res := rerank["results"].([]any); len(res) != 1 || res[0].(map[string]any)["index"] != 1.0 {
				t.Errorf("/rerank answered %v, want the matching document first and alone", rerank)
			}

			// The tokenizer runs outside the engine: 200 without the key,
			// tokens as the fake counts them, no counter moves.
			before := prompt()
			code, got = do(t, "POST", ts.URL+"/tokenize", "", `{"model":"m1","prompt":"hello world!"}`)
			var tok struct {
				Count       int      `json:"count"`
				MaxModelLen int      `json:"max_model_len"`
				Tokens      []uint32 `json:"tokens"`
			}
			if code != 200 || json.Unmarshal([]byte(got), &tok) != nil || tok.Count != 3 || len(tok.Tokens) != 3 || tok.MaxModelLen != 4096 {
				t.Errorf("/tokenize without the key = %d %s, want 3 tokens of the 4096 the model takes", code, got)
			}
			if after := prompt(); after != before {
				t.Errorf("/tokenize moved %s from %v to %v", MetricPromptTokens, before, after)
			}
			ids, _ := json.Marshal(tok.Tokens)
			if code, got := do(t, "POST", ts.URL+"/detokenize", "", `{"model":"m1","tokens":`+string(ids)+`}`); code != 200 || strings.TrimSpace(got) != `{"prompt":"hello world!"}` {
				t.Errorf("/detokenize of /tokenize's tokens = %d %s", code, got)
			}
			// A chat counts as the chat completion's usage does.
			chatBody := `{"model":"m1","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello there"}]}`
			code, got = do(t, "POST", ts.URL+"/tokenize", "", chatBody)
			if code != 200 || json.Unmarshal([]byte(got), &tok) != nil {
				t.Fatalf("/tokenize of messages = %d %s", code, got)
			}
			used := call("/invocations", chatBody)["usage"].(map[string]any)["prompt_tokens"].(float64)
			if tok.Count != int(used) || len(tok.Tokens) != tok.Count {
				t.Errorf("/tokenize counts %d tokens (%d ids), the chat's usage %v", tok.Count, len(tok.Tokens), used)
			}
		})
	}
}

// /invocations refuses what vLLM refuses: a body no request type fits (400
// in vLLM's error shape), bad JSON (400), an unknown model (404, as the
// chosen handler answers), a GET (405).
func TestFakeInvocationsRefuses(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "m1", APIKey: "k"})
	for _, tc := range []struct {
		method, body, typ, msg string
		want                   int
	}{
		{"POST", `{"model":"m1","text":"x"}`, "BadRequestError", "Cannot find suitable handler for request", 400},
		{"POST", `[1,2]`, "BadRequestError", "Cannot find suitable handler for request", 400},
		{"POST", `{"model":`, "BadRequestError", "JSON decode error", 400},
		{"POST", ``, "BadRequestError", "JSON decode error", 400},
		{"POST", `{"model":"other","messages":[{"role":"user","content":"x"}]}`, "NotFoundError", "The model `other` does not exist.", 404},
		{"POST", `{"model":"other","input":"x"}`, "NotFoundError", "The model `other` does not exist.", 404},
		{"GET", ``, "BadRequestError", "use POST", 405},
	} {
		code, got := do(t, tc.method, ts.URL+"/invocations", "", tc.body)
		var e struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Code    int    `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(got), &e); err != nil || code != tc.want || e.Error.Code != tc.want ||
			e.Error.Type != tc.typ || !strings.Contains(e.Error.Message, tc.msg) {
			t.Errorf("%s /invocations %s = %d %s, want %d %s %q", tc.method, tc.body, code, got, tc.want, tc.typ, tc.msg)
		}
	}
}

// /invocations with "stream": true streams the chat's SSE, as
// /v1/chat/completions does, without the key.
func TestFakeInvocationsStreams(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "m1", APIKey: "k"})
	resp, err := http.Post(ts.URL+"/invocations", "application/json", strings.NewReader(
		`{"model":"m1","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("streamed /invocations = %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	cs := chunks(t, string(b)) // the framing and the final [DONE]
	if len(cs) < 3 || cs[0].Object != "chat.completion.chunk" || cs[0].Choices[0].Delta["role"] != "assistant" {
		t.Fatalf("chunks %+v", cs)
	}
	if last := cs[len(cs)-1]; last.Usage == nil || last.Usage.PromptTokens == 0 {
		t.Errorf("last chunk %+v, want the usage", last)
	}

	// A streamed completion too.
	code, _, body := post(t, ts.URL+"/invocations", `{"model":"m1","prompt":"hi","stream":true}`)
	if code != 200 {
		t.Fatalf("streamed completion: %d %s", code, body)
	}
	if cs := chunks(t, body); len(cs) == 0 || cs[0].Object != "text_completion" {
		t.Errorf("streamed completion chunks %+v", cs)
	}
}

// SGLang and llama.cpp do not serve vLLM's unguarded paths, and their keys
// guard them as any other path (401 without, 404 with the key).
func TestPersonalityNoVLLMUnguardedPaths(t *testing.T) {
	for _, p := range []Personality{PersonalitySGLang, PersonalityLlamaCpp} {
		t.Run(string(p), func(t *testing.T) {
			ts, _ := newTestServer(t, Config{Model: "m1", APIKey: "k", Personality: p})
			for _, path := range []string{"/invocations", "/pooling", "/score", "/tokenize"} {
				if code, body := do(t, "POST", ts.URL+path, "", `{"model":"m1","prompt":"x"}`); code != 401 {
					t.Errorf("POST %s without the key = %d %s, want 401", path, code, body)
				}
				if code, body := do(t, "POST", ts.URL+path, "Bearer k", `{"model":"m1","prompt":"x"}`); code != 404 {
					t.Errorf("POST %s with the key = %d %s, want 404", path, code, body)
				}
			}
		})
	}
}
