package scenarios

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/llmgw/llmgw/internal/secret"
	"github.com/llmgw/llmgw/placement"
)

// The runner reads the nodes' HTTP API as any client would, with its own
// copy of the wire shapes (only the fields it looks at): it tests the
// contract, not the Go types behind it.

type memberInfo struct {
	Name         string            `json:"name"`
	State        string            `json:"state"`
	API          string            `json:"api"`
	GPUs         []json.RawMessage `json:"gpus"`
	Shards       []shardRecord     `json:"shards"`
	CachedModels []cachedModel     `json:"cached_models"`
}

type cachedModel struct {
	Model string `json:"model"`
}

type clusterInfo struct {
	Self    string       `json:"self"`
	Members []memberInfo `json:"members"`
}

type shardRecord struct {
	ShardID     string `json:"shard_id"`
	ReplicaID   string `json:"replica_id"`
	Deployment  string `json:"deployment"`
	SpecVersion string `json:"spec_version"`
	GPUs        []int  `json:"gpus"`
	Status      string `json:"status"`
	Ready       bool   `json:"ready"`
	ClaimStamp  int64  `json:"claim_stamp"`
	URL         string `json:"url"`
	PID         int    `json:"pid"`
	Restarts    int    `json:"restarts"`
}

type statusInfo struct {
	Name    string `json:"name"`
	Profile string `json:"profile"`
	Record  struct {
		Shards []shardRecord `json:"shards"`
	} `json:"record"`
}

type deploymentInfo struct {
	Name             string   `json:"name"`
	Model            string   `json:"model"`
	Engine           string   `json:"engine"`
	Replicas         int      `json:"replicas"`
	TensorParallel   int      `json:"tensor_parallel"`
	PipelineParallel int      `json:"pipeline_parallel"`
	Args             []string `json:"args"`
	SpecVersion      string   `json:"spec_version"`
	Placed           int      `json:"placed"`
	Ready            int      `json:"ready"`
	Nodes            []string `json:"nodes"`
	Why              []string `json:"why"`
	AdapterStatus    []struct {
		Name     string   `json:"name"`
		Replicas []string `json:"replicas"`
		Errors   []string `json:"errors"`
	} `json:"adapter_status"`
}

type shardRow struct {
	ShardID     string `json:"shard_id"`
	ReplicaID   string `json:"replica_id"`
	Deployment  string `json:"deployment"`
	Role        string `json:"role"`
	SpecVersion string `json:"spec_version"`
	Node        string `json:"node"`
	GPUs        []int  `json:"gpus"`
	Lease       string `json:"lease"`
	Status      string `json:"status"`
	Draining    bool   `json:"draining"`
	URL         string `json:"url"`
	PID         int    `json:"pid"`
	Restarts    int    `json:"restarts"`
	LastExit    *int   `json:"last_exit"`
	Reason      string `json:"reason"`
}

type assignment struct {
	ShardID     string `json:"shard_id"`
	ReplicaID   string `json:"replica_id"`
	Deployment  string `json:"deployment"`
	SpecVersion string `json:"spec_version"`
	Node        string `json:"node"`
	GPUs        []int  `json:"gpus"`
	Kept        bool   `json:"kept"`
	Draining    bool   `json:"draining"`
}

type unplaced struct {
	ShardID    string `json:"shard_id"`
	Deployment string `json:"deployment"`
	Reason     string `json:"reason"`
}

type planInfo struct {
	Node string `json:"node"`
	Plan struct {
		Assignments []assignment `json:"assignments"`
		Unplaced    []unplaced   `json:"unplaced"`
	} `json:"plan"`
}

// apiError is an answer other than 2xx, with the server's message.
type apiError struct {
	Code int
	Msg  string
}

func (e *apiError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Code, e.Msg) }

func (r *runner) get(ctx context.Context, n *node, path string, out any) error {
	return r.call(ctx, "GET", n.api()+path, nil, false, out)
}

// call does one request; body, when non-nil, is sent as JSON; auth sends
// the cluster token.
func (r *runner) call(ctx context.Context, method, url string, body any, auth bool, out any) error {
	bearer := ""
	if auth {
		bearer = r.token
	}
	return r.callWith(ctx, method, url, body, bearer, out)
}

// callWith is call with bearer, when not empty, as the Authorization.
func (r *runner) callWith(ctx context.Context, method, url string, body any, bearer string, out any) error {
	return r.callClient(ctx, r.http, method, url, body, bearer, out)
}

// callClient is callWith through client (a request loop's own, with its
// timeout=).
func (r *runner) callClient(ctx context.Context, client *http.Client, method, url string, body any, bearer string, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error any `json:"error"`
		}
		msg := strings.TrimSpace(string(raw))
		if json.Unmarshal(raw, &e) == nil && e.Error != nil {
			switch v := e.Error.(type) {
			case string:
				msg = v
			case map[string]any:
				if m, ok := v["message"].(string); ok {
					msg = m
				}
			}
		}
		return &apiError{Code: resp.StatusCode, Msg: msg}
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("decode %s: %w", url, err)
		}
	}
	return nil
}

// fetchAll GETs path from every node at once; results are in nodes' order.
func fetchAll[T any](ctx context.Context, r *runner, nodes []*node, path string) ([]T, []error) {
	out := make([]T, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = r.get(ctx, n, path, &out[i])
		}()
	}
	wg.Wait()
	return out, errs
}

