package gateway

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"os"
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
}

// ErrNoKeys is returned for a keys file that holds no key: an operator who
// gives one means to require keys, and an empty set would refuse everyone.
var ErrNoKeys = errors.New("gateway keys: no key in the file")

// LoadKeys reads a keys file: one key per line, optionally followed by
// whitespace and a name (which may contain spaces); blank lines and lines
// starting with '#' are skipped. Errors name the file and line.
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
		key, name := line, ""
		if i := strings.IndexFunc(line, unicode.IsSpace); i >= 0 {
			key, name = line[:i], strings.TrimSpace(line[i:])
		}
		if len(key) < MinKeyLength {
			return nil, fmt.Errorf("line %d: key is %d characters; want at least %d", n, len(key), MinKeyLength)
		}
		sum := sha256.Sum256([]byte(key))
		if prev, dup := seen[sum]; dup {
			return nil, fmt.Errorf("line %d: the key of line %d again", n, prev)
		}
		seen[sum] = n
		ks.keys = append(ks.keys, apiKey{sum: sum, name: name})
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
	sum := sha256.Sum256([]byte(key))
	found := 0
	for i := range ks.keys {
		if subtle.ConstantTimeCompare(sum[:], ks.keys[i].sum[:]) == 1 {
			found, name = 1, ks.keys[i].name
		}
	}
	return name, found == 1
}

// bearer extracts the token of an "Authorization: Bearer <token>" header.
func bearer(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}
