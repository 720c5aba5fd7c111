package scenarios

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
)

// sdkDir holds the Node check of the official openai client: its script,
// and its package.json and package-lock.json pinning the SDK's version.
// Under testdata, so the go command never walks its node_modules.
const sdkDir = "testdata/openai-sdk"

// skipNodeEnv, set to 1, skips the tests that need Node.js and the SDK;
// without it they fail when either is missing, so that a machine without
// them never passes silently.
const skipNodeEnv = "LLMGW_SKIP_NODE_TESTS"

// openAISDK returns the node binary and the check's directory, or fails the
// test saying how to install what is missing.
func openAISDK(t *testing.T) (nodeBin, dir string) {
	t.Helper()
	if os.Getenv(skipNodeEnv) == "1" {
		t.Skip(skipNodeEnv + "=1: the OpenAI SDK check is skipped")
	}
	dir, err := filepath.Abs(sdkDir)
	if err != nil {
		t.Fatal(err)
	}
	install := "npm ci --prefix scenarios/" + sdkDir + " (from the repository root; make test and make scenarios do it), or set " + skipNodeEnv + "=1 to skip this test"
	nodeBin, err = exec.LookPath("node")
	if err != nil {
		t.Fatalf("node (Node.js 20 or later) is not on PATH: install it, then run %s", install)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err != nil {
		t.Fatalf("the openai package is not installed in scenarios/%s: run %s", sdkDir, install)
	}
	return nodeBin, dir
}

// pinnedSDKVersion is the openai version package.json pins.
func pinnedSDKVersion(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	v := p.Dependencies["openai"]
	if v == "" || strings.ContainsAny(v, "^~<>=* ") {
		t.Fatalf("package.json: openai %q: want an exact version", v)
	}
	return v
}

// sdkSeen is what check.mjs prints on success.
type sdkSeen struct {
	SDK    string   `json:"sdk"`
	Models []string `json:"models"`
	Chat   struct {
		Text, Finish, Node string
	} `json:"chat"`
	Stream struct {
		Text, Finish string
		Chunks       int
	} `json:"stream"`
	Completion struct {
		Text, Finish string
	} `json:"completion"`
	Embedding struct {
		Dims int
		Norm float64
	} `json:"embedding"`
	UnknownModel struct {
		Error  string
		Status int
	} `json:"unknown_model"`
}

// The OpenAI client library, unchanged, pointed at a node's gateway
// (http://<node>:<port>/v1), works for model listing, chat (plain and
// streamed), completions and embeddings, and an unknown model is its
// NotFoundError. Both nodes' gateways are asked; only one node runs the
// replica, so one of them routes to the other, and every answer names the
// holder in Llmgw-Node.
func TestOpenAISDKThroughTheGateway(t *testing.T) {
	nodeBin, dir := openAISDK(t)
	pinned := pinnedSDKVersion(t, dir)
	bin, err := filepath.Abs(binary(t))
	if err != nil {
		t.Fatal(err)
	}
	if why := unmetRequirement(bin, []string{"process-runtime"}); why != "" {
		t.Skip(why)
	}
	res := Result{Name: "openai-sdk"}
	r, cleanup, err := newRunner(t.Context(), Options{Binary: bin, Out: logWriter{t}}, commandTable(), &res)
	t.Cleanup(cleanup)
	if err != nil {
		t.Fatal(err)
	}
	r.mustDo(t, "cluster nodes=2 runtime=process", "2 nodes up (n1..n2) on 127.0.0.1, 4xH100-80GB each, profile local, lease-ttl 3s, runtime process")
	r.mustDo(t, "place chat model=demo/tiny-chat engine=fake replicas=1", "ok")
	r.mustDo(t, "wait-until replicas chat ready=1 within 30s", "ok")
	holder, err := r.plannedNode(t.Context(), "chat-0")
	if err != nil {
		t.Fatal(err)
	}
	// The fake engine's answer: its model name and the prompt, echoed.
	const want = "fake chat reply: say hello"
	for _, n := range r.nodes {
		testwait.Until(t, 15*time.Second, n.name+"'s gateway lists chat", func() (bool, string) {
			var m struct {
				Data []struct {
					ID string `json:"id"`
				} `json:"data"`
			}
			if err := r.call(t.Context(), http.MethodGet, n.gateway()+"/v1/models", nil, false, &m); err != nil {
				return false, err.Error()
			}
			for _, d := range m.Data {
				if d.ID == "chat" {
					return true, ""
				}
			}
			return false, "not listed yet"
		})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		cmd := exec.CommandContext(ctx, nodeBin, filepath.Join(dir, "check.mjs"), n.gateway()+"/v1", "chat")
		cmd.Dir = dir
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		cancel()
		if err != nil {
			t.Fatalf("%s's gateway: node check.mjs: %v\n%s%s", n.name, err, stderr.String(), stdout.String())
		}
		var seen sdkSeen
		if err := json.Unmarshal(stdout.Bytes(), &seen); err != nil {
			t.Fatalf("%s's gateway: check.mjs printed %q: %v", n.name, stdout.String(), err)
		}
		t.Logf("%s's gateway: %s", n.name, strings.TrimSpace(stdout.String()))
		if seen.SDK != pinned {
			t.Errorf("openai %s is installed, package.json pins %s: run npm ci --prefix scenarios/%s", seen.SDK, pinned, sdkDir)
		}
		if !slices.Equal(seen.Models, []string{"chat"}) {
			t.Errorf("%s's gateway: models %v, want [chat]", n.name, seen.Models)
		}
		if seen.Chat.Text != want || seen.Chat.Finish != "stop" || seen.Chat.Node != holder {
			t.Errorf("%s's gateway: chat %+v, want %q, finish stop, served by %s", n.name, seen.Chat, want, holder)
		}
		// A role chunk, one per word (five), the finish and the usage: an
		// answer relayed event by event, not in one piece.
		if seen.Stream.Text != want || seen.Stream.Finish != "stop" || seen.Stream.Chunks < 7 {
			t.Errorf("%s's gateway: stream %+v, want %q in at least 7 chunks, finish stop", n.name, seen.Stream, want)
		}
		if seen.Completion.Text != want || seen.Completion.Finish != "stop" {
			t.Errorf("%s's gateway: completion %+v, want %q, finish stop", n.name, seen.Completion, want)
		}
		if seen.Embedding.Dims != 32 || seen.Embedding.Norm != 1 {
			t.Errorf("%s's gateway: embedding %+v, want 32 dimensions of unit length", n.name, seen.Embedding)
		}
		if seen.UnknownModel.Error != "NotFoundError" || seen.UnknownModel.Status != http.StatusNotFound {
			t.Errorf("%s's gateway: unknown model %+v, want NotFoundError 404", n.name, seen.UnknownModel)
		}
	}
}

// mustDo runs one command of the scenario grammar and fails the test unless
// it prints want.
func (r *runner) mustDo(t *testing.T, line, want string) {
	t.Helper()
	d, err := parseDirective(line, 1)
	if err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	if err := validate(&script{path: t.Name(), segs: []segment{{d: d}}}, r.commands); err != nil {
		t.Fatal(err)
	}
	got, err := r.exec(d)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("%s:\n--- want:\n%s\n--- got:\n%s", line, indent(want), indent(got))
	}
}
