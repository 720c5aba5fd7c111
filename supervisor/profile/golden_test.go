package profile

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/placement"
)

// update regenerates testdata/golden from what the profiles render now:
// go test ./supervisor/profile -run TestGolden -update. Review the diff:
// it is every change to an engine's command line.
var update = flag.Bool("update", false, "rewrite testdata/golden from the rendered profiles")

// goldenInputs are fixed facts of a node and shard, so a golden file
// changes only when a profile does: two 80 GiB GPUs with 79 GiB free each,
// a key, caches under a data dir, an RDMA-capable node, and an OTLP
// collector for the engines' traces (--otlp-engines: vLLM's files carry
// its flag, and the others' show they take none).
func goldenInputs() Inputs {
	return Inputs{
		Port: 8100, GPUMemoryTotal: 80 * gib, Self: "/llmgw",
		WeightsDir: "/var/lib/llmgw/weights", CacheDir: "/var/lib/llmgw/cache", FilesDir: "/var/lib/llmgw/files/golden",
		APIKey: "golden-key", HostIP: "10.0.0.2", NetIface: "eth1",
		StartTimeout:       2 * time.Hour,
		GPUFree:            []uint64{79 * gib, 79 * gib},
		RDMADevices:        []string{"mlx5_0", "mlx5_1"},
		OTLPTracesEndpoint: "http://127.0.0.1:4318/v1/traces",
	}
}

// goldenModel is what each engine loads: a hub id, or a GGUF file under
// the weights dir for llama.cpp.
func goldenModel(engine string) string {
	if engine == "llamacpp" {
		return "/var/lib/llmgw/weights/model-q4_k_m.gguf"
	}
	return "org/model-8b"
}

// goldenCase is one rendered deployment; a gang renders each rank.
type goldenCase struct {
	name    string
	engines []string
	deploy  func(engine string) placement.Deployment
	ranks   int // 0: a replica of one shard
	// inputs, when set, changes the node's inputs (a role's KV port).
	inputs func(*Inputs)
}

func goldenCases() []goldenCase {
	all := []string{"vllm", "sglang", "llamacpp"}
	return []goldenCase{
		{
			// TP 2 with an explicit share, context and concurrency.
			name: "tp2", engines: all,
			deploy: func(e string) placement.Deployment {
				return placement.Deployment{Name: "chat", Model: goldenModel(e), Engine: e, TensorParallel: 2,
					GPUMemory: 40 * gib, MaxModelLen: 8192, MaxNumSeqs: 8}
			},
		},
		{
			// gpu_memory: auto without max_num_seqs: the figure the
			// accepting node stored, the context it was sized for, and no
			// concurrency cap from the user: the count llmgw chose (16) is
			// stored with fit.seqs_chosen, so vLLM and SGLang get no
			// concurrency flag and llama.cpp's -np is it.
			name: "auto", engines: all,
			deploy: func(e string) placement.Deployment {
				return placement.Deployment{Name: "chat", Model: goldenModel(e), Engine: e, TensorParallel: 2,
					GPUMemory: 37 * gib, MaxModelLen: 32768, MaxNumSeqs: 16, Fit: &placement.Fit{SeqsChosen: true}}
			},
		},
		{
			// A 2-node gang: TP 2 on each node, 2 pipeline stages.
			name: "gang", engines: []string{"vllm", "sglang"}, ranks: 2,
			deploy: func(e string) placement.Deployment {
				return placement.Deployment{Name: "big", Model: "org/model-70b", Engine: e, TensorParallel: 2,
					PipelineParallel: 2, GPUMemory: 70 * gib, MaxModelLen: 8192, MaxNumSeqs: 16}
			},
		},
		{
			// LoRA: two slots of rank 16, two adapters (llama.cpp takes
			// their paths at start; the others register them at runtime).
			name: "lora", engines: all,
			deploy: func(e string) placement.Deployment {
				return placement.Deployment{Name: "chat", Model: goldenModel(e), Engine: e, MaxLoras: 2,
					Adapters: []placement.Adapter{{Name: "sql", Source: "adapters/sql"}, {Name: "code", Source: "adapters/code"}}}
			},
			inputs: func(in *Inputs) {
				in.AdapterPaths = []string{"/var/lib/llmgw/weights/adapters/sql.gguf", "/var/lib/llmgw/weights/adapters/code.gguf"}
			},
		},
		{
			// A prefill and a decode replica, on a node with a NIC named
			// for the transfer.
			name: "pd-prefill", engines: []string{"vllm", "sglang"},
			deploy: pdGolden(placement.RolePrefill),
			inputs: pdInputs(placement.RolePrefill),
		},
		{
			name: "pd-decode", engines: []string{"vllm", "sglang"},
			deploy: pdGolden(placement.RoleDecode),
			inputs: pdInputs(placement.RoleDecode),
		},
	}
}

