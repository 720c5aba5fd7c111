package profile

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/placement"
)

const gib = 1 << 30

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		name      string
		profile   string
		d         placement.Deployment
		in        Inputs
		wantCmd   []string
		wantEnv   []string
		wantImage string
	}{
		{
			name:    "vllm whole GPUs",
			profile: "vllm",
			d:       placement.Deployment{Name: "llama", Model: "meta-llama/Llama-3.1-8B-Instruct", TensorParallel: 2},
			in:      Inputs{Port: 8001},
			wantCmd: []string{"vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama",
				"--tensor-parallel-size", "2", "--host", "0.0.0.0", "--port", "8001"},
			wantEnv:   []string{},
			wantImage: PinnedVLLMImage,
		},
		{
			name:    "vllm memory share, args, env and image from the deployment",
			profile: "vllm",
			d: placement.Deployment{Name: "small", Model: "Qwen/Qwen3-0.6B", GPUMemory: 20 * gib,
				Image: "registry.local/vllm:0.11", Args: []string{"--max-model-len", "8192"},
				Env: map[string]string{"HF_HOME": "/override", "VLLM_LOGGING_LEVEL": "DEBUG"}},
			in: Inputs{Port: 9000, Host: "10.0.0.5", GPUMemoryTotal: 80 * gib, WeightsDir: "/var/lib/llmgw/weights"},
			wantCmd: []string{"vllm", "serve", "Qwen/Qwen3-0.6B", "--served-model-name", "small",
				"--tensor-parallel-size", "1", "--host", "10.0.0.5", "--port", "9000",
				"--gpu-memory-utilization=0.25", "--max-model-len", "8192"},
			wantEnv:   []string{"HF_HOME=/override", "VLLM_LOGGING_LEVEL=DEBUG"},
			wantImage: "registry.local/vllm:0.11",
		},
		{
			name:    "vllm memory share rounds down",
			profile: "vllm",
			d:       placement.Deployment{Name: "third", Model: "m", GPUMemory: placement.Bytes(80 * gib / 3)},
			in:      Inputs{Port: 1, GPUMemoryTotal: 80 * gib, WeightsDir: "/w"},
			wantCmd: []string{"vllm", "serve", "m", "--served-model-name", "third",
				"--tensor-parallel-size", "1", "--host", "0.0.0.0", "--port", "1", "--gpu-memory-utilization=0.33"},
			wantEnv:   []string{"HF_HOME=/w"},
			wantImage: PinnedVLLMImage,
		},
		{
			name:    "vllm memory share without a known GPU size keeps the engine default",
			profile: "vllm",
			d:       placement.Deployment{Name: "x", Model: "m", GPUMemory: 20 * gib},
			in:      Inputs{Port: 1},
			wantCmd: []string{"vllm", "serve", "m", "--served-model-name", "x",
				"--tensor-parallel-size", "1", "--host", "0.0.0.0", "--port", "1"},
			wantEnv:   []string{},
			wantImage: PinnedVLLMImage,
		},
		{
			name:    "vllm gpu_memory auto: the context and sequences the figure holds",
			profile: "vllm",
			d: placement.Deployment{Name: "auto", Model: "m", GPUMemory: 40 * gib, MaxModelLen: 32768, MaxNumSeqs: 2,
				Fit: &placement.Fit{Weights: 15 * gib, KVCache: 8 * gib, Overhead: 4 * gib}},
			in: Inputs{Port: 1, GPUMemoryTotal: 80 * gib},
			wantCmd: []string{"vllm", "serve", "m", "--served-model-name", "auto",
				"--tensor-parallel-size", "1", "--host", "0.0.0.0", "--port", "1", "--gpu-memory-utilization=0.50",
				"--max-model-len=32768", "--max-num-seqs=2"},
			wantEnv:   []string{},
			wantImage: PinnedVLLMImage,
		},
		{
			name:    "sglang gpu_memory auto",
			profile: "sglang",
			d:       placement.Deployment{Name: "auto", Model: "m", GPUMemory: 20 * gib, MaxModelLen: 8192, MaxNumSeqs: 4},
			in:      Inputs{Port: 1, GPUMemoryTotal: 80 * gib},
			wantCmd: []string{"python3", "-m", "sglang.launch_server", "--model-path", "m",
				"--served-model-name", "auto", "--tp-size", "1", "--host", "0.0.0.0", "--port", "1",
				"--enable-metrics", "--mem-fraction-static=0.25", "--context-length=8192", "--max-running-requests=4"},
			wantEnv:   []string{"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0"},
			wantImage: PinnedSGLangImage,
		},
		{
			name:    "sglang",
			profile: "sglang",
			d:       placement.Deployment{Name: "qwen", Model: "Qwen/Qwen3-32B", TensorParallel: 4, GPUMemory: 40 * gib},
			in:      Inputs{Port: 30000, GPUMemoryTotal: 80 * gib},
			wantCmd: []string{"python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-32B",
				"--served-model-name", "qwen", "--tp-size", "4", "--host", "0.0.0.0", "--port", "30000",
				"--enable-metrics", "--mem-fraction-static=0.50"},
			wantEnv:   []string{"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0"},
			wantImage: PinnedSGLangImage,
		},
		{
			name:    "llama.cpp",
			profile: "llamacpp",
			d:       placement.Deployment{Name: "gguf", Model: "/weights/q4.gguf", Args: []string{"--ctx-size", "4096"}},
			in:      Inputs{Port: 8080, Host: "127.0.0.1"},
			wantCmd: []string{"/app/llama-server", "--model", "/weights/q4.gguf", "--alias", "gguf",
				// The deployment's own --ctx-size comes last: llama.cpp takes
				// the last value.
				"--host", "127.0.0.1", "--port", "8080", "-np", "4", "-c", "16384", "--no-kv-unified", "--fit", "off",
				"--n-gpu-layers", "999", "--metrics", "--ctx-size", "4096"},
			wantEnv:   []string{},
			wantImage: PinnedLlamaCppImage,
		},
		{
			name:    "llama.cpp installed on the host",
			profile: "llamacpp",
			d:       placement.Deployment{Name: "gguf", Model: "/weights/q4.gguf"},
			in:      Inputs{Port: 8080, Program: "/usr/local/bin/llama-server"},
			wantCmd: []string{"/usr/local/bin/llama-server", "--model", "/weights/q4.gguf", "--alias", "gguf",
				"--host", "0.0.0.0", "--port", "8080", "-np", "4", "-c", "16384", "--no-kv-unified", "--fit", "off",
				"--n-gpu-layers", "999", "--metrics"},
			wantEnv:   []string{},
			wantImage: PinnedLlamaCppImage,
		},
		{
			name:    "fake runs llmgw itself and serves the deployment name",
			profile: "fake",
			d:       placement.Deployment{Name: "demo", Model: "anything", Args: []string{"--startup-delay=2s"}},
			in:      Inputs{Port: 18000, Host: "127.0.0.1", Self: "/usr/local/bin/llmgw"},
			wantCmd: []string{"/usr/local/bin/llmgw", "engine", "fake", "--model", "demo",
				"--host", "127.0.0.1", "--port", "18000", "--startup-delay=2s"},
			wantEnv:   []string{},
			wantImage: "",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Lookup(tc.profile)
			if err != nil {
				t.Fatal(err)
			}
			cmd, env, image, err := Resolve(p, tc.d, tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cmd, tc.wantCmd) {
				t.Errorf("cmd\n got %q\nwant %q", cmd, tc.wantCmd)
			}
			if !slices.Equal(env, tc.wantEnv) {
				t.Errorf("env\n got %q\nwant %q", env, tc.wantEnv)
			}
			if image != tc.wantImage {
				t.Errorf("image %q, want %q", image, tc.wantImage)
			}
		})
	}
}

