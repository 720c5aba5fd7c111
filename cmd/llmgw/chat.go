package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/supervisor/loadgen"
)

// chatCommand streams one chat completion through a node's gateway: the
// operator's smoke test that the cluster answers as its clients see it.
func chatCommand() *cli.Command {
	return &cli.Command{
		Name:      "chat",
		Usage:     "ask a model through a node's gateway and stream the answer",
		ArgsUsage: "MODEL TEXT",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "gateway-addr", Value: "http://127.0.0.1:8000", Usage: "a node's gateway", Sources: cli.EnvVars("LLMGW_GATEWAY_ADDR")},
			&cli.StringFlag{Name: "api-key", Usage: "gateway API key, when the gateway asks for one", Sources: cli.EnvVars("LLMGW_GATEWAY_KEY")},
			renamed("key", "api-key"),
			&cli.IntFlag{Name: "max-tokens", Value: 256, Usage: "most tokens to generate"},
		},
		Action: chat,
	}
}

func chat(ctx context.Context, c *cli.Command) error {
	if c.Args().Len() != 2 {
		return usageError(`MODEL TEXT: name a model (a deployment) and what to ask, e.g. llmgw chat chat "hello"`)
	}
	model, text := c.Args().Get(0), c.Args().Get(1)
	body, _ := json.Marshal(map[string]any{
		"model": model, "stream": true, "max_tokens": c.Int("max-tokens"),
		"messages": []map[string]string{{"role": "user", "content": text}},
	})
	url := strings.TrimRight(c.String("gateway-addr"), "/") + "/v1/chat/completions"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return usageError(fmt.Sprintf("--gateway-addr %q: %v", c.String("gateway-addr"), err))
	}
	req.Header.Set("Content-Type", "application/json")
	if k := c.String("api-key"); k != "" {
		req.Header.Set("Authorization", "Bearer "+k)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return failure(fmt.Sprintf("gateway %s: %v (is a node's gateway there? see --gateway-addr)", c.String("gateway-addr"), err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return failure(fmt.Sprintf("gateway: HTTP %d: %s", resp.StatusCode, openAIError(resp.Body)))
	}
	w := c.Root().Writer
	err = loadgen.ReadEvents(resp.Body, func(data []byte) error {
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			return fmt.Errorf("the gateway sent an event that is not JSON: %.80q", data)
		}
		if ev.Error != nil {
			return fmt.Errorf("the answer broke off: %s", ev.Error.Message)
		}
		for _, ch := range ev.Choices {
			fmt.Fprint(w, ch.Delta.Content)
		}
		return nil
	})
	fmt.Fprintln(w)
	if err != nil {
		return failure(err.Error())
	}
	return nil
}

// openAIError is the message of an OpenAI-shaped error body, or the body.
func openAIError(r io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(r, 64<<10))
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	return strings.TrimSpace(string(b))
}
