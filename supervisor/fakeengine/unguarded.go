package fakeengine

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
)

// vLLM serves more inference than its /v1 routes: SageMaker's
// /invocations (vllm/entrypoints/sagemaker/api_router.py, mounted by
// vllm/entrypoints/openai/api_server.py), the pooling routes /pooling,
// /classify, /score and /rerank, and /tokenize and /detokenize (the serve
// routers). Its AuthenticationMiddleware guards only paths that start with
// /v1 (`if not url_path.startswith("/v1"): return await call_next(request)`;
// vllm issue #58144 and vLLM's security docs), so with --api-key set these
// still answer anyone who reaches the port, and run the model. The fake
// serves them under the vllm personality and the plain fake, unguarded as
// Personality.guarded already decides, so a test can prove that llmgw keeps
// them out of other hosts' reach. SGLang and llama.cpp do not get them.
func (s *Server) handleUnguardedVLLM() {
	s.mux.HandleFunc("/invocations", s.invocations)
	s.mux.HandleFunc("/pooling", s.pooling)
	s.mux.HandleFunc("/score", s.score)
	// /v1/score and /v1/rerank are the same handlers behind the key (they
	// start with /v1).
	s.mux.HandleFunc("/v1/score", s.score)
	s.mux.HandleFunc("/rerank", s.rerank)
	s.mux.HandleFunc("/v1/rerank", s.rerank)
	s.mux.HandleFunc("/tokenize", s.tokenize)
	s.mux.HandleFunc("/detokenize", s.detokenize)
}

// invocations is vLLM's SageMaker route: the body's shape chooses the
// handler. vLLM (the /invocations route in
// vllm/entrypoints/openai/api_server.py, vllm/entrypoints/sagemaker/routes.py
// in newer releases: INVOCATION_VALIDATORS, each tried with
// validate_python, else "Cannot find suitable handler for request")
// validates the body against each request type in turn
// (chat completions, completions, then the pooling types, embeddings
// first) and hands it to the first that fits; the fake tells them apart by
// the field each requires: messages, prompt, input. The body is read once
// and offered again to the chosen handler, which then answers exactly as
// on its own path (streaming, usage, metrics and errors included).
func (s *Server) invocations(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "use POST", badRequest, "")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "reading the body: "+err.Error(), badRequest, "")
		return
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) || errors.Is(err, io.ErrUnexpectedEOF) || len(bytes.TrimSpace(body)) == 0 {
			// vLLM: HTTPException(400, "JSON decode error: ...").
			writeError(w, http.StatusBadRequest, "JSON decode error: "+err.Error(), badRequest, "")
			return
		}
		fields = nil // valid JSON, but not an object: no request type fits
	}
	has := func(k string) bool { v, ok := fields[k]; return ok && string(v) != "null" }
	var handler http.HandlerFunc
	switch {
	case has("messages"):
		handler = s.chat
	case has("prompt"):
		handler = s.completions
	case has("input"):
		handler = s.embeddings
	default:
		writeError(w, http.StatusBadRequest,
			"Cannot find suitable handler for request. Expected one of: ['ChatCompletionRequest', 'CompletionRequest', 'EmbeddingRequest']",
			badRequest, "")
		return
	}
	again := r.Clone(r.Context())
	again.Body = io.NopCloser(bytes.NewReader(body))
	again.ContentLength = int64(len(body))
	handler(w, again)
}

// poolingRequest is vLLM's PoolingCompletionRequest, as far as the fake
// reads it.
type poolingRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
}

// pooling is vLLM's /pooling: the pooler's raw output per input. The fake's
// pooler is its embedding, so the vectors are those of /v1/embeddings, in
// vLLM's PoolingResponse shape ("object": "pooling", the vector in "data").
func (s *Server) pooling(w http.ResponseWriter, r *http.Request) {
	var req poolingRequest
	if !s.decode(w, r, &req, func() string { return req.Model }) {
		return
	}
	s.writeVectors(w, r, req.Input, req.EncodingFormat, "pool", "pooling", "data")
}

// scoreRequest is vLLM's ScoreRequest: text_1 and text_2 are each a string
// or a list of strings.
type scoreRequest struct {
	Model string          `json:"model"`
	Text1 json.RawMessage `json:"text_1"`
	Text2 json.RawMessage `json:"text_2"`
}

// score is vLLM's /score (and /v1/score): one score per pair, text_1 paired
// with every text_2 when it is one text, else item by item. The fake
// scores as an embedding model served for scoring does: the cosine of the
// two embeddings (the dot product, as embed's vectors have unit length).
func (s *Server) score(w http.ResponseWriter, r *http.Request) {
	var req scoreRequest
	if !s.decode(w, r, &req, func() string { return req.Model }) {
		return
	}
	left, err := texts(req.Text1)
	if err != nil {
		writeError(w, http.StatusBadRequest, "text_1: "+err.Error(), badRequest, "text_1")
		return
	}
	right, err := texts(req.Text2)
	if err != nil {
		writeError(w, http.StatusBadRequest, "text_2: "+err.Error(), badRequest, "text_2")
		return
	}
	if len(left) == 1 {
		for len(left) < len(right) {
			left = append(left, left[0])
		}
	}
	if len(left) != len(right) {
		writeError(w, http.StatusBadRequest, "text_1 and text_2 must have the same length, or text_1 a single text", badRequest, "text_2")
		return
	}
	tokens := 0
	for i := range left {
		tokens += textTokens(left[i]) + textTokens(right[i])
	}
	if !s.pool(r, tokens) {
		return
	}
	data := make([]map[string]any, len(left))
	for i := range left {
		data[i] = map[string]any{"index": i, "object": "score", "score": s.similarity(left[i], right[i])}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": s.id("score"), "object": "list", "created": s.now().Unix(), "model": s.cfg.Model,
		"data": data, "usage": usage{PromptTokens: tokens, TotalTokens: tokens},
	})
}

