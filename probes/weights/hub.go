package weights

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
)

// DefaultHub is the Hugging Face hub.
const DefaultHub = "https://huggingface.co"

var repoID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$`)

// ValidRepo reports whether s is a hub repository id, ORG/NAME.
func ValidRepo(s string) bool { return repoID.MatchString(s) && !strings.Contains(s, "..") }

// Hub reads one repository's files from a hub by HTTP range requests, as
// the hub's resolve URLs serve them: only the ranges asked for travel.
type Hub struct {
	// Base is the hub's URL, e.g. DefaultHub.
	Base string
	Repo string
	// Revision defaults to main.
	Revision string
	// Token, if set, is sent as a bearer token (HF_TOKEN).
	Token  string
	Client *http.Client
}

// Where is the repository's URL.
func (h *Hub) Where() string { return strings.TrimSuffix(h.Base, "/") + "/" + h.Repo }

func (h *Hub) get(ctx context.Context, name, rng string) (*http.Response, error) {
	if !ValidRepo(h.Repo) {
		return nil, fmt.Errorf("hub repository %q: want ORG/NAME", h.Repo)
	}
	rev := h.Revision
	if rev == "" {
		rev = "main"
	}
	u := h.Where() + "/resolve/" + url.PathEscape(rev) + "/" + url.PathEscape(name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	if h.Token != "" {
		req.Header.Set("Authorization", "Bearer "+h.Token)
	}
	c := h.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", u, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %w", name, ErrNotFound)
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s: the repository is gated or private; give its token as HF_TOKEN in the deployment's env", u, resp.Status)
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		resp.Body.Close()
		return nil, io.EOF
	case resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent:
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s", u, resp.Status)
	}
	return resp, nil
}

// ReadFile reads a small file whole.
func (h *Hub) ReadFile(ctx context.Context, name string, limit int64) ([]byte, error) {
	resp, err := h.get(ctx, name, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is over %d bytes", name, limit)
	}
	return b, nil
}

// ReadRange asks for bytes off to off+n-1. A server that ignores the
// range and answers 200 is read up to the range's end only.
func (h *Hub) ReadRange(ctx context.Context, name string, off, n int64) ([]byte, error) {
	if n <= 0 {
		return nil, nil
	}
	resp, err := h.get(ctx, name, "bytes="+strconv.FormatInt(off, 10)+"-"+strconv.FormatInt(off+n-1, 10))
	if errors.Is(err, io.EOF) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body := io.Reader(resp.Body)
	if resp.StatusCode == http.StatusOK {
		if _, err := io.CopyN(io.Discard, body, off); err != nil {
			return nil, nil
		}
	}
	b, err := io.ReadAll(io.LimitReader(body, n))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return b, nil
}
