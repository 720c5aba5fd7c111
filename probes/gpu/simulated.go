package gpu

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/llmgw/llmgw/placement"
)

// maxSimulated bounds a spec so a typo ("8000xH100") is an error, not a
// node record too large to gossip.
const maxSimulated = 1024

// simulatedForm is quoted in every parse error.
const simulatedForm = "<count>x<model>-<memory>GB, comma-separated, for example 4xH100-80GB,2xL40S-48GB"

// ParseSimulated turns a spec such as "4xH100-80GB,2xL40S-48GB" ("×" works
// for "x") into GPUs named like NVML names them ("NVIDIA H100 80GB"), indexed
// from 0 in spec order, each with the stated memory in GiB (GPU makers'
// "80GB" is 80 GiB) and nothing used.
//
// seed is the node name. UUIDs are derived from it and the index, so they
// are stable across restarts and differ between nodes: two simulated nodes
// sharing UUIDs would look like one node's GPUs advertised twice. Simulated
// GPUs have no PCI address and no NVLink.
func ParseSimulated(spec, seed string) ([]placement.GPU, error) {
	if seed == "" {
		return nil, errors.New("simulated GPUs: a seed (the node name) is required so that nodes get different UUIDs")
	}
	if strings.TrimSpace(spec) == "" {
		return nil, fmt.Errorf("simulated GPUs: empty spec; want %s", simulatedForm)
	}
	var out []placement.GPU
	for i, part := range strings.Split(spec, ",") {
		count, model, gib, err := parseSimulatedPart(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("simulated GPUs: part %d %q: %v; want %s", i+1, part, err, simulatedForm)
		}
		if len(out)+count > maxSimulated {
			return nil, fmt.Errorf("simulated GPUs: more than %d GPUs in %q", maxSimulated, spec)
		}
		for range count {
			idx := len(out)
			out = append(out, placement.GPU{
				Index:       idx,
				UUID:        simulatedUUID(seed, idx),
				Name:        fmt.Sprintf("NVIDIA %s %dGB", model, gib),
				MemoryTotal: gib << 30,
			})
		}
	}
	return out, nil
}

func parseSimulatedPart(p string) (count int, model string, gib uint64, err error) {
	digits := strings.IndexFunc(p, func(r rune) bool { return r < '0' || r > '9' })
	if digits <= 0 {
		return 0, "", 0, errors.New("does not start with a count")
	}
	count, err = strconv.Atoi(p[:digits])
	if err != nil || count < 1 {
		return 0, "", 0, errors.New("count must be a positive number")
	}
	rest := p[digits:]
	sep, size := utf8.DecodeRuneInString(rest)
	if sep != 'x' && sep != 'X' && sep != '×' {
		return 0, "", 0, errors.New(`no "x" after the count`)
	}
	rest = rest[size:]
	dash := strings.LastIndexByte(rest, '-')
	if dash < 0 {
		return 0, "", 0, errors.New(`no "-<memory>GB" after the model`)
	}
	model, mem := rest[:dash], rest[dash+1:]
	if model == "" {
		return 0, "", 0, errors.New("no model")
	}
	for _, r := range model {
		if r > unicode.MaxASCII || !(unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_' || r == '.') {
			return 0, "", 0, fmt.Errorf("model %q may hold only letters, digits, '-', '_' and '.'", model)
		}
	}
	num, ok := strings.CutSuffix(strings.ToUpper(mem), "GB")
	if !ok {
		return 0, "", 0, fmt.Errorf("memory %q does not end in GB", mem)
	}
	gib, err = strconv.ParseUint(num, 10, 32)
	if err != nil || gib == 0 {
		return 0, "", 0, fmt.Errorf("memory %q is not a positive whole number of GB", mem)
	}
	return count, model, gib, nil
}

// simulatedUUID formats a hash of seed and index the way NVML formats UUIDs.
func simulatedUUID(seed string, index int) string {
	h := sha256.Sum256([]byte("llmgw-simulated-gpu\x00" + seed + "\x00" + strconv.Itoa(index)))
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// Simulated is a Discoverer that returns fixed GPUs. It exists for clusters
// without GPUs (development, scenarios) and is used only when the operator
// asks for it.
type Simulated struct {
	gpus []placement.GPU
}

var _ Probe = (*Simulated)(nil)

// NewSimulated parses spec (see ParseSimulated) into a Discoverer.
func NewSimulated(spec, seed string) (*Simulated, error) {
	gpus, err := ParseSimulated(spec, seed)
	if err != nil {
		return nil, err
	}
	return &Simulated{gpus: gpus}, nil
}

// Discover returns the simulated GPUs, marked Simulated, with no processes
// and each GPU's SimulatedReserved.
func (s *Simulated) Discover(ctx context.Context) (Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return Snapshot{}, err
	}
	reserved := make(map[int]uint64, len(s.gpus))
	for _, g := range s.gpus {
		reserved[g.Index] = SimulatedReserved(g.MemoryTotal)
	}
	return Snapshot{GPUs: cloneGPUs(s.gpus), Reserved: reserved, Driver: "simulated", Available: true, Simulated: true}, nil
}

// The one reading of driver-reserved memory at hand: an H200 with 143,771
// MiB reported 616 MiB reserved (nvidia-smi -q on the fixture machine,
// see ../shared/fixtures/h200). The driver's reservation grows with the
// card's memory, so simulated GPUs get the same share of theirs: about
// 351 MiB on an 80 GiB GPU, 211 MiB on a 48 GiB one. A fixed figure (0.5
// GiB) would be below the one measured card and above small ones.
const (
	h200ReservedMiB = 616
	h200TotalMiB    = 143771
)

// SimulatedReserved is the driver-reserved memory a simulated GPU of total
// bytes reports: the H200's share, rounded up to whole MiB. Placement
// rounds foreign memory up to whole GiB, so any GPU of up to 233 GiB loses
// one GiB to it, as a real one does, and an empty one still counts as
// empty for a whole-GPU shard (at most 1 GiB of foreign memory).
func SimulatedReserved(total uint64) uint64 {
	const mib = 1 << 20
	totalMiB := (total + mib - 1) / mib
	return (totalMiB*h200ReservedMiB + h200TotalMiB - 1) / h200TotalMiB * mib
}

// Close does nothing; it lets Simulated stand where a Probe is expected.
func (s *Simulated) Close() error { return nil }

// Telemetry reads nothing: simulated GPUs run no kernels and draw no
// power, and a made-up reading would look like a real one on the page.
func (s *Simulated) Telemetry(ctx context.Context) ([]Telemetry, error) { return nil, ctx.Err() }

// Claim is memory an engine holds on one GPU: Bytes of it, or the whole
// GPU when Bytes is 0.
type Claim struct {
	Index int
	Bytes uint64
}

// WithClaims is what simulated GPUs read when engines hold what they
// claimed: each GPU's used memory is the sum of its claims (a whole-GPU
// claim fills it), at most its total. Real GPUs report what engines use;
// simulated ones have nothing to report, and would always read as empty
// in views that look like a real cluster's.
func WithClaims(gpus []placement.GPU, claims []Claim) []placement.GPU {
	out := cloneGPUs(gpus)
	for i := range out {
		var used uint64
		for _, c := range claims {
			if c.Index != out[i].Index {
				continue
			}
			if c.Bytes == 0 {
				used = out[i].MemoryTotal
				break
			}
			used += c.Bytes
		}
		out[i].MemoryUsed = min(used, out[i].MemoryTotal)
	}
	return out
}
