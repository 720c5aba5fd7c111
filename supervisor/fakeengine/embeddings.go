package fakeengine

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// EmbeddingDims is the length of the fake's embeddings.
const EmbeddingDims = 32

type embeddingRequest struct {
	Model string `json:"model"`
	// Input is a string, a list of strings, a list of token ids or a list
	// of lists of token ids, as in OpenAI's API.
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
}

// embeddings answers /v1/embeddings in vLLM's shape. Each vector is a
// deterministic function of the model and the input alone, so two replicas
// of one deployment agree (a retry on another replica gets the same
// answer), while two models differ (a test can tell which one answered).
func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) {
	var req embeddingRequest
	if !s.decode(w, r, &req, func() string { return req.Model }) {
		return
	}
	if req.Dimensions != nil {
		// What vLLM answers for a model without matryoshka support, which
		// the fake is.
		writeError(w, http.StatusBadRequest, fmt.Sprintf("Model %q does not support matryoshka representation, changing output dimensions will lead to poor results.", s.cfg.Model), badRequest, "dimensions")
		return
	}
	s.writeVectors(w, r, req.Input, req.EncodingFormat, "embd", "embedding", "embedding")
}

// writeVectors answers an embeddings or pooling request (vLLM's
// /v1/embeddings and /pooling differ only in their ids and field names):
// the encoding format checked, the inputs read, the prefill run, then one
// vector per input, named key in an item whose "object" is object.
func (s *Server) writeVectors(w http.ResponseWriter, r *http.Request, input json.RawMessage, format, idPrefix, object, key string) {
	if format == "" {
		format = "float"
	}
	if format != "float" && format != "base64" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("encoding_format %q: want float or base64", format), badRequest, "encoding_format")
		return
	}
	inputs, tokens, err := embeddingInputs(input)
	if err != nil {
		writeError(w, http.StatusBadRequest, "input: "+err.Error(), badRequest, "input")
		return
	}
	// An embedding is a prefill alone: it queues and takes the prefill
	// time, without the prefix cache (vLLM's pooling models run without
	// one by default).
	if !s.pool(r, tokens) {
		return
	}
	data := make([]map[string]any, len(inputs))
	for i, in := range inputs {
		data[i] = map[string]any{"index": i, "object": object, key: encodeVector(embed(s.cfg.Model, in), format)}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": s.id(idPrefix), "object": "list", "created": s.now().Unix(), "model": s.cfg.Model,
		"data": data, "usage": usage{PromptTokens: tokens, TotalTokens: tokens},
	})
}

// embeddingInputs splits an embeddings input into the texts to embed (token
// id lists are written out as text) and counts their tokens: the fake
// tokenizer's for text, at least one per input (BOS), and ids for
// pre-tokenised input.
func embeddingInputs(raw json.RawMessage) (inputs []string, tokens int, err error) {
	ids := func(xs []int) string {
		parts := make([]string, len(xs))
		for i, x := range xs {
			parts[i] = strconv.Itoa(x)
		}
		return "ids:" + strings.Join(parts, ",")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return []string{s}, textTokens(s), nil
	}
	var ss []string
	if err := json.Unmarshal(raw, &ss); err == nil && len(ss) > 0 {
		for _, x := range ss {
			tokens += textTokens(x)
		}
		return ss, tokens, nil
	}
	var one []int
	if err := json.Unmarshal(raw, &one); err == nil && len(one) > 0 {
		return []string{ids(one)}, len(one), nil
	}
	var many [][]int
	if err := json.Unmarshal(raw, &many); err == nil && len(many) > 0 {
		for _, xs := range many {
			if len(xs) == 0 {
				return nil, 0, errors.New("an empty list of token ids")
			}
			inputs = append(inputs, ids(xs))
			tokens += len(xs)
		}
		return inputs, tokens, nil
	}
	return nil, 0, errors.New("want a string, a non-empty list of strings or token ids")
}

// embed is the fake embedding of text under model: EmbeddingDims values
// drawn from SHA-256 of the two, scaled to unit length as embedding models'
// outputs are (so cosine similarity is the dot product).
func embed(model, text string) []float32 {
	seed := sha256.Sum256([]byte(model + "\x00" + text))
	v := make([]float32, EmbeddingDims)
	var norm float64
	for i := range v {
		if i%8 == 0 {
			// 8 values of 4 bytes per block: hash (seed, block number).
			seed = sha256.Sum256(append(seed[:], byte(i/8)))
		}
		u := binary.LittleEndian.Uint32(seed[4*(i%8):])
		x := float64(u)/math.MaxUint32*2 - 1
		v[i] = float32(x)
		norm += x * x
	}
	norm = math.Sqrt(norm)
	for i := range v {
		v[i] = float32(float64(v[i]) / norm)
	}
	return v
}

// encodeVector is v as vLLM writes it in encoding_format: the floats, or
// for base64 the float32 vector, little-endian.
func encodeVector(v []float32, format string) any {
	if format != "base64" {
		return v
	}
	b := make([]byte, 4*len(v))
	for j, x := range v {
		binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(x))
	}
	return base64.StdEncoding.EncodeToString(b)
}