// firstErr names the first node whose fetch failed.
func firstErr(nodes []*node, errs []error) error {
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("%s: %w", nodes[i].name, err)
		}
	}
	return nil
}

// engineKey is the API key of the engine a shard row names: nodes start
// every engine with the key derived from the cluster token and the
// engine's ID (internal/secret.EngineKey), and the runner, holding the
// token, derives it the same way from the row's shard and spec version.
func (r *runner) engineKey(row shardRow) string {
	return secret.EngineKey(r.token, placement.EngineID(row.ShardID, row.SpecVersion))
}

// servedModelVia asks the engine behind row, through client, which model
// it serves.
func (r *runner) servedModelVia(ctx context.Context, client *http.Client, row shardRow) (string, error) {
	var m struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	url := strings.TrimRight(row.URL, "/")
	if err := r.callClient(ctx, client, "GET", url+"/v1/models", nil, r.engineKey(row), &m); err != nil {
		return "", err
	}
	if len(m.Data) == 0 {
		return "", fmt.Errorf("%s/v1/models lists no model", url)
	}
	return m.Data[0].ID, nil
}

// chat sends one small chat completion to the engine behind row, with that
// engine's key, and checks the answer has a choice. Another engine on the
// row's port (a stale URL) answers 401 rather than with its own model.
func (r *runner) chat(ctx context.Context, row shardRow) error {
	return r.chatVia(ctx, r.http, row, 0)
}

// chatBody is a chat completion's body: a short answer (max_tokens 4), or
// with tokens > 0 exactly that many tokens (max_tokens and min_tokens, as
// vLLM and SGLang take them), a request that keeps an engine busy.
func chatBody(model, content string, tokens int) map[string]any {
	body := map[string]any{
		"model":      model,
		"messages":   []map[string]string{{"role": "user", "content": content}},
		"max_tokens": 4,
	}
	if tokens > 0 {
		body["max_tokens"], body["min_tokens"] = tokens, tokens
	}
	return body
}

// chatVia is chat through client, asking for tokens tokens (0: the
// default, see chatBody).
func (r *runner) chatVia(ctx context.Context, client *http.Client, row shardRow, tokens int) error {
	model, err := r.servedModelVia(ctx, client, row)
	if err != nil {
		return err
	}
	url := row.URL
	body := chatBody(model, "ping", tokens)
	var resp struct {
		Choices []json.RawMessage `json:"choices"`
	}
	if err := r.callClient(ctx, client, "POST", strings.TrimRight(url, "/")+"/v1/chat/completions", body, r.engineKey(row), &resp); err != nil {
		return err
	}
	if len(resp.Choices) == 0 {
		return fmt.Errorf("answer without choices")
	}
	return nil
}

// gatewayAnswer is where a gateway sent one request: the Llmgw-Node and
// Llmgw-Replica headers of its answer, and when the answer's head arrived
// (zero when none did).
type gatewayAnswer struct {
	node, replica string
	head          time.Time
	// firstData is when a stream's first data event came (zero: none, or
	// not a stream).
	firstData time.Time
	// status is the answer's HTTP status (0: none came); retryAfter: it
	// carried a Retry-After header.
	status     int
	retryAfter bool
	// model is the answer's model field (a stream's first chunk's): who
	// answered, an adapter by its name.
	model string
}

// chatThroughGateway sends one small chat completion for deployment to a
// node's gateway through client, streamed or not, asking for tokens
// tokens (see chatBody), and checks the answer: a choice, or, streamed, events that end
// with [DONE] and carry no error. It says where the gateway sent it.
// Each request of a loop asks something of its own (seq numbers it), as
// clients do: with one prompt for all, the prefix policy would send every
// request to the one replica that prompt prefers.
func (r *runner) chatThroughGateway(ctx context.Context, client *http.Client, gatewayURL, deployment string, stream bool, prompt string, tokens int, hdr ...string) (ans gatewayAnswer, err error) {
	body := chatBody(deployment, prompt, tokens)
	body["stream"] = stream
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, "POST", gatewayURL+"/v1/chat/completions", bytes.NewReader(b))
	if err != nil {
		return ans, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return ans, err
	}
	ans.head = time.Now()
	defer resp.Body.Close()
	ans.node, ans.replica = resp.Header.Get("Llmgw-Node"), resp.Header.Get("Llmgw-Replica")
	ans.status, ans.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After") != ""
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return ans, fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(raw)))
	}
	if !stream {
		var answer struct {
			Model   string            `json:"model"`
			Choices []json.RawMessage `json:"choices"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&answer); err != nil {
			return ans, fmt.Errorf("decode the answer: %w", err)
		}
		ans.model = answer.Model
		if len(answer.Choices) == 0 {
			return ans, fmt.Errorf("answer without choices")
		}
		return ans, nil
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if ans.firstData.IsZero() {
			ans.firstData = time.Now()
			var chunk struct {
				Model string `json:"model"`
			}
			if json.Unmarshal([]byte(data), &chunk) == nil {
				ans.model = chunk.Model
			}
		}
		if data == "[DONE]" {
			return ans, nil
		}
		if strings.Contains(data, `"error"`) {
			return ans, fmt.Errorf("stream broke off: %s", data)
		}
	}
	return ans, fmt.Errorf("stream ended without [DONE] (%v)", sc.Err())
}
