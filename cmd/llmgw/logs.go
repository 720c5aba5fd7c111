package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/urfave/cli/v3"
)

func logsCommand() *cli.Command {
	return &cli.Command{
		Name:      "logs",
		Usage:     "print a shard's engine log (any node answers; the node that runs it serves it; needs the token)",
		ArgsUsage: "SHARD",
		Flags: append(clientFlags(),
			&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing new lines"},
			&cli.IntFlag{Name: "tail", Value: 100, Usage: "lines from the end to start with"},
		),
		Action: func(ctx context.Context, c *cli.Command) error {
			if c.Args().Len() != 1 {
				return usageError("SHARD: want exactly one shard id (see llmgw shards)")
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			q := url.Values{"tail": {strconv.Itoa(int(c.Int("tail")))}}
			if c.Bool("follow") {
				q.Set("follow", "1")
			}
			// Engine logs can hold prompts: the node wants the token.
			req, err := cl.request(ctx, "GET", "/v1/shards/"+url.PathEscape(c.Args().First())+"/logs?"+q.Encode(), nil)
			if err != nil {
				return err
			}
			// No client timeout: --follow runs until interrupted.
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("cannot reach a node at %s: %w", cl.base, err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
				return apiError("GET", req.URL.Path, resp.Status, b)
			}
			_, err = io.Copy(c.Root().Writer, resp.Body)
			if ctx.Err() != nil {
				return nil
			}
			return err
		},
	}
}