// rerankRequest is vLLM's RerankRequest (Jina's and Cohere's rerank API).
type rerankRequest struct {
	Model     string          `json:"model"`
	Query     string          `json:"query"`
	Documents json.RawMessage `json:"documents"`
	TopN      int             `json:"top_n"`
}

// rerank is vLLM's /rerank (and /v1/rerank): the documents scored against
// the query as /score scores them, best first, cut to top_n (0: all), in
// vLLM's RerankResponse shape.
func (s *Server) rerank(w http.ResponseWriter, r *http.Request) {
	var req rerankRequest
	if !s.decode(w, r, &req, func() string { return req.Model }) {
		return
	}
	docs, err := texts(req.Documents)
	if err != nil {
		writeError(w, http.StatusBadRequest, "documents: "+err.Error(), badRequest, "documents")
		return
	}
	tokens := 0
	for _, d := range docs {
		tokens += textTokens(req.Query) + textTokens(d)
	}
	if !s.pool(r, tokens) {
		return
	}
	type result struct {
		Index          int               `json:"index"`
		Document       map[string]string `json:"document"`
		RelevanceScore float64           `json:"relevance_score"`
	}
	results := make([]result, len(docs))
	for i, d := range docs {
		results[i] = result{Index: i, Document: map[string]string{"text": d}, RelevanceScore: s.similarity(req.Query, d)}
	}
	sort.SliceStable(results, func(i, j int) bool { return results[i].RelevanceScore > results[j].RelevanceScore })
	if req.TopN > 0 && req.TopN < len(results) {
		results = results[:req.TopN]
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": s.id("rerank"), "model": s.cfg.Model, "results": results,
		"usage": map[string]int{"prompt_tokens": tokens, "total_tokens": tokens},
	})
}

// tokenizeRequest is vLLM's TokenizeRequest: a completion's prompt (a
// string) or a chat's messages.
type tokenizeRequest struct {
	Model    string        `json:"model"`
	Prompt   *string       `json:"prompt"`
	Messages []chatMessage `json:"messages"`
}

// tokenize is vLLM's /tokenize, with the fake's tokenizer (model.go): the
// count is the prompt_tokens a completion of the prompt, or a chat of the
// messages, would report. The tokenizer runs outside the engine, so no
// counter moves. Each token id is the token's (at most charsPerToken)
// bytes read as a little-endian number, so /detokenize can invert it; an
// empty prompt is one token, id 0 (BOS).
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if !s.decode(w, r, &req, func() string { return req.Model }) {
		return
	}
	var p prompt
	switch {
	case req.Messages != nil:
		roles, contents := make([]string, len(req.Messages)), make([]string, len(req.Messages))
		for i, m := range req.Messages {
			text, err := contentText(m.Content)
			if err != nil {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("messages[%d].content: %v", i, err), badRequest, "messages")
				return
			}
			roles[i], contents[i] = m.Role, text
		}
		p = chatPrompt(roles, contents)
	case req.Prompt != nil:
		p = textPrompt(*req.Prompt)
	default:
		writeError(w, http.StatusBadRequest, "either prompt or messages is required", badRequest, "prompt")
		return
	}
	ids := make([]uint32, 0, p.tokens())
	for i := 0; i < len(p.data); i += p.perToken {
		var b [4]byte
		copy(b[:], p.data[i:min(i+p.perToken, len(p.data))])
		ids = append(ids, binary.LittleEndian.Uint32(b[:]))
	}
	if len(ids) == 0 {
		ids = append(ids, 0)
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": len(ids), "max_model_len": s.cfg.MaxModelLen, "tokens": ids})
}

type detokenizeRequest struct {
	Model  string  `json:"model"`
	Tokens []int64 `json:"tokens"`
}

// detokenize is vLLM's /detokenize, the inverse of tokenize.
func (s *Server) detokenize(w http.ResponseWriter, r *http.Request) {
	var req detokenizeRequest
	if !s.decode(w, r, &req, func() string { return req.Model }) {
		return
	}
	var b strings.Builder
	for _, id := range req.Tokens {
		if id < 0 || id > 0xFFFFFFFF {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("token id %d is out of vocabulary", id), badRequest, "tokens")
			return
		}
		var t [4]byte
		binary.LittleEndian.PutUint32(t[:], uint32(id))
		b.Write(bytes.TrimRight(t[:], "\x00"))
	}
	writeJSON(w, http.StatusOK, map[string]string{"prompt": b.String()})
}

// pool runs a pooling request of n prompt tokens through the engine model
// as an embedding runs: a prefill alone, queued like any request and
// counted in the prompt tokens, without the prefix cache. False means the
// client left or the engine hung.
func (s *Server) pool(r *http.Request, n int) bool {
	ctx := r.Context()
	q := s.sched.admit(ctx, n)
	if q == nil {
		return false
	}
	defer q.release()
	if !s.step(ctx) {
		return false
	}
	s.m.prompt.Add(float64(n))
	if !s.sleep(ctx, s.prefillTime(n)) {
		return false
	}
	s.outputs.Add(1)
	return true
}

// similarity is the cosine of a's and b's embeddings under the served
// model.
func (s *Server) similarity(a, b string) float64 {
	va, vb := embed(s.cfg.Model, a), embed(s.cfg.Model, b)
	var dot float64
	for i := range va {
		dot += float64(va[i]) * float64(vb[i])
	}
	return dot
}

// texts reads a string or a non-empty list of strings.
func texts(raw json.RawMessage) ([]string, error) {
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err == nil && len(many) > 0 {
		return many, nil
	}
	return nil, errors.New("want a string or a non-empty list of strings")
}
