// Package dgxtest runs the gpu package's NVML discoverer against go-nvml's
// DGX H100 mock server (8 × H100 SXM5 80GB).
//
// It is a package of its own because the mock server imports
// github.com/google/uuid, a module the gpu package itself never needs: its
// go.sum entries concern only these tests.
package dgxtest
