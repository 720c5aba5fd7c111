package placement

import (
	"encoding/json"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Bytes is a size in bytes that reads and writes as "70GiB" in JSON and YAML
// (a plain number of bytes is accepted too).
type Bytes uint64

var byteUnits = []struct {
	suffix string
	mult   uint64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1},
}

// ParseBytes reads "70GiB", "80GB", "512MiB" or a plain byte count.
func ParseBytes(s string) (Bytes, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty size: want e.g. 70GiB")
	}
	for _, u := range byteUnits {
		if num, ok := strings.CutSuffix(t, u.suffix); ok {
			num = strings.TrimSpace(num)
			// Whole numbers are parsed exactly: a float64 holds only 53 bits,
			// so "9007199254740993B" would otherwise come back one byte off
			// and String's output would not round-trip.
			if n, err := strconv.ParseUint(num, 10, 64); err == nil {
				hi, lo := bits.Mul64(n, u.mult)
				if hi != 0 {
					return 0, fmt.Errorf("size %q is larger than 16EiB", s)
				}
				return Bytes(lo), nil
			}
			f, err := strconv.ParseFloat(num, 64)
			// !(f >= 0) also rejects NaN, which compares false with everything.
			if err != nil || !(f >= 0) || f*float64(u.mult) > 1<<62 {
				return 0, fmt.Errorf("size %q: want a non-negative number and a unit, e.g. 70GiB", s)
			}
			return Bytes(f * float64(u.mult)), nil
		}
	}
	n, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: want a number with a unit (KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 70GiB", s)
	}
	return Bytes(n), nil
}

// String writes the size exactly, in the largest binary unit that divides
// it, e.g. "70GiB" or "1536MiB". It round-trips through ParseBytes.
func (b Bytes) String() string {
	for _, u := range byteUnits[:4] {
		if uint64(b) >= u.mult && uint64(b)%u.mult == 0 {
			return strconv.FormatUint(uint64(b)/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatUint(uint64(b), 10) + "B"
}

// MarshalJSON writes the size as a string such as "70GiB".
func (b Bytes) MarshalJSON() ([]byte, error) { return json.Marshal(b.String()) }

// UnmarshalJSON accepts "70GiB" or a number of bytes. JSON null leaves b
// unchanged, as encoding/json does for built-in types.
func (b *Bytes) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		var n uint64
		if err2 := json.Unmarshal(data, &n); err2 != nil {
			return fmt.Errorf("gpu_memory: want a size such as \"70GiB\" or a number of bytes")
		}
		*b = Bytes(n)
		return nil
	}
	v, err := ParseBytes(s)
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// Duration is a length of time that reads and writes as "2h" or "90m" in
// JSON and YAML (Go's duration syntax), for spec fields that people type.
type Duration time.Duration

// String writes d as Go does ("2h0m0s").
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes the duration as a string such as "2h0m0s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON accepts "2h", "90m" or "1h30m". JSON null leaves d
// unchanged, as encoding/json does for built-in types.
func (d *Duration) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("want a duration such as \"2h\" or \"90m\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}
