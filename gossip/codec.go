package gossip

import (
	"bytes"
	"compress/flate"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
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
	// maxRecordBytes bounds one node or deployment record's bytes. A record
	// is kept and relayed in its bytes, fields this build does not know
	// included, and the record checks bound only the fields it knows: without
	// this a peer could make every node hold and resend an unknown field of
	// any size. A real record is far below it (an 8-GPU node serving 16
	// shards: 7 KB; a spec the API accepts: under 1 MiB).
	maxRecordBytes = 4 << 20
)

// message is the envelope for broadcasts, reliable sends and full state.
// On the wire it is a JSON object with the lists "nodes", "deployments"
// and "beats", and "from", "wants" and "renews", each left out when empty.
type message struct {
	Nodes       []NodeRecord
	Deployments []DeploymentRecord
	Beats       []Beat
	// From and Wants ask the named nodes to send their records to From:
	// a node that sees a beat for content it does not have repairs at once
	// instead of waiting for the next push/pull. From is also the sender
	// of a beat its origin sent itself (Cluster.beatToAll).
	From  string
	Wants []string
	// Renews asks the named nodes to send From their newest beat: From
	// has not heard one for longer than a lost beat explains (askStale).
	// An agent of an earlier release ignores it.
	Renews []string

	// nodeRaw[i] and depRaw[i], where present and not nil, are the bytes
	// Nodes[i] and Deployments[i] travel in: those they arrived in, or
	// those their writer encoded. encode writes them instead of encoding
	// the struct, so the fields a later release added, which this build
	// does not decode, pass this node unchanged.
	nodeRaw, depRaw []json.RawMessage
	// bad holds the records (and envelope fields) that did not decode:
	// each is dropped alone, and the rest of the message is taken.
	bad []badRecord
}

// badRecord is one record of a message that did not decode.
type badRecord struct {
	// what names it for the log: `node "n1"`, or its place in its list
	// when not even its name decodes.
	what string
	err  error
}

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("malformed gossip message")

func encode(m message) ([]byte, error) {
	// The envelope is written by hand: a record's raw bytes go out as they
	// are, where json.Marshal would compact and escape each again.
	var raw bytes.Buffer
	raw.WriteByte('{')
	n := 0
	field := func(name string) {
		if n > 0 {
			raw.WriteByte(',')
		}
		n++
		raw.WriteString(`"` + name + `":`)
	}
	if len(m.Nodes) > 0 {
		field("nodes")
		if err := writeList(&raw, m.Nodes, m.nodeRaw); err != nil {
			return nil, fmt.Errorf("encode gossip message: %w", err)
		}
	}
	if len(m.Deployments) > 0 {
		field("deployments")
		if err := writeList(&raw, m.Deployments, m.depRaw); err != nil {
			return nil, fmt.Errorf("encode gossip message: %w", err)
		}
	}
	for _, f := range []struct {
		name  string
		value any
		empty bool
	}{{"beats", m.Beats, len(m.Beats) == 0}, {"from", m.From, m.From == ""}, {"wants", m.Wants, len(m.Wants) == 0}, {"renews", m.Renews, len(m.Renews) == 0}} {
		if f.empty {
			continue
		}
		b, err := json.Marshal(f.value)
		if err != nil {
			return nil, fmt.Errorf("encode gossip message: %s: %w", f.name, err)
		}
		field(f.name)
		raw.Write(b)
	}
	raw.WriteByte('}')
	var buf bytes.Buffer
	buf.WriteByte(formatDeflateJSON)
	w := getFlateWriter(raw.Len())
	defer putFlateWriter(w, raw.Len())
	w.Reset(&buf)
	if _, err := w.Write(raw.Bytes()); err != nil {
		return nil, fmt.Errorf("encode gossip message: %w", err)
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("encode gossip message: %w", err)
	}
	return buf.Bytes(), nil
}

// flateWriters and flateReaders keep deflate's state between messages: a
// new writer allocates 790 KiB and a reader 40 KiB (testing.Benchmark),
// and every message sent, relayed or received needs one, which on an idle 40-node cluster was
// most of an agent's garbage and a fifth of its CPU (measured with
// --debug-addr's CPU profile).
//
// Writers wait in a small channel rather than a sync.Pool, which the
// garbage collector empties at every cycle: on an agent that collects
// every few seconds, a pool would hand out a new 790 KiB writer as often.
//
// A small message (a beat, a want: most of what an idle cluster sends)
// takes a writer at BestSpeed: resetting one at the default level clears
// 640 KiB of match tables, which cost more than deflating the message
// (BenchmarkEncodeBeat). Any level is the same deflate stream to a reader.
var (
	flateWriters      = make(chan *flate.Writer, 4)
	flateSmallWriters = make(chan *flate.Writer, 4)
	flateReaders      = sync.Pool{New: func() any { return flate.NewReader(bytes.NewReader(nil)) }}
)

// smallMessage is the size of JSON, in bytes, below which a message is
// deflated at BestSpeed.
const smallMessage = 1024

func flateCache(size int) (chan *flate.Writer, int) {
	if size < smallMessage {
		return flateSmallWriters, flate.BestSpeed
	}
	return flateWriters, flate.DefaultCompression
}

func getFlateWriter(size int) *flate.Writer {
	cache, level := flateCache(size)
	select {
	case w := <-cache:
		return w
	default:
		w, err := flate.NewWriter(nil, level)
		if err != nil {
			panic(err) // only for an invalid level
		}
		return w
	}
}

