package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/supervisor/loadgen"
)

// benchCommand is a load generator against a node's gateway, in the spirit
// of `vllm bench serve`, so routing policies can be compared on a cluster.
func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "send load to a node's gateway and report throughput, time to first byte, latency and each replica's share",
		Description: "Sends chat completions from a workload: --prompt-file (one prompt per line), the shared-prefix " +
			"workload (--tenants N --system-prompt-tokens T: N tenants with long system prompts, interleaved, each request " +
			"a short question of its own) or, by default, short questions that share nothing. --concurrency keeps that many " +
			"in flight; --rate starts requests as a Poisson process instead (--concurrency then caps them, when given).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "gateway-addr", Value: "http://127.0.0.1:8000", Usage: "a node's gateway", Sources: cli.EnvVars("LLMGW_GATEWAY_ADDR")},
			&cli.StringFlag{Name: "api-key", Usage: "gateway API key, when the gateway asks for one", Sources: cli.EnvVars("LLMGW_GATEWAY_KEY")},
			renamed("key", "api-key"),
			&cli.StringFlag{Name: "model", Required: true, Usage: "the model (deployment) to load"},
			&cli.IntFlag{Name: "concurrency", Value: 8, Usage: "requests in flight"},
			&cli.FloatFlag{Name: "rate", Usage: "requests per second, arriving as a Poisson process (0: closed loop at --concurrency)"},
			&cli.IntFlag{Name: "requests", Value: 100, Usage: "requests to send (with --duration: only when given)"},
			&cli.DurationFlag{Name: "duration", Usage: "stop starting requests after this long"},
			&cli.BoolFlag{Name: "stream", Usage: "stream the answers"},
			&cli.IntFlag{Name: "max-tokens", Value: 64, Usage: "tokens per answer, sent with ignore_eos so every answer is this long (0: the engine decides)"},
			&cli.StringFlag{Name: "prompt-file", Usage: "prompts, one per line"},
			&cli.IntFlag{Name: "tenants", Usage: "the shared-prefix workload: this many tenants"},
			&cli.IntFlag{Name: "system-prompt-tokens", Value: 1000, Usage: "the shared-prefix workload: each tenant's system prompt, in tokens of four characters"},
			&cli.Uint64Flag{Name: "seed", Usage: "seed of the prompts and the arrivals"},
			&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
			&cli.BoolFlag{Name: "progress", Usage: "print a progress line to stderr even when it is not a terminal"},
		},
		Action: bench,
	}
}

func bench(ctx context.Context, c *cli.Command) error {
	cfg, err := benchConfig(c)
	if err != nil {
		return err
	}
	errw := c.Root().ErrWriter
	if c.Bool("progress") || isTerminal(errw) {
		cfg.Progress = progressLine(errw, cfg.Requests)
	}
	rep, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return failure(err.Error())
	}
	if cfg.Progress != nil {
		// Clear the progress line.
		fmt.Fprint(errw, "\r\x1b[K")
	}
	w := c.Root().Writer
	if c.Bool("json") {
		b, _ := json.MarshalIndent(rep, "", "  ")
		fmt.Fprintln(w, string(b))
	} else {
		writeBenchReport(w, c, rep)
	}
	if rep.Requests > 0 && rep.Succeeded == 0 {
		return failure(fmt.Sprintf("no request succeeded (%s); is the gateway at %s and does it serve %q?",
			errorList(rep.Errors), cfg.URL, cfg.Model))
	}
	return nil
}

// benchConfig checks the flags, naming the one at fault.
func benchConfig(c *cli.Command) (loadgen.Config, error) {
	addr := c.String("gateway-addr")
	if u, err := url.Parse(addr); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return loadgen.Config{}, usageError(fmt.Sprintf("--gateway-addr %q: want a URL such as http://127.0.0.1:8000", addr))
	}
	cfg := loadgen.Config{
		URL: addr, Model: c.String("model"), APIKey: c.String("api-key"),
		Concurrency: int(c.Int("concurrency")), Rate: c.Float("rate"),
		Requests: int(c.Int("requests")), Duration: c.Duration("duration"),
		Stream: c.Bool("stream"), MaxTokens: int(c.Int("max-tokens")),
		Rand: rand.New(rand.NewPCG(c.Uint64("seed"), 0x6c6c6d6777)),
	}
	switch {
	case strings.TrimSpace(cfg.Model) == "":
		return cfg, usageError("--model: name the model (deployment) to load")
	case cfg.Rate < 0:
		return cfg, usageError(fmt.Sprintf("--rate %v: want requests per second above 0, or no --rate for a closed loop", cfg.Rate))
	case cfg.Concurrency < 1 && (cfg.Rate == 0 || c.IsSet("concurrency")):
		return cfg, usageError(fmt.Sprintf("--concurrency %d: want at least 1", cfg.Concurrency))
	case cfg.Requests < 0:
		return cfg, usageError(fmt.Sprintf("--requests %d: want at least 1", cfg.Requests))
	case cfg.Duration < 0:
		return cfg, usageError(fmt.Sprintf("--duration %v: want a positive duration", cfg.Duration))
	case cfg.MaxTokens < 0:
		return cfg, usageError(fmt.Sprintf("--max-tokens %d: want 0 or more", cfg.MaxTokens))
	}
	if cfg.Rate > 0 && !c.IsSet("concurrency") {
		cfg.Concurrency = 0 // open loop, uncapped
	}
	if cfg.Duration > 0 && !c.IsSet("requests") {
		cfg.Requests = 0 // until the duration is over
	}
	if cfg.Requests == 0 && cfg.Duration == 0 {
		return cfg, usageError("--requests 0: want at least 1, or a --duration")
	}
	w, err := benchWorkload(c)
	cfg.Workload = w
	return cfg, err
}