func pdGolden(role string) func(string) placement.Deployment {
	return func(e string) placement.Deployment {
		d := placement.Deployment{Name: "pd", Model: goldenModel(e), Engine: e, TensorParallel: 2, GPUMemory: 40 * gib,
			Prefill: &placement.Role{Replicas: 1}, Decode: &placement.Role{Replicas: 2, TensorParallel: 1},
			Transfer: &placement.Transfer{NIC: "mlx5_0"}}
		return d.ForRole(role)
	}
}

func pdInputs(role string) func(*Inputs) {
	return func(in *Inputs) {
		// The runner gives every role a KV port but an SGLang decode,
		// whose profile renders none.
		in.Role, in.KVHost, in.NIC, in.KVPort = role, in.HostIP, "mlx5_0", 8101
	}
}

// renderGolden is the golden file of one engine and case: image, argv one
// element a line, env one variable a line, for each rank of a gang.
func renderGolden(t *testing.T, p Profile, c goldenCase) (string, [][]string) {
	t.Helper()
	d := c.deploy(p.Name)
	var b strings.Builder
	fmt.Fprintf(&b, "# %s, case %s: generated by golden_test.go (-update); do not edit\n", p.Name, c.name)
	var argvs [][]string
	ranks := max(c.ranks, 1)
	for rank := range ranks {
		in := goldenInputs()
		if c.inputs != nil {
			c.inputs(&in)
		}
		if c.ranks > 0 {
			in.ShardIndex = rank
			in.Gang = &GangInputs{NNodes: c.ranks, Rank: rank, MasterAddr: "10.0.0.1", MasterPort: 8123}
			fmt.Fprintf(&b, "\n[rank %d]\n", rank)
		}
		cmd, env, image, err := Resolve(p, d, in)
		if err != nil {
			t.Fatalf("%s %s rank %d: %v", p.Name, c.name, rank, err)
		}
		argvs = append(argvs, cmd)
		fmt.Fprintf(&b, "image: %s\nargv:\n", image)
		for _, a := range cmd {
			fmt.Fprintf(&b, "  %s\n", a)
		}
		b.WriteString("env:\n")
		for _, kv := range env {
			fmt.Fprintf(&b, "  %s\n", kv)
		}
		// The files the runner writes for the engine (0600 in FilesDir):
		// what SGLang reads with --config, its key among it.
		files, err := Files(p, d, in)
		if err != nil {
			t.Fatalf("%s %s rank %d files: %v", p.Name, c.name, rank, err)
		}
		for _, name := range slices.Sorted(maps.Keys(files)) {
			fmt.Fprintf(&b, "file %s:\n", name)
			for _, l := range strings.Split(strings.TrimRight(files[name], "\n"), "\n") {
				fmt.Fprintf(&b, "  %s\n", l)
			}
		}
	}
	return b.String(), argvs
}

