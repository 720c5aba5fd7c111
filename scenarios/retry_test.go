package scenarios

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
)

// TestSDKRetries pins which failures retry=next-gateway sends on: those
// OpenAI's SDKs retry without having seen an answer, and a 503 that says
// when to come back; never an answer the client must see.
func TestSDKRetries(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, c := range []struct {
		name string
		ans  gatewayAnswer
		err  error
		want bool
	}{
		{"refused", gatewayAnswer{}, fmt.Errorf("post: %w", refused), true},
		{"closed before an answer", gatewayAnswer{}, fmt.Errorf("post: %w", io.EOF), true},
		{"reset", gatewayAnswer{}, fmt.Errorf("post: %w", syscall.ECONNRESET), true},
		{"idle connection closed", gatewayAnswer{}, errors.New("http: server closed idle connection"), true},
		{"503 with Retry-After", gatewayAnswer{status: http.StatusServiceUnavailable, retryAfter: true}, errors.New("HTTP 503"), true},
		{"503 without Retry-After", gatewayAnswer{status: http.StatusServiceUnavailable}, errors.New("HTTP 503"), false},
		{"404", gatewayAnswer{status: http.StatusNotFound}, errors.New("HTTP 404"), false},
		{"a stream cut after its head", gatewayAnswer{status: http.StatusOK}, errors.New("stream ended without [DONE]"), false},
		{"timeout", gatewayAnswer{}, errors.New("context deadline exceeded (Client.Timeout exceeded while awaiting headers)"), false},
	} {
		if got := sdkRetries(c.ans, c.err); got != c.want {
			t.Errorf("%s: sdkRetries = %v, want %v", c.name, got, c.want)
		}
	}
}
