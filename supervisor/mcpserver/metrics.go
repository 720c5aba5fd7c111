package mcpserver

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// newCallHistogram times tool calls by tool, by where they ran (here, or
// forwarded to another node) and by outcome (ok, or error: a tool error
// the caller sees as isError).
func newCallHistogram() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "llmgw_mcp_tool_call_duration_seconds",
		Help:    "MCP tool calls answered by this node, by tool, where they ran (local or forwarded) and outcome (ok or error).",
		Buckets: []float64{0.001, 0.005, 0.025, 0.1, 0.5, 2, 10, 30, 120},
	}, []string{"tool", "where", "outcome"})
}

func (s *Server) observe(tool, where string, start time.Time, isErr bool) {
	outcome := "ok"
	if isErr {
		outcome = "error"
	}
	s.calls.WithLabelValues(tool, where, outcome).Observe(time.Since(start).Seconds())
}

// Describe implements prometheus.Collector.
func (s *Server) Describe(ch chan<- *prometheus.Desc) { s.calls.Describe(ch) }

// Collect implements prometheus.Collector.
func (s *Server) Collect(ch chan<- prometheus.Metric) { s.calls.Collect(ch) }

var _ prometheus.Collector = (*Server)(nil)