func benchWorkload(c *cli.Command) (loadgen.Workload, error) {
	seed := c.Uint64("seed")
	file, tenants := c.String("prompt-file"), int(c.Int("tenants"))
	switch {
	case file != "" && c.IsSet("tenants"):
		return nil, usageError("--prompt-file and --tenants: choose one workload")
	case tenants < 0 || (c.IsSet("tenants") && tenants == 0):
		return nil, usageError(fmt.Sprintf("--tenants %d: want at least 1", tenants))
	case c.IsSet("system-prompt-tokens") && tenants == 0:
		return nil, usageError("--system-prompt-tokens: shapes the shared-prefix workload; add --tenants N")
	case c.Int("system-prompt-tokens") < 1:
		return nil, usageError(fmt.Sprintf("--system-prompt-tokens %d: want at least 1", c.Int("system-prompt-tokens")))
	case tenants > 0:
		return loadgen.SharedPrefix(tenants, int(c.Int("system-prompt-tokens")), seed)
	case file != "":
		prompts, err := readPrompts(file)
		if err != nil {
			return nil, usageError(fmt.Sprintf("--prompt-file %s: %v", file, err))
		}
		return loadgen.Lines(prompts)
	}
	return loadgen.Unique(seed), nil
}

// readPrompts reads one prompt per non-empty line.
func readPrompts(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			out = append(out, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no prompts in it (one per line)")
	}
	return out, nil
}

// progressLine rewrites one line on w at most ten times a second.
func progressLine(w io.Writer, total int) func(loadgen.Progress) {
	var last time.Time
	return func(p loadgen.Progress) {
		if now := time.Now(); now.Sub(last) >= 100*time.Millisecond || p.Done == total {
			last = now
			of := ""
			if total > 0 {
				of = fmt.Sprintf("/%d", total)
			}
			fmt.Fprintf(w, "\r\x1b[K%d%s done, %d failed, %.1fs", p.Done, of, p.Failed, p.Elapsed.Seconds())
		}
	}
}

func writeBenchReport(w io.Writer, c *cli.Command, r loadgen.Report) {
	mode := fmt.Sprintf("concurrency %d", c.Int("concurrency"))
	if rate := c.Float("rate"); rate > 0 {
		mode = fmt.Sprintf("rate %g/s", rate)
	}
	if c.Bool("stream") {
		mode += ", streamed"
	}
	fmt.Fprintf(w, "%d requests to %s at %s (%s)\n", r.Requests, c.String("model"), c.String("gateway-addr"), mode)
	fmt.Fprintf(w, "  succeeded        %d of %d in %.2fs\n", r.Succeeded, r.Requests, r.DurationS)
	fmt.Fprintf(w, "  requests/s       %.2f\n", r.RequestsPerS)
	fmt.Fprintf(w, "  output tokens/s  %.1f (%d tokens)\n", r.OutputTokensPerS, r.OutputTokens)
	for _, s := range []struct {
		name string
		s    loadgen.Summary
	}{{"TTFB ms", r.TTFB}, {"latency ms", r.Latency}} {
		fmt.Fprintf(w, "  %-16s p50 %.1f  p90 %.1f  p99 %.1f  mean %.1f\n", s.name, s.s.P50, s.s.P90, s.s.P99, s.s.Mean)
	}
	fmt.Fprintf(w, "  errors           %s\n", errorList(r.Errors))
	if len(r.Replicas) == 0 {
		fmt.Fprintln(w, "  replicas         not named (no Llmgw-Replica header: not a gateway?)")
		return
	}
	names := make([]string, 0, len(r.Replicas))
	for n := range r.Replicas {
		names = append(names, n)
	}
	slices.Sort(names)
	var parts []string
	total := 0
	for _, n := range r.Replicas {
		total += n
	}
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %d (%.0f%%)", n, r.Replicas[n], 100*float64(r.Replicas[n])/float64(total)))
	}
	fmt.Fprintf(w, "  replicas         %s; max/mean %.2f\n", strings.Join(parts, ", "), r.ReplicaMaxOverMean)
}

// errorList is "none" or "kind: n, ..." sorted by kind.
func errorList(errs map[string]int) string {
	if len(errs) == 0 {
		return "none"
	}
	kinds := make([]string, 0, len(errs))
	for k := range errs {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for i, k := range kinds {
		kinds[i] = fmt.Sprintf("%s: %d", k, errs[k])
	}
	return strings.Join(kinds, ", ")
}
