package fakeengine

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func env(vars map[string]string) func(string) string { return func(k string) string { return vars[k] } }

// The flags files are data from each engine's own parser: each names its
// source in its header, and parses.
func TestFlagFilesNameTheirSource(t *testing.T) {
	for p, source := range map[Personality][]string{
		PersonalityVLLM:     {"vllm-project/vllm", "vllm/engine/arg_utils.py", "vllm/entrypoints/openai/cli_args.py", "SUBSET"},
		PersonalitySGLang:   {"sgl-project/sglang", "python/sglang/srt/server_args.py", "SUBSET"},
		PersonalityLlamaCpp: {"ggml-org/llama.cpp", "common/arg.cpp", "SUBSET"},
	} {
		b, err := os.ReadFile("testdata/flags-" + string(p) + ".txt")
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range source {
			if !strings.Contains(string(b), s) {
				t.Errorf("flags-%s.txt does not name %s in its header", p, s)
			}
		}
		table, err := flagTableFor(p)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(table.byName); n < 40 {
			t.Errorf("%s accepts %d flag names; the list should hold the common ones too", p, n)
		}
	}
}

// Both --flag value and --flag=value work, with each engine's defaults,
// names and keys.
func TestParseCommandLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Personality
		args []string
		env  map[string]string
		want Config
		gang *Gang
	}{
		{"vllm spaced", PersonalityVLLM, strings.Fields("serve org/m --served-model-name chat --tensor-parallel-size 2 --host 127.0.0.1 --port 9000 --max-num-seqs 8 --max-model-len 32k --no-enable-prefix-caching"),
			map[string]string{"VLLM_API_KEY": "envkey"},
			Config{Personality: PersonalityVLLM, Model: "chat", Host: "127.0.0.1", Port: 9000, MaxRunning: 8, MaxModelLen: 32000, NoPrefixCaching: true, APIKey: "envkey", ExitCode: 1}, nil},
		{"vllm with =, underscores and a flag key", PersonalityVLLM, strings.Fields("serve org/m --served-model-name chat other --tensor_parallel_size=2 --host=127.0.0.1 --port=9000 --max_num_seqs=8 --max-model-len=2K --api-key k1 k2 --block-size 32"),
			map[string]string{"VLLM_API_KEY": "envkey"},
			Config{Personality: PersonalityVLLM, Model: "chat", Host: "127.0.0.1", Port: 9000, MaxRunning: 8, MaxModelLen: 2048, BlockSize: 32, APIKey: "k1", ExitCode: 1}, nil},
		{"vllm defaults, --model", PersonalityVLLM, strings.Fields("serve --model org/m"), nil,
			Config{Personality: PersonalityVLLM, Model: "org/m", Port: 8000, ExitCode: 1}, nil},
		{"vllm gang", PersonalityVLLM, strings.Fields("serve m --nnodes=2 --node-rank=1 --master-addr=10.0.0.1 --master-port=29500 --headless -pp 2"), nil,
			Config{Personality: PersonalityVLLM, Model: "m", Port: 8000, ExitCode: 1}, &Gang{NNodes: 2, NodeRank: 1, MasterAddr: "10.0.0.1", MasterPort: 29500}},
		{"sglang", PersonalitySGLang, strings.Fields("-m sglang.launch_server --model-path org/m --served-model-name chat --tp-size 2 --host 0.0.0.0 --port 9000 --enable-metrics --mem-fraction-static=0.45 --context-length=8192 --max-running-requests=16 --api-key=k"),
			map[string]string{"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0", "SGLANG_HEALTH_CHECK_TIMEOUT": "5"},
			Config{Personality: PersonalitySGLang, Model: "chat", Host: "0.0.0.0", Port: 9000, MaxRunning: 16, MaxModelLen: 8192, APIKey: "k",
				SGLangCheapHealth: true, SGLangHealthTimeout: 5 * time.Second, ExitCode: 1}, nil},
		{"sglang defaults, no -m, no metrics", PersonalitySGLang, strings.Fields("--model org/m --tp 2 --disable-radix-cache"), nil,
			Config{Personality: PersonalitySGLang, Model: "org/m", Host: "127.0.0.1", Port: 30000, NoMetrics: true, NoPrefixCaching: true, ExitCode: 1}, nil},
		{"sglang gang over IPv6", PersonalitySGLang, strings.Fields("-m sglang.launch_server --model-path m --enable-metrics --nnodes=2 --node-rank=1 --dist-init-addr=[fd00::1]:29500"), nil,
			Config{Personality: PersonalitySGLang, Model: "m", Host: "127.0.0.1", Port: 30000, ExitCode: 1}, &Gang{NNodes: 2, NodeRank: 1, MasterAddr: "fd00::1", MasterPort: 29500}},
		// -c is the whole KV context, split over the -np slots.
		{"llamacpp", PersonalityLlamaCpp, strings.Fields("--model /w/m.gguf --alias chat --host 0.0.0.0 --port 9000 --n-gpu-layers 999 --metrics -np 8 -c 16384 --no-kv-unified --fit off"),
			map[string]string{"LLAMA_API_KEY": "envkey"},
			Config{Personality: PersonalityLlamaCpp, Model: "chat", Host: "0.0.0.0", Port: 9000, MaxRunning: 8, MaxModelLen: 2048, APIKey: "envkey", ExitCode: 1}, nil},
		{"llamacpp unified KV", PersonalityLlamaCpp, strings.Fields("--model /w/m.gguf --alias chat -np 8 -c 16384 --kv-unified --metrics"),
			map[string]string{},
			Config{Personality: PersonalityLlamaCpp, Model: "chat", Host: "127.0.0.1", Port: 8080, MaxRunning: 8, MaxModelLen: 16384, ExitCode: 1}, nil},
		{"llamacpp short names, auto slots, flag key", PersonalityLlamaCpp, strings.Fields("-m /w/m.gguf -a=chat -ngl=99 -np -1 -c 8192 --api-key k"),
			map[string]string{"LLAMA_API_KEY": "envkey"},
			// Auto slots share one KV stream: -c is each one's context.
			Config{Personality: PersonalityLlamaCpp, Model: "chat", Host: "127.0.0.1", Port: 8080, MaxRunning: 4, MaxModelLen: 8192, NoMetrics: true, APIKey: "k", ExitCode: 1}, nil},
		{"fake knobs", PersonalityLlamaCpp, strings.Fields("-m m"),
			map[string]string{EnvStartupDelay: "2s", EnvTokenDelay: "10ms", EnvPrefillBase: "5ms", EnvPrefillPer1KTokens: "50ms",
				EnvHealthDelayPerRunning: "1s", EnvHangAfter: "1m", EnvCrashAfter: "2m", EnvExitCode: "3"},
			Config{Personality: PersonalityLlamaCpp, Model: "m", Host: "127.0.0.1", Port: 8080, MaxRunning: 4, NoMetrics: true,
				StartupDelay: 2 * time.Second, TokenDelay: 10 * time.Millisecond, PrefillBase: 5 * time.Millisecond, PrefillPer1KTokens: 50 * time.Millisecond,
				HealthDelayPerRunning: time.Second, HangAfter: time.Minute, CrashAfter: 2 * time.Minute, ExitCode: 3}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, g, err := ParseCommandLine(tc.p, tc.args, env(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cfg, tc.want) {
				t.Errorf("config\n got %+v\nwant %+v", cfg, tc.want)
			}
			if !reflect.DeepEqual(g, tc.gang) {
				t.Errorf("gang %+v, want %+v", g, tc.gang)
			}
		})
	}
}

