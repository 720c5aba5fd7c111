package loadgen

import (
	"math"
	"slices"
	"time"
)

// Report is what a run measured. Times are in milliseconds; the summaries
// cover the requests that succeeded.
type Report struct {
	// Requests is how many were sent; Succeeded and Failed split them.
	Requests  int     `json:"requests"`
	Succeeded int     `json:"succeeded"`
	Failed    int     `json:"failed"`
	DurationS float64 `json:"duration_s"`
	// RequestsPerS and OutputTokensPerS count successful requests and
	// their output tokens (from the answers' usage) over the run's wall
	// time.
	RequestsPerS     float64 `json:"requests_per_s"`
	PromptTokens     int     `json:"prompt_tokens"`
	OutputTokens     int     `json:"output_tokens"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	// TTFB is the time to the first byte of the answer's body (for a
	// stream, the first event, which comes with the first token).
	TTFB    Summary `json:"ttfb_ms"`
	Latency Summary `json:"latency_ms"`
	// Errors counts failures by kind: "connect" (no response), "http N"
	// (a status other than 200), "mid-stream" (the answer broke off, or
	// an error event came), "bad body" (an answer that is not the
	// OpenAI shape) and "canceled" (cut off by the end of the run).
	Errors map[string]int `json:"errors"`
	// Replicas counts the answers each replica gave, as the gateway's
	// Llmgw-Replica header names it (none when the endpoint sets none);
	// ReplicaMaxOverMean is the busiest replica's count over the mean.
	Replicas           map[string]int `json:"replicas"`
	ReplicaMaxOverMean float64        `json:"replica_max_over_mean"`
}

// Summary is a distribution of times in milliseconds.
type Summary struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
}

// aggregate collects results; one goroutine owns it.
type aggregate struct {
	done, failed     int
	ttfb, latency    []float64
	prompt, output   int
	errors, replicas map[string]int
}

func (a *aggregate) add(r result) {
	if a.errors == nil {
		a.errors, a.replicas = map[string]int{}, map[string]int{}
	}
	a.done++
	if r.replica != "" {
		a.replicas[r.replica]++
	}
	if r.kind != "" {
		a.failed++
		a.errors[r.kind]++
		return
	}
	a.ttfb = append(a.ttfb, ms(r.ttfb))
	a.latency = append(a.latency, ms(r.latency))
	a.prompt += r.promptTokens
	a.output += r.outputTokens
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (a *aggregate) report(elapsed time.Duration) Report {
	r := Report{
		Requests: a.done, Succeeded: a.done - a.failed, Failed: a.failed, DurationS: elapsed.Seconds(),
		PromptTokens: a.prompt, OutputTokens: a.output,
		TTFB: summarize(a.ttfb), Latency: summarize(a.latency),
		Errors: a.errors, Replicas: a.replicas,
	}
	if r.Errors == nil {
		r.Errors, r.Replicas = map[string]int{}, map[string]int{}
	}
	if s := elapsed.Seconds(); s > 0 {
		r.RequestsPerS = float64(r.Succeeded) / s
		r.OutputTokensPerS = float64(r.OutputTokens) / s
	}
	if len(r.Replicas) > 0 {
		most, total := 0, 0
		for _, n := range r.Replicas {
			most, total = max(most, n), total+n
		}
		r.ReplicaMaxOverMean = float64(most) / (float64(total) / float64(len(r.Replicas)))
	}
	return r
}

func summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	return Summary{Mean: sum / float64(len(s)), P50: Percentile(s, 50), P90: Percentile(s, 90), P99: Percentile(s, 99)}
}

// Percentile is the p-th percentile (0..100) of sorted values, linearly
// interpolated between the two nearest ranks, as numpy's default (and so
// `vllm bench serve`) computes it. It is NaN for no values.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := min(max(p, 0), 100) / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(rank))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (rank-float64(lo))*(sorted[hi]-sorted[lo])
}
