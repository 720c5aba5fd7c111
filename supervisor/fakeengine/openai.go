package fakeengine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role string `json:"role"`
	// Content is a string or a list of parts ({"type":"text","text":...}).
	Content json.RawMessage `json:"content"`
}

type chatRequest struct {
	Model               string         `json:"model"`
	LoRAPath            string         `json:"lora_path"`
	Messages            []chatMessage  `json:"messages"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
	MaxTokens           int            `json:"max_tokens"`
	MaxCompletionTokens int            `json:"max_completion_tokens"`
	sampling
	disagg
}

// disagg is what a request of a disaggregated pair carries: vLLM's
// kv_transfer_params, or SGLang's bootstrap fields.
type disagg struct {
	KVTransferParams *kvTransferParams `json:"kv_transfer_params"`
	bootstrap
}

// sampling holds vLLM's extra sampling parameters the fake honours.
type sampling struct {
	MinTokens int  `json:"min_tokens"`
	IgnoreEOS bool `json:"ignore_eos"`
}

type completionRequest struct {
	Model    string `json:"model"`
	LoRAPath string `json:"lora_path"`
	// Prompt is a string, a list of strings, a list of token ids or a list
	// of lists of token ids.
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	MaxTokens     int             `json:"max_tokens"`
	sampling
	disagg
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// exchange is one request reduced to what the fake needs to answer it.
type exchange struct {
	chat         bool
	echo         string // text to echo
	prompt       prompt
	maxTokens    int
	minTokens    int
	stream       bool
	includeUsage bool
	// adapter is the LoRA adapter that answers ("" the base model); model
	// is the name the answer carries.
	adapter string
	model   string
	// disagg is the request's part in disaggregation, if any.
	disagg disagg
}

// minTokens is how many tokens the request asks for at least.
func (p sampling) minTokens(maxTokens int) int {
	if p.IgnoreEOS && maxTokens > 0 {
		return maxTokens
	}
	return p.MinTokens
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	var ex exchange
	if !s.decodeAs(w, r, &req, func() (string, string) { return req.Model, req.LoRAPath }, &ex) {
		return
	}
	if !streamOptionsOK(w, req.Stream, req.StreamOptions) {
		return
	}
	if len(req.Messages) == 0 {
		writeError(w, http.StatusBadRequest, "messages: at least one message is required", badRequest, "messages")
		return
	}
	ex.chat, ex.stream, ex.maxTokens = true, req.Stream, req.MaxTokens
	if req.MaxCompletionTokens > 0 {
		ex.maxTokens = req.MaxCompletionTokens
	}
	ex.minTokens = req.sampling.minTokens(ex.maxTokens)
	ex.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	roles, contents := make([]string, len(req.Messages)), make([]string, len(req.Messages))
	for i, m := range req.Messages {
		text, err := contentText(m.Content)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("messages[%d].content: %v", i, err), badRequest, "messages")
			return
		}
		roles[i], contents[i] = m.Role, text
		if m.Role == "user" {
			ex.echo = text
		}
	}
	ex.prompt = chatPrompt(roles, contents)
	ex.disagg = req.disagg
	s.answer(w, r, ex)
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	var ex exchange
	if !s.decodeAs(w, r, &req, func() (string, string) { return req.Model, req.LoRAPath }, &ex) {
		return
	}
	if !streamOptionsOK(w, req.Stream, req.StreamOptions) {
		return
	}
	text, p, err := promptText(req.Prompt)
	if err != nil {
		writeError(w, http.StatusBadRequest, "prompt: "+err.Error(), badRequest, "prompt")
		return
	}
	ex.echo, ex.prompt, ex.maxTokens, ex.minTokens, ex.stream = text, p, req.MaxTokens, req.sampling.minTokens(req.MaxTokens), req.Stream
	ex.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	ex.disagg = req.disagg
	s.answer(w, r, ex)
}

// streamOptionsOK refuses stream_options on a request that does not
// stream, as vLLM does (OpenAI's API allows them only with stream), so a
// gateway that adds them to every request fails here as it would there.
func streamOptionsOK(w http.ResponseWriter, stream bool, opts *streamOptions) bool {
	if opts != nil && !stream {
		writeError(w, http.StatusBadRequest, "Stream options can only be defined when `stream=True`.", badRequest, "stream_options")
		return false
	}
	return true
}

// contentText flattens a chat message's content.
func contentText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("want a string or a list of content parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(p.Text)
		}
	}
	return b.String(), nil
}

// promptText reads a completions prompt: the text to echo and the prompt
// the engine computes. A list of prompts (a batch, to vLLM) is taken as one
// prompt: the fake answers with one choice.
func promptText(raw json.RawMessage) (string, prompt, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, textPrompt(s), nil
	}
	var ss []string
	if err := json.Unmarshal(raw, &ss); err == nil && len(ss) > 0 {
		joined := strings.Join(ss, " ")
		return joined, textPrompt(joined), nil
	}
	var ids []int
	if err := json.Unmarshal(raw, &ids); err == nil && len(ids) > 0 {
		return "", idsPrompt(ids), nil
	}
	var batches [][]int
	if err := json.Unmarshal(raw, &batches); err == nil && len(batches) > 0 {
		return "", idsPrompt(slices.Concat(batches...)), nil
	}
	return "", prompt{}, errors.New("want a string, a list of strings or token ids")
}

// answer runs one request through the engine model: it queues for a place
// in the batch, looks its prompt up in the prefix cache, computes the rest
// (the time to first token), then generates one token per TokenDelay. The
// token counters move as the work is done, so an abandoned request counts
// what it cost.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, ex exchange) {
	ctx := r.Context()
	n := ex.prompt.tokens()
	start := s.now()
	q := s.sched.admitLoRA(ctx, n, ex.adapter)
	if q == nil {
		return
	}
	defer q.release()
	maxTokens, minTokens := ex.maxTokens, ex.minTokens
	if s.cfg.KV.Mode == "prefill" && ex.disagg.given() {
		// An SGLang prefill makes the first token only; the decode
		// makes the answer (mini_lb returns the decode's).
		maxTokens, minTokens = 1, min(minTokens, 1)
	}
	tokens, finish := s.reply(ex.echo, ex.adapter, maxTokens, minTokens)
	u := usage{PromptTokens: n, CompletionTokens: len(tokens), TotalTokens: n + len(tokens)}
	prefix, object := "cmpl", "text_completion"
	if ex.chat {
		prefix, object = "chatcmpl", "chat.completion"
	}
	id := s.requestID(prefix, r)
	created := s.now().Unix()

	var send func(choices []any, withUsage bool) bool
	flusher, _ := w.(http.Flusher)
	if ex.stream {
		// Headers go as soon as the request runs, as vLLM's streaming
		// response starts before its first token.
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		if flusher != nil {
			flusher.Flush()
		}
		chunkObject := "text_completion"
		if ex.chat {
			chunkObject = "chat.completion.chunk"
		}
		send = func(choices []any, withUsage bool) bool {
			c := map[string]any{"id": id, "object": chunkObject, "created": created, "model": ex.model, "choices": choices}
			if withUsage {
				c["usage"] = u
			}
			b, _ := json.Marshal(c)
			if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
				return false
			}
			if flusher != nil {
				flusher.Flush()
			}
			return true
		}
	}
	ok, failMsg := s.computePrompt(ctx, ex, n, start)
	if failMsg != "" {
		// As vLLM's serving layer answers a request the engine finished
		// with an error (GenerateBaseServing._raise_if_error: a
		// GenerationError, 500 "Internal server error"; streamed, one
		// error event, then [DONE]); SGLang aborts it with a 500 too.
		body := map[string]any{"error": map[string]any{"message": failMsg, "type": "InternalServerError", "param": nil, "code": http.StatusInternalServerError}}
		if !ex.stream {
			writeJSON(w, http.StatusInternalServerError, body)
			return
		}
		b, _ := json.Marshal(body)
		_, _ = fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", b)
		if flusher != nil {
			flusher.Flush()
		}
		return
	}
	if !ok {
		return
	}
	var slot *decodeSlot
	defer func() { s.stopDecoding(slot) }()
	choice := func(delta map[string]any, text string, finish any) []any {
		c := map[string]any{"index": 0, "logprobs": nil, "finish_reason": finish}
		if ex.chat {
			c["delta"] = delta
		} else {
			c["text"] = text
		}
		return []any{c}
	}
	// The role comes with the first token, as vLLM sends it.
	if ex.stream && ex.chat && !send(choice(map[string]any{"role": "assistant", "content": ""}, "", nil), false) {
		return
	}
	for i, t := range tokens {
		// Prefill made the first token; each further one is a decode step.
		delay := s.cfg.TokenDelay
		if i == 0 {
			delay = 0
		}
		// Prefills that ran since the last token delay this one
		// (Config.StepInterference).
		delay += s.owed(slot)
		if !s.sleep(ctx, delay) {
			return
		}
		if i == 0 {
			slot = s.startDecoding()
		}
		q.grow(1)
		s.m.generation.Add(1)
		s.outputs.Add(1)
		if ex.stream && !send(choice(map[string]any{"content": t}, t, nil), false) {
			return
		}
	}

	if !ex.stream {
		text := strings.Join(tokens, "")
		c := map[string]any{"index": 0, "finish_reason": finish, "logprobs": nil}
		if ex.chat {
			c["message"] = map[string]any{"role": "assistant", "content": text}
		} else {
			c["text"] = text
		}
		resp := map[string]any{
			"id": id, "object": object, "created": created, "model": ex.model,
			"choices": []any{c}, "usage": u,
		}
		if s.cfg.KV.nixl() {
			// vLLM's answers carry kv_transfer_params at the top level:
			// null, or a prefill leg's params for its decode.
			resp["kv_transfer_params"] = s.prefillParams(id, ex, n, finish)
		}
		writeJSON(w, http.StatusOK, resp)
		return
	}
	if !send(choice(map[string]any{}, "", finish), false) {
		return
	}
	if ex.includeUsage && !send([]any{}, true) {
		return
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

// prefill counts a running prompt of n tokens, finds its cached prefix and
// waits out the computation of the rest; false means the client left. The
// prompt's blocks are cached once computed.
func (s *Server) prefill(ctx context.Context, p prompt, n int) bool {
	if !s.step(ctx) {
		return false
	}
	s.m.prompt.Add(float64(n))
	hit := 0
	defer func() {
		s.m.bySource.WithLabelValues(SourceLocalCompute).Add(float64(n - hit))
		s.m.bySource.WithLabelValues(SourceLocalCacheHit).Add(float64(hit))
	}()
	var hashes []uint64
	if s.cache != nil {
		hashes = p.blockHashes(s.cfg.BlockSize)
		// vLLM always computes a prompt's last token (it yields the first
		// output), so a prompt cached whole still computes its last block.
		hit = s.cache.match(hashes, (n-1)/s.cfg.BlockSize) * s.cfg.BlockSize
		s.m.queries.Add(float64(n))
		s.m.hits.Add(float64(hit))
	}
	s.interfere(n - hit)
	if !s.sleep(ctx, s.prefillTime(n-hit)) {
		return false
	}
	if s.cache != nil {
		s.cache.insert(hashes)
	}
	return true
}

// sleep waits d through Config.Sleep, then takes the engine's next step
// (which a hang blocks); false means ctx ended or the engine is hung. No
// delay does not call Config.Sleep, so the default engine never waits.
func (s *Server) sleep(ctx context.Context, d time.Duration) bool {
	if d > 0 && !s.cfg.Sleep(ctx, d) {
		return false
	}
	return s.step(ctx)
}
