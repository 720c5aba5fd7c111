package gateway

import (
	"net"
	"net/http"
	"time"
)

// NewServer returns an http.Server for the gateway's listener (h is the
// Gateway, possibly wrapped by the node). Headers must arrive within 10 s
// and idle keep-alive connections close after 2 min. There is no read or
// write timeout: either would end a long stream that is still producing
// (net/http cancels a request's context when the connection's read
// deadline passes); the gateway bounds the body read itself
// (Config.BodyTimeout).
func NewServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
}

// NewTransport returns the transport the gateway reaches engines with: many
// concurrent streams to a few upstreams, so many idle connections are kept
// per host (a stream holds its connection for minutes, and re-dialling
// for every request adds a round trip). Dialling is bounded, since a dead
// engine host must fail fast enough to retry elsewhere; waiting for
// response headers is not, since a long prompt's prefill comes before
// them. No proxy from the environment: engines are on the cluster's own
// network. Compression is left to the client and the engine, so the
// gateway never decompresses what it passes on.
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy: nil,
		DialContext: (&net.Dialer{
			Timeout:   2 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ReadBufferSize:      32 << 10,
		WriteBufferSize:     32 << 10,
	}
}
