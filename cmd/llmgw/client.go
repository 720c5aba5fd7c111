package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v3"
)

// clientFlags are shared by every command that talks to a node.
func clientFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "addr", Value: "http://127.0.0.1:7070", Usage: "any node's API address", Sources: cli.EnvVars("LLMGW_ADDR")},
		&cli.StringFlag{Name: "token", Usage: "cluster token for mutating calls and engine logs", Sources: cli.EnvVars("LLMGW_TOKEN")},
		&cli.StringFlag{Name: "token-file", Usage: "file holding the cluster token", Sources: cli.EnvVars("LLMGW_TOKEN_FILE")},
	}
}

// jsonClientFlags are clientFlags plus --json, for commands that print
// something JSON can say (a log is text; logs has no --json).
func jsonClientFlags() []cli.Flag {
	return append(clientFlags(), &cli.BoolFlag{Name: "json", Usage: "print JSON instead of a table"})
}

type client struct {
	base  string
	token string
	http  *http.Client
}

func newClient(c *cli.Command) (*client, error) {
	base := strings.TrimRight(c.String("addr"), "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	tok := c.String("token")
	if tok == "" && c.String("token-file") != "" {
		b, err := os.ReadFile(c.String("token-file"))
		if err != nil {
			return nil, usageError(fmt.Sprintf("--token-file: %v", err))
		}
		tok = strings.TrimSpace(string(b))
	}
	return &client{base: base, token: tok, http: &http.Client{Timeout: 30 * time.Second}}, nil
}

// request builds a request to path on the node, with the token when the
// client has one: every call that needs it (mutations, MCP, engine logs)
// gets it from here.
func (cl *client) request(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, cl.base+path, body)
	if err != nil {
		return nil, fmt.Errorf("--addr %s: %w", cl.base, err)
	}
	if cl.token != "" {
		req.Header.Set("Authorization", "Bearer "+cl.token)
	}
	return req, nil
}

// do sends a request and decodes a JSON answer into out. A non-2xx answer
// becomes an error carrying the node's message.
func (cl *client) do(ctx context.Context, method, path string, body []byte, contentType string, out any) error {
	req, err := cl.request(ctx, method, path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := cl.http.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach a node at %s (set --addr or LLMGW_ADDR): %w", cl.base, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return apiError(method, path, resp.Status, raw)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// apiError turns a node's error answer ({"error": "..."}) into an error
// that says what the node said.
func apiError(method, path, status string, body []byte) error {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return fmt.Errorf("%s: %s", status, e.Error)
	}
	return fmt.Errorf("%s %s: %s", method, path, status)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
