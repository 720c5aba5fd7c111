package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/freeport"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/fakeengine"
	"github.com/llmgw/llmgw/supervisor/profile"
)

// personalityRender is what llmgw's built-in profile for engine renders for
// a representative deployment (TP 2, gpu_memory, max_model_len,
// max_num_seqs, a key), alone or as rank 1 of a two-node gang: the argv
// after the program, and the environment as a lookup.
func personalityRender(t *testing.T, engine string, port int, gang bool) (args []string, getenv func(string) string) {
	t.Helper()
	p, err := profile.Lookup(engine)
	if err != nil {
		t.Fatal(err)
	}
	d := placement.Deployment{
		Name: "chat", Model: "org/model", Engine: engine, Replicas: 1, TensorParallel: 2,
		GPUMemory: 40 << 30, MaxModelLen: 8192, MaxNumSeqs: 16,
	}
	in := profile.Inputs{Port: port, Host: "127.0.0.1", GPUMemoryTotal: 80 << 30, Self: "/llmgw",
		WeightsDir: "/weights", APIKey: "k-123", StartTimeout: time.Hour}
	if gang {
		d.PipelineParallel = 2
		in.Gang = &profile.GangInputs{NNodes: 2, Rank: 1, MasterAddr: "10.0.0.1", MasterPort: 29500}
		in.HostIP, in.NetIface = "10.0.0.2", "eth0"
	}
	cmd, env, _, err := profile.Resolve(p, d, in)
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	return cmd[1:], func(k string) string { return vars[k] }
}

// Every command line llmgw's vllm, sglang and llamacpp profiles render is
// one the fake's personality of that engine accepts, and it reaches the
// fake's Config: served name, port, key, batch size, context.
func TestEnginePersonalityAcceptsProfileCommandLines(t *testing.T) {
	for _, tc := range []struct {
		engine fakeengine.Personality
		// rendered are flags the render must hold, so the test covers
		// them.
		rendered []string
		// wantSeqs is the batch size: the deployment's (llama.cpp: -np,
		// and -c is its context times the slots).
		wantSeqs int
		wantLen  int
	}{
		{fakeengine.PersonalityVLLM, []string{"serve", "--served-model-name", "--tensor-parallel-size", "--gpu-memory-utilization=0.50", "--max-model-len=8192", "--max-num-seqs=16"}, 16, 8192},
		{fakeengine.PersonalitySGLang, []string{"-m", "--model-path", "--tp-size", "--enable-metrics", "--mem-fraction-static=0.50", "--context-length=8192", "--max-running-requests=16", "--api-key=k-123"}, 16, 8192},
		{fakeengine.PersonalityLlamaCpp, []string{"--model", "--alias", "--n-gpu-layers", "--metrics", "-np", "--no-kv-unified", "--fit"}, 16, 8192},
	} {
		t.Run(string(tc.engine), func(t *testing.T) {
			args, getenv := personalityRender(t, string(tc.engine), 8123, false)
			for _, want := range tc.rendered {
				if !slices.Contains(args, want) {
					t.Fatalf("the %s profile no longer renders %s: %q (update the test)", tc.engine, want, args)
				}
			}
			cfg, g, err := fakeengine.ParseCommandLine(tc.engine, args, getenv)
			if err != nil {
				t.Fatalf("%q: %v", args, err)
			}
			if g != nil {
				t.Errorf("a single-node command line gave a gang: %+v", g)
			}
			if cfg.Model != "chat" || cfg.Port != 8123 || cfg.Host != "127.0.0.1" || cfg.APIKey != "k-123" || cfg.Personality != tc.engine {
				t.Errorf("config %+v: want model chat, 127.0.0.1:8123, key k-123, personality %s", cfg, tc.engine)
			}
			if cfg.MaxRunning != tc.wantSeqs {
				t.Errorf("batch size %d, want %d", cfg.MaxRunning, tc.wantSeqs)
			}
			if got := cmpOr(cfg.MaxModelLen, 4096); got != tc.wantLen {
				t.Errorf("context %d, want %d", got, tc.wantLen)
			}

			bad := append(slices.Clone(args), "--no-such-flag")
			_, _, err = fakeengine.ParseCommandLine(tc.engine, bad, getenv)
			var ce *fakeengine.CommandLineError
			if !errors.As(err, &ce) || ce.Flag != "--no-such-flag" || !strings.Contains(err.Error(), "--no-such-flag") ||
				!strings.Contains(err.Error(), string(tc.engine)) {
				t.Errorf("with --no-such-flag: %v, want a CommandLineError naming the flag and the engine", err)
			}
		})
	}
	// A gang member's command line (vLLM's and SGLang's multi-node
	// flags) is accepted too, and gives the fake's gang.
	for _, engine := range []fakeengine.Personality{fakeengine.PersonalityVLLM, fakeengine.PersonalitySGLang} {
		t.Run(string(engine)+" gang", func(t *testing.T) {
			args, getenv := personalityRender(t, string(engine), 8123, true)
			_, g, err := fakeengine.ParseCommandLine(engine, args, getenv)
			if err != nil {
				t.Fatalf("%q: %v", args, err)
			}
			if g == nil || g.NNodes != 2 || g.NodeRank != 1 || g.MasterAddr != "10.0.0.1" || g.MasterPort != 29500 {
				t.Errorf("gang %+v from %q: want rank 1 of 2 at 10.0.0.1:29500", g, args)
			}
		})
	}
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// `llmgw engine fake --personality P` with the profile's command line and
// environment serves as that engine: its metric names, its key rule.
func TestEnginePersonalityServesProfileCommandLine(t *testing.T) {
	for _, tc := range []struct {
		engine fakeengine.Personality
		// metric is one of the engine's own metric names.
		metric string
		// open and guarded are a path the key leaves open and one it
		// guards (GET).
		open, guarded string
	}{
		{fakeengine.PersonalityVLLM, fakeengine.MetricRunning, "/metrics", "/v1/models"},
		{fakeengine.PersonalitySGLang, fakeengine.MetricSGLangRunning, "/metrics", "/v1/models"},
		{fakeengine.PersonalityLlamaCpp, fakeengine.MetricLlamaCppRunning, "/v1/models", "/metrics"},
	} {
		t.Run(string(tc.engine), func(t *testing.T) {
			port, err := freeport.Loopback()
			if err != nil {
				t.Fatal(err)
			}
			args, getenv := personalityRender(t, string(tc.engine), port, false)
			// The runner hands the engine the profile's environment (the
			// key of vLLM and llama.cpp, SGLang's cheap /health).
			for _, k := range []string{"VLLM_API_KEY", "LLAMA_API_KEY", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"} {
				t.Setenv(k, getenv(k))
			}
			base := "http://127.0.0.1:" + strconv.Itoa(port)
			stop := runEngineFake(t, append([]string{"--personality", string(tc.engine)}, args...))
			defer stop()
			get := func(path, key string) (int, string) {
				req, _ := http.NewRequest("GET", base+path, nil)
				if key != "" {
					req.Header.Set("Authorization", "Bearer "+key)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return 0, err.Error()
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}
			testwait.Until(t, 10*time.Second, "the engine answers /health", func() (bool, string) {
				c, body := get("/health", "")
				return c == 200, strconv.Itoa(c) + " " + body
			})
			if c, body := get(tc.open, ""); c != 200 {
				t.Errorf("%s without the key = %d %s, want 200", tc.open, c, body)
			}
			if c, _ := get(tc.guarded, ""); c != 401 {
				t.Errorf("%s without the key = %d, want 401", tc.guarded, c)
			}
			c, metrics := get("/metrics", "k-123")
			if c != 200 || !strings.Contains(metrics, tc.metric) {
				t.Errorf("/metrics = %d, want 200 with %s:\n%s", c, tc.metric, metrics)
			}
		})
	}
}

// runEngineFake runs `llmgw engine fake ARGS...` until the returned stop.
func runEngineFake(t *testing.T, args []string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		app := newApp()
		app.Writer, app.ErrWriter = io.Discard, io.Discard
		done <- app.Run(ctx, append([]string{"llmgw", "engine", "fake"}, args...))
	}()
	return func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("engine fake after cancel: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("engine fake did not stop")
		}
	}
}