// Each built-in engine's rendered command line and environment, for the
// deployments issue 24 names, equal their golden files, and every flag in
// them is one the pinned engine's parser accepts.
func TestGolden(t *testing.T) {
	for _, c := range goldenCases() {
		for _, engine := range c.engines {
			t.Run(engine+"-"+c.name, func(t *testing.T) {
				p, err := Lookup(engine)
				if err != nil {
					t.Fatal(err)
				}
				got, argvs := renderGolden(t, p, c)
				path := filepath.Join("testdata", "golden", engine+"-"+c.name+".txt")
				if *update {
					if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (run go test ./supervisor/profile -run TestGolden -update to create it)", err)
				}
				if got != string(want) {
					t.Errorf("%s differs from what the profile renders (if the change is meant, rerun with -update and review the diff):\n%s",
						path, lineDiff(string(want), got))
				}
				accepted, err := acceptedFlags(engine)
				if err != nil {
					t.Fatal(err)
				}
				for _, argv := range argvs {
					for _, f := range unknownFlags(argv[min(launcherLen(engine), len(argv)):], accepted) {
						t.Errorf("%s renders %s, which the pinned %s does not accept (testdata/flags/%s.txt; check the engine's parser at that version)",
							engine, f, engine, engine)
					}
				}
			})
		}
	}
}

// acceptedFlags reads testdata/flags/<engine>.txt: one flag a line, #
// comments.
func acceptedFlags(engine string) (map[string]bool, error) {
	data, err := os.ReadFile(filepath.Join("testdata", "flags", engine+".txt"))
	if err != nil {
		return nil, fmt.Errorf("accepted flags of %s: %w", engine, err)
	}
	out := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out[line] = true
	}
	return out, sc.Err()
}

// launcherLen is how many leading elements of an engine's argv launch it
// rather than configure it: SGLang's "python3 -m sglang.launch_server",
// whose -m is the interpreter's flag; the program alone for the others.
func launcherLen(engine string) int {
	if engine == "sglang" {
		return 3
	}
	return 1
}

// unknownFlags are the flags among an engine's arguments that accepted
// lacks: every element starting with "-", cut at "=", except negative
// numbers, which are values (llama.cpp's -np -1).
func unknownFlags(args []string, accepted map[string]bool) []string {
	var bad []string
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		if _, err := strconv.ParseFloat(a, 64); err == nil {
			continue
		}
		name, _, _ := strings.Cut(a, "=")
		if !accepted[name] && !slices.Contains(bad, name) {
			bad = append(bad, name)
		}
	}
	return bad
}

// lineDiff lists the lines only one side has, marked - (golden) and +
// (rendered): enough to see which flag or variable moved.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for _, l := range w {
		if !slices.Contains(g, l) {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	if b.Len() == 0 {
		return "(same lines, another order)"
	}
	return b.String()
}

// The flag check itself: a flag outside the list is caught whatever its
// form, and values are not mistaken for flags.
func TestUnknownFlags(t *testing.T) {
	accepted := map[string]bool{"--port": true, "-np": true}
	got := unknownFlags([]string{"--port", "8000", "--port=1", "-np", "-1", "--no-such=3", "value", "-x", "--no-such"}, accepted)
	if want := []string{"--no-such", "-x"}; !slices.Equal(got, want) {
		t.Errorf("unknownFlags = %q, want %q", got, want)
	}
}

// Every built-in engine image is pinned: the constant of pinned.go, by tag
// and digest, never a moving tag.
func TestBuiltinImagesPinned(t *testing.T) {
	want := map[string]string{"vllm": PinnedVLLMImage, "sglang": PinnedSGLangImage, "llamacpp": PinnedLlamaCppImage}
	for name, img := range want {
		repoTag, digest, ok := strings.Cut(img, "@sha256:")
		if !ok || len(digest) != 64 || strings.HasSuffix(repoTag, ":latest") || !strings.Contains(repoTag, ":") {
			t.Errorf("%s: pinned image %q is not repo:tag@sha256:<64 hex>", name, img)
		}
		p, err := Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		if p.Image != img {
			t.Errorf("%s profile's image is %q, want the pinned %q (Image: Pinned...Image in builtin_%s.go)", name, p.Image, img, name)
		}
	}
}
