package gateway

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"unicode"
)

// MinKeyLength is the shortest API key a keys file may hold: a short key can
// be guessed over the network.
const MinKeyLength = 16

// KeySet is the set of API keys the gateway accepts, each with an optional
// name for the access log. It is immutable; the gateway swaps whole sets.
type KeySet struct {
	keys []apiKey
}

type apiKey struct {
	// sum is the key's SHA-256: comparing fixed-size digests in constant
	// time hides the keys' lengths as well as their contents.
	sum  [sha256.Size]byte
	name string
	lim  Limits
	// class is the key's requests' priority in the gateway's queue
	// (priority=; PriorityDefault when the line gives none).
	class Priority
}

// Limits bound what one key may ask of the gateway; zero fields are
// unbounded.
type Limits struct {
	// RPS is the sustained requests per second (a token bucket), Burst the
	// requests it may take at once above that (RPS rounded up when zero).
	RPS   float64
	Burst int
	// Concurrent is how many of the key's requests may be in flight.
	Concurrent int
}

// label is how the key appears in metrics: its name, or, for a key without
// one, a short digest of it (never the key).
func (k *apiKey) label() string {
	if k.name != "" {
		return k.name
	}
	return fmt.Sprintf("sha256:%x", k.sum[:4])
}

// ErrNoKeys is returned for a keys file that holds no key: an operator who
// gives one means to require keys, and an empty set would refuse everyone.
var ErrNoKeys = errors.New("gateway keys: no key in the file")

// LoadKeys reads a keys file: one key per line, optionally followed by
// whitespace and a name (which may contain spaces) and options, as in
//
//	sk-team-a-0123456789abcdef  team a  rps=20 burst=40 concurrency=8 priority=batch
//
// (rps: requests per second sustained; burst: requests at once above it;
// concurrency: requests in flight; priority: the class of the key's
// requests when they wait in the gateway's queue, interactive, default or
// batch, default when absent). Blank lines and lines starting with
// '#' are skipped. Errors name the file and line.
func LoadKeys(path string) (*KeySet, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gateway keys: %w", err)
	}
	defer f.Close()
	ks, err := ParseKeys(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ks, nil
}

// ParseKeys reads keys in LoadKeys's format.
func ParseKeys(r io.Reader) (*KeySet, error) {
	ks := &KeySet{}
	seen := map[[sha256.Size]byte]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, rest := line, ""
		if i := strings.IndexFunc(line, unicode.IsSpace); i >= 0 {
			key, rest = line[:i], strings.TrimSpace(line[i:])
		}
		name, lim, class, err := parseKeyOptions(rest)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if len(key) < MinKeyLength {
			return nil, fmt.Errorf("line %d: key is %d characters; want at least %d", n, len(key), MinKeyLength)
		}
		sum := sha256.Sum256([]byte(key))
		if prev, dup := seen[sum]; dup {
			return nil, fmt.Errorf("line %d: the key of line %d again", n, prev)
		}
		seen[sum] = n
		ks.keys = append(ks.keys, apiKey{sum: sum, name: name, lim: lim, class: class})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("gateway keys: %w", err)
	}
	if len(ks.keys) == 0 {
		return nil, ErrNoKeys
	}
	return ks, nil
}

// Len is the number of keys.
func (ks *KeySet) Len() int { return len(ks.keys) }

// Check reports whether key is in the set, and its name. Every key is
// compared, so the time taken says nothing about which one matched.
func (ks *KeySet) Check(key string) (name string, ok bool) {
	k := ks.find(key)
	if k == nil {
		return "", false
	}
	return k.name, true
}

func (ks *KeySet) find(key string) *apiKey {
	sum := sha256.Sum256([]byte(key))
	found := -1
	for i := range ks.keys {
		if subtle.ConstantTimeCompare(sum[:], ks.keys[i].sum[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return nil
	}
	return &ks.keys[found]
}

// parseKeyOptions splits what follows a key into its name, its limits and
// its priority class: the trailing words of the form option=value.
func parseKeyOptions(rest string) (string, Limits, Priority, error) {
	var lim Limits
	class := PriorityDefault
	words := strings.Fields(rest)
	i := len(words)
	for i > 0 && strings.Contains(words[i-1], "=") {
		i--
	}
	for _, w := range words[i:] {
		opt, val, _ := strings.Cut(w, "=")
		switch opt {
		case "rps":
			f, err := strconv.ParseFloat(val, 64)
			if err != nil || f <= 0 || f > 1e6 {
				return "", lim, class, fmt.Errorf("rps=%s: want requests per second, a number above 0", val)
			}
			lim.RPS = f
		case "burst", "concurrency":
			v, err := strconv.Atoi(val)
			if err != nil || v < 1 || v > 1e6 {
				return "", lim, class, fmt.Errorf("%s=%s: want a whole number, at least 1", opt, val)
			}
			if opt == "burst" {
				lim.Burst = v
			} else {
				lim.Concurrent = v
			}
		case "priority":
			p, ok := ParsePriority(val)
			if !ok {
				return "", lim, class, fmt.Errorf("priority=%s: want %s", val, priorityWords)
			}
			class = p
		default:
			return "", lim, class, fmt.Errorf("unknown option %q: want rps=, burst=, concurrency= or priority=", w)
		}
	}
	if lim.Burst > 0 && lim.RPS == 0 {
		return "", lim, class, errors.New("burst= without rps=: a burst is over a rate; give rps= too")
	}
	return strings.Join(words[:i], " "), lim, class, nil
}
