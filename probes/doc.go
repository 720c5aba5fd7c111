// Package probes is the root of what a node reads about itself.
//
//   - probes/gpu: the GPUs (NVML, or simulated behind an explicit flag) and
//     which processes hold their memory.
//   - probes/load: an engine's load from its Prometheus /metrics page.
//   - probes/host: raw host tools (nvidia-smi views, meminfo, ps, network,
//     logs, engine stacks, driver faults) for the MCP server to list and call.
//
// Probes only read. None of them keeps package-level state; clocks, command
// runners and file roots come in through their constructors so tests can
// replace them.
//
// probes/testdata/h200 holds real output from one NVIDIA H200, copied
// unchanged from the project's shared fixtures; its README says how it was
// taken.
package probes