// What the real engine would refuse is refused, naming the flag (or
// variable) and the engine.
func TestParseCommandLineRefuses(t *testing.T) {
	for _, tc := range []struct {
		p    Personality
		args string
		env  map[string]string
		flag string
		want string
	}{
		{PersonalityVLLM, "serve m --no-such-flag", nil, "--no-such-flag", "vllm serve has no flag --no-such-flag"},
		{PersonalitySGLang, "-m sglang.launch_server --model-path m --no-such-flag", nil, "--no-such-flag", "sglang.launch_server has no flag --no-such-flag"},
		{PersonalityLlamaCpp, "--model m --no-such-flag", nil, "--no-such-flag", "llama-server has no flag --no-such-flag"},
		// The fake's own flags are not the real engines'.
		{PersonalityVLLM, "serve m --token-delay 1s", nil, "--token-delay", "vllm serve has no flag --token-delay"},
		// Each engine's flags are its own.
		{PersonalityLlamaCpp, "--model m --tensor-parallel-size 2", nil, "--tensor-parallel-size", "llama-server has no flag"},
		{PersonalityVLLM, "serve m --enforce-eager=true", nil, "--enforce-eager", "takes no value"},
		{PersonalityVLLM, "serve m --port", nil, "--port", "needs a value"},
		{PersonalitySGLang, "--model-path m --port --host h", nil, "--port", "needs a value"},
		{PersonalityVLLM, "serve m --max-num-seqs many", nil, "--max-num-seqs", `"many": want an integer`},
		{PersonalityVLLM, "m --port 1", nil, "", "serve [MODEL]"},
		{PersonalityVLLM, "serve", nil, "", "no model"},
		{PersonalityVLLM, "serve a b", nil, "", "unrecognized arguments: b"},
		{PersonalitySGLang, "-m vllm.entrypoints.openai.api_server --model m", nil, "-m", "want -m sglang.launch_server"},
		{PersonalitySGLang, "--port 1", nil, "--model-path", "required: --model-path"},
		{PersonalitySGLang, "--model-path m --nnodes 2 --node-rank 1", nil, "--dist-init-addr", "HOST:PORT"},
		{PersonalityLlamaCpp, "--alias x", nil, "--model", "no model"},
		{PersonalityLlamaCpp, "--model m --port 70000", nil, "--port", "0 to 65535"},
		{PersonalityVLLM, "serve m", map[string]string{EnvStartupDelay: "5"}, "", EnvStartupDelay + `="5"`},
		{PersonalityVLLM, "serve m", map[string]string{EnvHealthDelayPerRunning: "-1s"}, "", EnvHealthDelayPerRunning},
		{PersonalityVLLM, "serve m", map[string]string{EnvExitCode: "300"}, "", EnvExitCode},
		{PersonalitySGLang, "--model-path m", map[string]string{"SGLANG_HEALTH_CHECK_TIMEOUT": "1.5"}, "", "SGLANG_HEALTH_CHECK_TIMEOUT"},
		{PersonalitySGLang, "--model-path m", map[string]string{"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "maybe"}, "", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"},
	} {
		t.Run(string(tc.p)+" "+tc.args, func(t *testing.T) {
			_, _, err := ParseCommandLine(tc.p, strings.Fields(tc.args), env(tc.env))
			var ce *CommandLineError
			if !errors.As(err, &ce) {
				t.Fatalf("err %v, want a *CommandLineError", err)
			}
			if ce.Flag != tc.flag || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), string(tc.p)) {
				t.Errorf("err %q (flag %q), want one naming %q and %s, with flag %q", err, ce.Flag, tc.want, tc.p, tc.flag)
			}
		})
	}
}