func putFlateWriter(w *flate.Writer, size int) {
	cache, _ := flateCache(size)
	select {
	case cache <- w:
	default:
	}
}

// writeList writes recs as a JSON array, each record as its raw bytes
// where raws has them, encoded otherwise.
func writeList[R any](w *bytes.Buffer, recs []R, raws []json.RawMessage) error {
	w.WriteByte('[')
	for i := range recs {
		if i > 0 {
			w.WriteByte(',')
		}
		if raw := rawAt(raws, i); raw != nil {
			w.Write(raw)
			continue
		}
		b, err := json.Marshal(recs[i])
		if err != nil {
			return err
		}
		w.Write(b)
	}
	w.WriteByte(']')
	return nil
}

// rawAt is raws[i], or nil where raws does not reach: a message built in
// this node may carry records without their bytes.
func rawAt(raws []json.RawMessage, i int) json.RawMessage {
	if i < len(raws) {
		return raws[i]
	}
	return nil
}

// envelope is how decode reads a message: each list as the raw bytes of
// its records, which are decoded one by one.
type envelope struct {
	Nodes       []json.RawMessage `json:"nodes"`
	Deployments []json.RawMessage `json:"deployments"`
	Beats       []json.RawMessage `json:"beats"`
	From        string            `json:"from"`
	Wants       []string          `json:"wants"`
	Renews      []string          `json:"renews"`
}

// decode reads a message. Only a message that does not inflate, is not
// JSON, or is not an object fails whole; every record is decoded on its
// own, and one that does not decode (a later release changed a field's
// type, say) is left out and listed in bad, so that it costs that record
// and not the message: a push/pull carries the whole state, and an older
// node would otherwise be blind to every message that holds one.
func decode(b []byte) (message, error) {
	var m message
	if len(b) == 0 {
		return m, fmt.Errorf("%w: empty", ErrMalformed)
	}
	if b[0] != formatDeflateJSON {
		return m, fmt.Errorf("%w: unknown format %d", ErrMalformed, b[0])
	}
	r := flateReaders.Get().(io.ReadCloser)
	defer flateReaders.Put(r)
	if err := r.(flate.Resetter).Reset(bytes.NewReader(b[1:]), nil); err != nil {
		return m, fmt.Errorf("%w: inflate: %v", ErrMalformed, err)
	}
	raw, err := io.ReadAll(io.LimitReader(r, maxDecoded+1))
	if err != nil {
		return m, fmt.Errorf("%w: inflate: %v", ErrMalformed, err)
	}
	if len(raw) > maxDecoded {
		return m, fmt.Errorf("%w: larger than %d bytes", ErrMalformed, maxDecoded)
	}
	var env envelope
	if err := json.Unmarshal(raw, &env); err != nil {
		// A value of the wrong type in one of the envelope's fields
		// (json.Unmarshal fills the others and reports the first such
		// field) costs that field; anything else is no message of ours.
		var te *json.UnmarshalTypeError
		if !errors.As(err, &te) || te.Field == "" {
			return m, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		m.bad = append(m.bad, badRecord{what: "message field " + te.Field, err: err})
	}
	// Each record's bytes are a copy of their own (json.RawMessage copies),
	// so a record the store keeps does not pin the whole message.
	for i, rb := range env.Nodes {
		var n NodeRecord
		if err := unmarshalRecord(rb, &n); err != nil {
			m.bad = append(m.bad, badRecord{what: recordName("node", rb, i, len(env.Nodes)), err: err})
			continue
		}
		m.Nodes = append(m.Nodes, n)
		m.nodeRaw = append(m.nodeRaw, rb)
	}
	for i, rb := range env.Deployments {
		var d DeploymentRecord
		if err := unmarshalRecord(rb, &d); err != nil {
			m.bad = append(m.bad, badRecord{what: recordName("deployment", rb, i, len(env.Deployments)), err: err})
			continue
		}
		m.Deployments = append(m.Deployments, d)
		m.depRaw = append(m.depRaw, rb)
	}
	for i, rb := range env.Beats {
		var bt Beat
		if err := json.Unmarshal(rb, &bt); err != nil {
			m.bad = append(m.bad, badRecord{what: recordName("beat", rb, i, len(env.Beats)), err: err})
			continue
		}
		m.Beats = append(m.Beats, bt)
	}
	m.From, m.Wants, m.Renews = env.From, env.Wants, env.Renews
	// Records are checked one by one by the receiver (validate.go), not
	// here: one bad record must not cost the rest of the message.
	return m, nil
}

// unmarshalRecord decodes one node or deployment record of at most
// maxRecordBytes.
func unmarshalRecord(raw json.RawMessage, rec any) error {
	if len(raw) > maxRecordBytes {
		return fmt.Errorf("%d bytes, more than a record may have (%d)", len(raw), maxRecordBytes)
	}
	return json.Unmarshal(raw, rec)
}

// recordName names a record that did not decode: by its name (cut at 64
// characters: it comes from a peer and goes to the log) if that much of it
// decodes, by its place in its list otherwise.
func recordName(kind string, raw json.RawMessage, i, n int) string {
	var named struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(raw, &named) == nil && named.Name != "" {
		return fmt.Sprintf("%s %.64q", kind, named.Name)
	}
	return fmt.Sprintf("%s record %d of %d", kind, i+1, n)
}
