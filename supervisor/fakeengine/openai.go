package fakeengine

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
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
	Messages            []chatMessage  `json:"messages"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
	MaxTokens           int            `json:"max_tokens"`
	MaxCompletionTokens int            `json:"max_completion_tokens"`
}

type completionRequest struct {
	Model string `json:"model"`
	// Prompt is a string, a list of strings, a list of token ids or a list
	// of lists of token ids.
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	MaxTokens     int             `json:"max_tokens"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// exchange is one request reduced to what the fake needs to answer it.
type exchange struct {
	chat         bool
	prompt       string // text to echo
	promptTokens int
	maxTokens    int
	stream       bool
	includeUsage bool
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if !s.decode(w, r, &req, func() string { return req.Model }) {
		return
	}
	if !streamOptionsOK(w, req.Stream, req.StreamOptions) {
		return
	}
	if len(req.Messages) == 0 {
		writeError(w, http.StatusBadRequest, "messages: at least one message is required", badRequest, "messages")
		return
	}
	ex := exchange{chat: true, stream: req.Stream, maxTokens: req.MaxTokens}
	if req.MaxCompletionTokens > 0 {
		ex.maxTokens = req.MaxCompletionTokens
	}
	ex.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	for i, m := range req.Messages {
		text, err := contentText(m.Content)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("messages[%d].content: %v", i, err), badRequest, "messages")
			return
		}
		ex.promptTokens += len(strings.Fields(text))
		if m.Role == "user" {
			ex.prompt = text
		}
	}
	s.answer(w, r, ex)
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if !s.decode(w, r, &req, func() string { return req.Model }) {
		return
	}
	if !streamOptionsOK(w, req.Stream, req.StreamOptions) {
		return
	}
	text, n, err := promptText(req.Prompt)
	if err != nil {
		writeError(w, http.StatusBadRequest, "prompt: "+err.Error(), badRequest, "prompt")
		return
	}
	s.answer(w, r, exchange{
		prompt: text, promptTokens: n, maxTokens: req.MaxTokens, stream: req.Stream,
		includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
	})
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

// promptText reads a completions prompt and counts its tokens: words for
// text, ids for pre-tokenised prompts.
func promptText(raw json.RawMessage) (string, int, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, len(strings.Fields(s)), nil
	}
	var ss []string
	if err := json.Unmarshal(raw, &ss); err == nil && len(ss) > 0 {
		n := 0
		for _, p := range ss {
			n += len(strings.Fields(p))
		}
		return strings.Join(ss, " "), n, nil
	}
	var ids []int
	if err := json.Unmarshal(raw, &ids); err == nil && len(ids) > 0 {
		return "", len(ids), nil
	}
	var batches [][]int
	if err := json.Unmarshal(raw, &batches); err == nil && len(batches) > 0 {
		n := 0
		for _, b := range batches {
			n += len(b)
		}
		return "", n, nil
	}
	return "", 0, errors.New("want a string, a list of strings or token ids")
}

// answer serves one admitted request and counts its tokens.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, ex exchange) {
	release, ok := s.admit(r)
	if !ok {
		return
	}
	defer release()
	if ex.promptTokens == 0 {
		// An empty prompt still costs the engine a token (BOS).
		ex.promptTokens = 1
	}
	s.m.prompt.Add(float64(ex.promptTokens))
	tokens, finish := s.reply(ex.prompt, ex.maxTokens)
	u := usage{PromptTokens: ex.promptTokens, CompletionTokens: len(tokens), TotalTokens: ex.promptTokens + len(tokens)}
	prefix, object := "cmpl", "text_completion"
	if ex.chat {
		prefix, object = "chatcmpl", "chat.completion"
	}
	id := s.id(prefix)
	created := s.now().Unix()

	if !ex.stream {
		for range tokens {
			if !s.pause(r) {
				return
			}
		}
		s.m.generation.Add(float64(len(tokens)))
		text := strings.Join(tokens, "")
		choice := map[string]any{"index": 0, "finish_reason": finish, "logprobs": nil}
		if ex.chat {
			choice["message"] = map[string]any{"role": "assistant", "content": text}
		} else {
			choice["text"] = text
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"id": id, "object": object, "created": created, "model": s.cfg.Model,
			"choices": []any{choice}, "usage": u,
		})
		return
	}

	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	chunkObject := "text_completion"
	if ex.chat {
		chunkObject = "chat.completion.chunk"
	}
	send := func(choices []any, withUsage bool) bool {
		c := map[string]any{"id": id, "object": chunkObject, "created": created, "model": s.cfg.Model, "choices": choices}
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
	choice := func(delta map[string]any, text string, finish any) []any {
		c := map[string]any{"index": 0, "logprobs": nil, "finish_reason": finish}
		if ex.chat {
			c["delta"] = delta
		} else {
			c["text"] = text
		}
		return []any{c}
	}
	if ex.chat && !send(choice(map[string]any{"role": "assistant", "content": ""}, "", nil), false) {
		return
	}
	for _, t := range tokens {
		if !s.pause(r) {
			return
		}
		if !send(choice(map[string]any{"content": t}, t, nil), false) {
			return
		}
		// Counted as streamed, so an aborted stream counts what it got.
		s.m.generation.Add(1)
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

// pause waits TokenDelay between tokens; false means the client left.
func (s *Server) pause(r *http.Request) bool {
	if s.cfg.TokenDelay <= 0 {
		return true
	}
	t := time.NewTimer(s.cfg.TokenDelay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}