func TestPersonalityArgs(t *testing.T) {
	for _, tc := range []struct {
		args    string
		p       Personality
		rest    string
		ok, bad bool
	}{
		{"--model m", "", "", false, false},
		{"", "", "", false, false},
		{"--personality vllm serve m", PersonalityVLLM, "serve m", true, false},
		{"--personality=sglang -m sglang.launch_server", PersonalitySGLang, "-m sglang.launch_server", true, false},
		{"--personality llamacpp", PersonalityLlamaCpp, "", true, false},
		{"--personality", "", "", true, true},
		{"--personality=tgi --model m", "", "", true, true},
	} {
		p, rest, ok, err := PersonalityArgs(strings.Fields(tc.args))
		if p != tc.p || strings.Join(rest, " ") != tc.rest || ok != tc.ok || (err != nil) != tc.bad {
			t.Errorf("PersonalityArgs(%q) = %q %q %v %v", tc.args, p, rest, ok, err)
		}
	}
}

// SGLang's --config file gives settings as its flags would, the command
// line winning: the fake reads the key llmgw writes there.
func TestSGLangConfigFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "sglang.yaml")
	if err := os.WriteFile(file, []byte("api-key: 'k''1'\ncontext-length: 4096\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"-m", "sglang.launch_server", "--model-path", "m", "--config", file, "--context-length", "8192"}
	cfg, _, err := ParseCommandLine(PersonalitySGLang, args, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.APIKey != "k'1" || cfg.MaxModelLen != 8192 {
		t.Errorf("key %q, context %d: want the file's key k'1 and the command line's 8192", cfg.APIKey, cfg.MaxModelLen)
	}
	bad := filepath.Join(dir, "sglang.txt")
	_ = os.WriteFile(bad, []byte("api-key: k\n"), 0o600)
	if _, _, err := ParseCommandLine(PersonalitySGLang, []string{"--model-path", "m", "--config", bad}, func(string) string { return "" }); err == nil {
		t.Error("a config file not named .yaml was taken")
	}
}
