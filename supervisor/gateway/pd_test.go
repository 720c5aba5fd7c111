package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/supervisor/fakeengine"
)

func decodeFields(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return m
}

// The two legs of vLLM's protocol, field by field as its toy proxy
// (toy_proxy_server.py send_request_to_service, _handle_completions)
// sends them.
func TestPDLegsAsVLLMsToyProxy(t *testing.T) {
	client := []byte(`{"model":"chat","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":64,"max_completion_tokens":64,"min_tokens":8,"min_completion_tokens":8,"temperature":0.2}`)
	leg1, err := pdPrefillBody(client)
	if err != nil {
		t.Fatal(err)
	}
	want1 := map[string]any{
		"model": "chat", "messages": []any{map[string]any{"role": "user", "content": "hi"}},
		"stream": false, "max_tokens": float64(1), "max_completion_tokens": float64(1), "temperature": 0.2,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
			"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil},
	}
	if got := decodeFields(t, leg1); !reflect.DeepEqual(got, want1) {
		t.Errorf("leg 1:\n got %v\nwant %v", got, want1)
	}
	// No max_completion_tokens given: none added.
	leg1, _ = pdPrefillBody([]byte(`{"model":"chat","prompt":"hi","max_tokens":64}`))
	if _, ok := decodeFields(t, leg1)["max_completion_tokens"]; ok {
		t.Error("leg 1 added max_completion_tokens the client did not give")
	}

	answer := []byte(`{"id":"cmpl-1","choices":[{"text":"x"}],"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3],"remote_engine_id":"e-1","remote_request_id":"r-1","remote_host":"10.0.0.5","remote_port":5600,"tp_size":1}}`)
	params, ok := pdPrefillParams(answer)
	if !ok {
		t.Fatal("the prefill's parameters were not found")
	}
	leg2, err := pdDecodeBody(client, params)
	if err != nil {
		t.Fatal(err)
	}
	want2 := decodeFields(t, client)
	want2["kv_transfer_params"] = map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": []any{1.0, 2.0, 3.0},
		"remote_engine_id": "e-1", "remote_request_id": "r-1", "remote_host": "10.0.0.5", "remote_port": 5600.0, "tp_size": 1.0}
	if got := decodeFields(t, leg2); !reflect.DeepEqual(got, want2) {
		t.Errorf("leg 2:\n got %v\nwant %v", got, want2)
	}
}

// A prefill answer without parameters (or with parameters that ask for no
// remote prefill) is the no_params outcome, never a silent recompute.
func TestPDNoParams(t *testing.T) {
	for _, a := range []string{
		`{"choices":[{"text":"x"}]}`,
		`{"choices":[{"text":"x"}],"kv_transfer_params":null}`,
		`{"choices":[{"text":"x"}],"kv_transfer_params":{"do_remote_prefill":false}}`,
		`not json`,
	} {
		if _, ok := pdPrefillParams([]byte(a)); ok {
			t.Errorf("%s: parameters found", a)
		}
	}
}

// SGLang's pair meets through the prefill's bootstrap server by room.
func TestPDBootstrapBody(t *testing.T) {
	b, err := pdBootstrapBody([]byte(`{"model":"chat","prompt":"hi"}`), "10.0.0.5", 8998, 1<<62)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Host string `json:"bootstrap_host"`
		Port int    `json:"bootstrap_port"`
		Room uint64 `json:"bootstrap_room"`
	}
	if json.Unmarshal(b, &got) != nil || got.Host != "10.0.0.5" || got.Port != 8998 || got.Room != 1<<62 {
		t.Errorf("bootstrap fields %+v from %s", got, b)
	}
	if _, err := pdBootstrapBody([]byte(`{}`), "h", 1, 1<<63); err == nil {
		t.Error("a room of 2^63 accepted")
	}
}

// pdEngine is a fake engine speaking vLLM's NixlConnector protocol, its
// side channel on a loopback listener.
func pdEngine(t *testing.T, engineID string) (*httptest.Server, *fakeengine.Server) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := fakeengine.NewServer(fakeengine.Config{Model: "m", KV: fakeengine.KVTransfer{Connector: "NixlConnector", Role: "kv_both",
		EngineID: engineID, SideChannelHost: "127.0.0.1", Listener: ln}})
	if err != nil {
		_ = ln.Close()
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return ts, s
}

// The legs work against engines that speak the protocol: the prefill's
// answer carries parameters naming its side channel, and the decode,
// given them verbatim, loads the prompt's blocks from it over a real
// connection instead of computing them.
func TestPDLegsAgainstFakeEngines(t *testing.T) {
	pre, _ := pdEngine(t, "engine-p")
	dec, _ := pdEngine(t, "engine-d")
	client := []byte(`{"model":"m","prompt":"` + strings.Repeat("abcd", 40) + `","max_tokens":8,"min_tokens":8}`)
	post := func(url string, body []byte) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest("POST", url+"/v1/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Request-Id", "req-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	leg1, _ := pdPrefillBody(client)
	code, answer := post(pre.URL, leg1)
	if code != 200 {
		t.Fatalf("prefill leg: %d %s", code, answer)
	}
	params, ok := pdPrefillParams(answer)
	if !ok {
		t.Fatalf("the prefill answered no parameters: %s", answer)
	}
	leg2, _ := pdDecodeBody(client, params)
	if code, out := post(dec.URL, leg2); code != 200 || !strings.Contains(string(out), `"choices"`) {
		t.Fatalf("decode leg: %d %s", code, out)
	}
	resp, err := http.Get(dec.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	metrics, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(metrics), `fakeengine_kv_transfers_total{model_name="m"} 1`) {
		t.Errorf("the decode engine loaded nothing from the prefill's side channel:\n%s", metrics)
	}
}