func TestResolveErrors(t *testing.T) {
	vllm, _ := Lookup("vllm")
	fake, _ := Lookup("fake")
	for _, tc := range []struct {
		name string
		p    Profile
		d    placement.Deployment
		in   Inputs
		want string
	}{
		{"no port", vllm, placement.Deployment{Name: "a", Model: "m"}, Inputs{}, "port"},
		{"more memory than the GPU", vllm, placement.Deployment{Name: "a", Model: "m", GPUMemory: 90 * gib}, Inputs{Port: 1, GPUMemoryTotal: 80 * gib}, "exceeds"},
		{"fake without the llmgw path", fake, placement.Deployment{Name: "a", Model: "m"}, Inputs{Port: 1}, "no program"},
		{"bad template", Profile{Name: "x", Command: []string{"{{.Nope}}"}}, placement.Deployment{Name: "a", Model: "m"}, Inputs{Port: 1}, "Nope"},
		{"bad env", Profile{Name: "x", Command: []string{"e"}, Env: []string{"NOEQUALS"}}, placement.Deployment{Name: "a", Model: "m"}, Inputs{Port: 1}, "KEY=VALUE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := Resolve(tc.p, tc.d, tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

// TestBuiltinMatchesPlacement keeps the profiles and the names a deployment
// may use in step, and every built-in profile valid.
func TestBuiltinMatchesPlacement(t *testing.T) {
	b := Builtin()
	var names []string
	for name, p := range b {
		names = append(names, name)
		if p.Name != name {
			t.Errorf("profile keyed %q is named %q", name, p.Name)
		}
		if err := p.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	slices.Sort(names)
	if want := placement.EngineProfiles(); !slices.Equal(names, want) {
		t.Fatalf("built-in profiles %v, placement allows %v", names, want)
	}
	if _, err := Lookup("tgi"); err == nil || !strings.Contains(err.Error(), "fake, llamacpp, sglang, vllm") {
		t.Fatalf("Lookup(tgi) = %v", err)
	}
}

// TestBuiltinIsFresh: changing a returned profile must not change the next
// caller's.
func TestBuiltinIsFresh(t *testing.T) {
	p, _ := Lookup("vllm")
	p.Command[0] = "changed"
	q, _ := Lookup("vllm")
	if q.Command[0] != "vllm" {
		t.Fatal("Lookup shares state between calls")
	}
}

func TestResolveDoesNotAliasProfile(t *testing.T) {
	p, _ := Lookup("fake")
	d := placement.Deployment{Name: "a", Model: "m", Args: []string{"--x"}}
	cmd, _, _, err := Resolve(p, d, Inputs{Port: 1, Self: "/llmgw", Program: "/other"})
	if err != nil {
		t.Fatal(err)
	}
	cmd[1] = "changed"
	if p.Command[1] != "engine" || d.Args[0] != "--x" {
		t.Fatal("Resolve's result aliases its inputs")
	}
}

// Every built-in profile starts its engine with the engine's key when it
// has one: in the environment variable the engine reads, never on the
// command line, which every local user can read, except for SGLang, which
// reads none and takes it as a flag before the deployment's args. A
// deployment's env of that name does not replace it. Without a key no
// trace of it is left.
func TestResolveCarriesTheEngineKey(t *testing.T) {
	const key = "0123456789abcdef0123456789abcdef"
	type where struct {
		env  string   // the variable, or "" for the command line
		flag []string // on the command line, just before the deployment's args
	}
	want := map[string]where{
		"vllm":     {env: "VLLM_API_KEY"},
		"sglang":   {flag: []string{"--api-key=" + key}},
		"llamacpp": {env: "LLAMA_API_KEY"},
		"fake":     {env: "VLLM_API_KEY"},
	}
	for name, p := range Builtin() {
		w, ok := want[name]
		if !ok {
			t.Errorf("profile %s: no expectation; every built-in engine must demand its key", name)
			continue
		}
		d := placement.Deployment{Name: "a", Model: "m", Args: []string{"--last"}, Env: map[string]string{"VLLM_API_KEY": "mine", "LLAMA_API_KEY": "mine"}}
		in := Inputs{Port: 1, Self: "/llmgw", APIKey: key}
		cmd, env, _, err := Resolve(p, d, in)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if w.env != "" {
			if !slices.Contains(env, w.env+"="+key) || slices.Contains(env, w.env+"=mine") {
				t.Errorf("%s: env %q, want %s=<the key> in place of the deployment's", name, env, w.env)
			}
			for _, a := range cmd {
				if strings.Contains(a, key) || strings.Contains(a, "api-key") {
					t.Errorf("%s: the key is on the command line %q", name, cmd)
				}
			}
			if !slices.IsSorted(env) {
				t.Errorf("%s: env %q not sorted", name, env)
			}
		} else {
			tail := cmd[len(cmd)-len(w.flag)-1:]
			if !slices.Equal(tail, append(slices.Clone(w.flag), "--last")) {
				t.Errorf("%s: command %q does not end with %q then the deployment's args", name, cmd, w.flag)
			}
		}

		in.APIKey = ""
		cmd, env, _, err = Resolve(p, d, in)
		if err != nil {
			t.Fatalf("%s without a key: %v", name, err)
		}
		for _, a := range cmd {
			if strings.Contains(a, "api-key") || a == "" {
				t.Errorf("%s without a key: command %q has %q", name, cmd, a)
			}
		}
		if w.env != "" && !slices.Contains(env, w.env+"=mine") {
			t.Errorf("%s without a key: env %q lost the deployment's %s", name, env, w.env)
		}
	}
}

// A profile's key_env must be a variable name: anything else would write a
// malformed environment entry.
func TestValidateRefusesABadKeyEnv(t *testing.T) {
	p := Builtin()["vllm"]
	for _, bad := range []string{"VLLM API KEY", "1KEY", "KEY=x", "K-EY"} {
		p.KeyEnv = bad
		err := p.Validate()
		if err == nil || !strings.Contains(err.Error(), "key_env") {
			t.Errorf("key_env %q: %v, want an error naming key_env", bad, err)
		}
	}
	p.KeyEnv = "MY_ENGINE_KEY"
	if err := p.Validate(); err != nil {
		t.Errorf("key_env MY_ENGINE_KEY: %v", err)
	}
}

// vLLM's own wait for its engine core follows the deployment's start
// timeout, which llmgw enforces: at its default 600 s vLLM would give up on
// a large model llmgw still waits for.
func TestVLLMReadyTimeoutFollowsTheStartTimeout(t *testing.T) {
	p, err := Lookup("vllm")
	if err != nil {
		t.Fatal(err)
	}
	_, env, _, err := Resolve(p, placement.Deployment{Name: "big", Model: "m"}, Inputs{Port: 1, StartTimeout: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(env, "VLLM_ENGINE_READY_TIMEOUT_S=7200") {
		t.Fatalf("env %q lacks VLLM_ENGINE_READY_TIMEOUT_S=7200", env)
	}
	_, env, _, _ = Resolve(p, placement.Deployment{Name: "big", Model: "m"}, Inputs{Port: 1})
	for _, kv := range env {
		if strings.HasPrefix(kv, "VLLM_ENGINE_READY_TIMEOUT_S=") {
			t.Fatalf("without a start timeout the engine's own default stays: got %q", kv)
		}
	}
}

// Every built-in profile states its readiness rule, and the hang bound it
// gives is what the README says (about K × (timeout + poll)).
func TestBuiltinReadinessRules(t *testing.T) {
	for name, p := range Builtin() {
		r := p.Readiness
		if r.ProbeTimeout <= 0 || r.Failures < 1 || r.ProgressWindow <= 0 || r.HungRestart <= 0 || r.FirstByteTimeout <= 0 || r.StreamIdleTimeout <= 0 {
			t.Errorf("%s: incomplete readiness rule %+v", name, r)
		}
	}
	v, _ := Lookup("vllm")
	if got := v.Readiness.HangBound(500 * time.Millisecond); got != 31500*time.Millisecond {
		t.Errorf("vLLM's hang bound %s, want 31.5s (3 × (10s + 0.5s))", got)
	}
}

// vLLM sends its own traces only when the node gives it an OTLP endpoint
// (--otlp-engines): --otlp-traces-endpoint and the HTTP protocol, which
// vLLM does not default to. SGLang and llama.cpp take nothing of it. The
// endpoint is a node input: the deployment, so its spec version, is the
// same either way (a node that turns it on restarts nothing that runs).
func TestVLLMTracesOnlyWithTheNodesEndpoint(t *testing.T) {
	const ep = "http://10.0.0.9:4318/v1/traces"
	has := func(list []string, s string) bool { return slices.Contains(list, s) }
	for _, engine := range []string{"vllm", "sglang", "llamacpp"} {
		p, err := Lookup(engine)
		if err != nil {
			t.Fatal(err)
		}
		d := placement.Deployment{Name: "chat", Model: "org/model", Engine: engine}
		if engine == "llamacpp" {
			d.Model = "/w/model.gguf"
		}
		// The endpoint is a node input (Inputs), not a field of the
		// deployment, so it cannot enter the spec version: no engine rolls
		// when a node turns it on.
		offCmd, offEnv, _, err := Resolve(p, d, Inputs{Port: 8100})
		if err != nil {
			t.Fatal(err)
		}
		onCmd, onEnv, _, err := Resolve(p, d, Inputs{Port: 8100, OTLPTracesEndpoint: ep})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range slices.Concat(offCmd, offEnv) {
			if strings.Contains(strings.ToLower(s), "otlp") || strings.HasPrefix(s, "OTEL_") {
				t.Errorf("%s without an endpoint renders %q", engine, s)
			}
		}
		if engine != "vllm" {
			if !slices.Equal(onCmd, offCmd) || !slices.Equal(onEnv, offEnv) {
				t.Errorf("%s changed with an OTLP endpoint: %q %q, want %q %q", engine, onCmd, onEnv, offCmd, offEnv)
			}
			continue
		}
		if !has(onCmd, "--otlp-traces-endpoint="+ep) {
			t.Errorf("vllm with an endpoint: argv %q lacks --otlp-traces-endpoint=%s", onCmd, ep)
		}
		for _, kv := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf", "OTEL_SERVICE_NAME=vllm"} {
			if !has(onEnv, kv) {
				t.Errorf("vllm with an endpoint: env %q lacks %s", onEnv, kv)
			}
		}
	}
}
