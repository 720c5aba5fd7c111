package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// usage is the OpenAI usage object.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// firstByte notes when the first byte of a body arrives.
type firstByte struct {
	r    io.Reader
	now  func() time.Duration
	seen bool
	at   time.Duration
}

func (f *firstByte) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if n > 0 && !f.seen {
		f.seen, f.at = true, f.now()
	}
	return n, err
}

// send makes request i and measures it.
func (cfg *Config) send(ctx context.Context, i int) result {
	body, err := json.Marshal(cfg.requestBody(i))
	if err != nil {
		return result{kind: "bad request"}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.URL+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return result{kind: "bad request"}
	}
	req.Header.Set("Content-Type", "application/json")
	if cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.APIKey)
	}
	start := cfg.Now()
	since := func() time.Duration { return cfg.Now().Sub(start) }
	resp, err := cfg.Client.Do(req)
	if err != nil {
		return result{kind: errKind(ctx)}
	}
	defer resp.Body.Close()
	r := result{replica: resp.Header.Get(ReplicaHeader)}
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		r.kind = httpKind(resp.StatusCode)
		return r
	}
	fb := &firstByte{r: resp.Body, now: since}
	var u usage
	if cfg.Stream {
		r.kind = readStream(fb, &u, &r.outputTokens)
	} else {
		r.kind = readBody(fb, &u)
	}
	if r.kind != "" && ctx.Err() != nil {
		r.kind = "canceled"
	}
	r.ttfb, r.latency = fb.at, since()
	if !fb.seen {
		r.ttfb = r.latency
	}
	r.promptTokens = u.PromptTokens
	if u.CompletionTokens > 0 || !cfg.Stream {
		r.outputTokens = u.CompletionTokens
	}
	return r
}

// readBody reads a whole answer; a body cut short is a mid-stream failure
// (the gateway aborts the connection when its engine dies part-way).
func readBody(r io.Reader, u *usage) string {
	b, err := io.ReadAll(r)
	if err != nil {
		return "mid-stream"
	}
	var resp struct {
		Usage *usage `json:"usage"`
	}
	if json.Unmarshal(b, &resp) != nil || resp.Usage == nil {
		return "bad body"
	}
	*u = *resp.Usage
	return ""
}

// ErrNoDone is ReadEvents' answer for a stream that ended without [DONE].
var ErrNoDone = errors.New("the answer ended without [DONE]")

// ReadEvents calls each with the data of every server-sent event of r until
// "[DONE]" (nil) or the end (ErrNoDone, or the read error); an error from
// each stops it and is returned. It is OpenAI's stream framing, shared by
// the load generator and `llmgw chat`.
func ReadEvents(r io.Reader, each func(data []byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			return nil
		}
		if err := each(data); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("the answer broke off: %w", err)
	}
	return ErrNoDone
}

// errKindOf carries a failure kind out of ReadEvents' callback.
type errKindOf string

func (e errKindOf) Error() string { return string(e) }

// readStream reads server-sent events up to [DONE], counting the content
// chunks in case no usage chunk comes. A stream that breaks off, ends
// without [DONE] or carries an error event failed mid-stream.
func readStream(r io.Reader, u *usage, chunks *int) string {
	err := ReadEvents(r, func(data []byte) error {
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *usage           `json:"usage"`
			Error *json.RawMessage `json:"error"`
		}
		if json.Unmarshal(data, &ev) != nil {
			return errKindOf("bad body")
		}
		if ev.Error != nil {
			return errKindOf("mid-stream")
		}
		for _, c := range ev.Choices {
			if c.Delta.Content != "" {
				*chunks++
			}
		}
		if ev.Usage != nil {
			*u = *ev.Usage
		}
		return nil
	})
	var kind errKindOf
	switch {
	case err == nil:
		return ""
	case errors.As(err, &kind):
		return string(kind)
	}
	return "mid-stream"
}
