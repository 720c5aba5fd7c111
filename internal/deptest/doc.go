// Package deptest holds the module's import rules as a test: which layer
// may import which, read from `go list` over the whole module, so a
// forbidden import fails `make test` instead of waiting for a review.
package deptest
