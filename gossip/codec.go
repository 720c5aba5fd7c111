package gossip

import (
	"bytes"
	"compress/flate"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Wire format: one byte naming the format, then a deflate-compressed JSON
// envelope. JSON keeps the records readable in debugging and tolerant of new
// fields across agent versions; deflate brings an 8-GPU record under one UDP
// packet most of the time.
const (
	formatDeflateJSON byte = 1
	// maxDecoded bounds what a message may inflate to, so a small malicious
	// packet cannot expand into gigabytes.
	maxDecoded = 32 << 20
)

// message is the envelope for broadcasts, reliable sends and full state.
type message struct {
	Nodes       []NodeRecord       `json:"nodes,omitempty"`
	Deployments []DeploymentRecord `json:"deployments,omitempty"`
	Beats       []Beat             `json:"beats,omitempty"`
	// From and Wants ask the named nodes to send their records to From:
	// a node that sees a beat for content it does not have repairs at once
	// instead of waiting for the next push/pull.
	From  string   `json:"from,omitempty"`
	Wants []string `json:"wants,omitempty"`
}

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("malformed gossip message")

func encode(m message) ([]byte, error) {
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode gossip message: %w", err)
	}
	var buf bytes.Buffer
	buf.WriteByte(formatDeflateJSON)
	w, err := flate.NewWriter(&buf, flate.DefaultCompression)
	if err != nil {
		return nil, fmt.Errorf("encode gossip message: %w", err)
	}
	if _, err := w.Write(raw); err != nil {
		return nil, fmt.Errorf("encode gossip message: %w", err)
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("encode gossip message: %w", err)
	}
	return buf.Bytes(), nil
}

func decode(b []byte) (message, error) {
	var m message
	if len(b) == 0 {
		return m, fmt.Errorf("%w: empty", ErrMalformed)
	}
	if b[0] != formatDeflateJSON {
		return m, fmt.Errorf("%w: unknown format %d", ErrMalformed, b[0])
	}
	r := flate.NewReader(bytes.NewReader(b[1:]))
	defer r.Close()
	raw, err := io.ReadAll(io.LimitReader(r, maxDecoded+1))
	if err != nil {
		return m, fmt.Errorf("%w: inflate: %v", ErrMalformed, err)
	}
	if len(raw) > maxDecoded {
		return m, fmt.Errorf("%w: larger than %d bytes", ErrMalformed, maxDecoded)
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return m, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	for _, n := range m.Nodes {
		if n.Name == "" {
			return message{}, fmt.Errorf("%w: node record without a name", ErrMalformed)
		}
	}
	for _, d := range m.Deployments {
		if err := checkDeploymentRecord(d); err != nil {
			return message{}, fmt.Errorf("%w: %w", ErrMalformed, err)
		}
	}
	return m, nil
}

// checkDeploymentRecord is what every deployment record from outside the
// store must be, from a peer's message or from deployments.json: named,
// with a spec of that name unless it is a tombstone.
func checkDeploymentRecord(d DeploymentRecord) error {
	if d.Name == "" || (!d.Deleted && d.Spec == nil) {
		return errors.New("deployment record without name or spec")
	}
	if d.Spec != nil && d.Spec.Name != d.Name {
		return fmt.Errorf("deployment record %q carries spec %q", d.Name, d.Spec.Name)
	}
	return nil
}