// A flag the real engine lacks, or a bad fake knob, is a usage error (exit
// status 2) naming it; so is --personality anywhere but first, and a flag
// the plain fake lacks.
func TestEnginePersonalityRefusals(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want []string
	}{
		{[]string{"--personality", "vllm", "serve", "m", "--no-such-flag"}, nil, []string{"--no-such-flag", "vllm"}},
		{[]string{"--personality", "sglang", "-m", "sglang.launch_server", "--model-path", "m", "--token-delay", "1s"}, nil, []string{"--token-delay", "sglang"}},
		{[]string{"--personality", "llamacpp", "--model", "m", "--served-model-name", "x"}, nil, []string{"--served-model-name", "llama-server"}},
		{[]string{"--personality", "tgi", "--model", "m"}, nil, []string{`"tgi"`}},
		{[]string{"--personality=vllm", "serve", "m"}, map[string]string{fakeengine.EnvTokenDelay: "fast"}, []string{fakeengine.EnvTokenDelay}},
		{[]string{"--model", "m", "--personality", "vllm"}, nil, []string{"--personality must come first"}},
		// The plain fake's own parse errors, urfave/cli's, are usage
		// errors too.
		{[]string{"--model", "m", "--bogus"}, nil, []string{"-bogus", "llmgw engine fake --help"}},
		{[]string{"--model", "m", "--port", "x"}, nil, []string{`invalid value "x" for flag -port`}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			app := newApp()
			app.Writer, app.ErrWriter = io.Discard, io.Discard
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := app.Run(ctx, append([]string{"llmgw", "engine", "fake"}, tc.args...))
			var ce codedError
			if !errors.As(err, &ce) || ce.code != 2 {
				t.Fatalf("err %v, want a usage error (exit status 2)", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %s", err, w)
				}
			}
		})
	}
}
