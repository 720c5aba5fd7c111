// Package gateway is a node's OpenAI-compatible endpoint: POST
// /v1/chat/completions, /v1/completions and /v1/embeddings, proxied to an
// engine replica; GET /v1/models (the deployments with a routable replica)
// and GET /health.
//
// It owns:
//
//   - the routing table (BuildTable), rebuilt from each status.Snapshot the
//     node publishes and swapped atomically (Gateway.Update), never built
//     from records per request. Routable means ready, a valid lease as this
//     node judges it, planned, on a live node (suspect nodes only when
//     nothing else is routable); a gang only through its rank-0 shard and
//     only whole. A lease that lapses between views is skipped at request
//     time.
//   - the choice of replica (Policy; Prefix by default, as the node's
//     --gateway-policy), fed with the engines' running and waiting
//     requests as the gateway scrapes them (at most every second, only for
//     deployments with traffic, the gossiped load as the fallback),
//     corrected by the gateway's own requests since the scrape.
//   - retries before the first byte, passive outlier ejection with a panic
//     mode, streaming of server-sent events event by event with an error
//     event when the engine dies mid-stream, and cancellation of the
//     upstream request when the client goes away.
//   - telling busy from dead (see exchange.forward). Ejection counts, in a
//     row, connection failures, 500/502/504 answers and first-byte
//     timeouts; 429 and 503 say busy and never count. 502/504 are tried on another
//     replica like a failed connection; 500 is relayed. The first byte of
//     an answer is awaited for the engine profile's
//     Readiness.FirstByteTimeout (Config.FirstByteTimeout overrides it),
//     then 504, not retried; after it, a gap between two reads longer than
//     Readiness.StreamIdleTimeout (Config.StreamIdleTimeout) cuts the
//     answer: a stream ends with an error event, a plain answer is
//     aborted. A plain answer's status goes out only with its first byte.
//   - letting go of an engine that leaves routing unready (Update): its
//     requests in flight are cut, tried elsewhere (else 503) when the
//     client has nothing yet, a stream ended with an error event; a
//     stopping or draining copy's requests finish whole.
//   - client API keys (KeySet, LoadKeys, Gateway.SetKeys) and the engines'
//     own keys (Config.EngineKey), errors in OpenAI's shape, admission
//     (Config.MaxInflight).
//   - holding, until the node has settled (status.Snapshot.Settled), a
//     request its partial view cannot route, rather than answer 404 for a
//     model it has not heard of yet (settle.go); /health says 503 then.
//   - holding, within bounds, a request for a deployment that scales
//     from zero and has no replica, until one is routable: counted in the
//     published rates, which wake it; a stream gets its 200 and comments
//     meanwhile (wake.go).
//   - stopping without closing a connection under a request (Server:
//     Drain, then the listener, then idle connections after a grace, all
//     within the drain's bound; server.go).
//   - its metrics (the Gateway is a prometheus.Collector), the access log
//     (written off the request path) and recent per-deployment figures for
//     `llmgw top` (Gateway.Stats).
//
// The node owns the rest: flags, the listener and TLS (NewServer serves
// on it with the timeouts and stops it), lifecycle, and reloading keys on
// SIGHUP.
//
// The request body is read whole (capped) and parsed only as far as
// routing needs: model, stream and the endpoint's required field. The only
// change made to it is the model, rewritten to the deployment name when
// the client named the deployment's model id, since engines serve the
// deployment name.
//
// Where things are:
//
//   - gateway.go: Config, New, Update (the table and letting go of
//     engines), the surface (ServeHTTP, /v1/models, /health), keys.
//   - exchange.go: one proxied request (exchange) from reading its body to
//     its count and log line (finish). The attempt loop, the relay and the
//     books below are the exchange's methods; the Gateway keeps what
//     requests share.
//   - attempt.go: the attempt loop (exchange.forward): the choice of
//     replica (Gateway.choose), the retry and ejection rules, one
//     attempt's send.
//   - relay.go: the answer's way to the client: the plain body, events
//     one by one, the first-byte and stream-idle timers.
//   - account.go: an attempt's books, closed in one place (exchange.done):
//     in-flight counts, upstream errors, failures and ejections, the log's
//     replica.
//   - loadestimate.go, health.go, replica.go: what the gateway learns of
//     one engine (its load; its failures and ejection; its attempts in
//     flight, cut when it leaves routing).
//   - scan.go: the JSON scanners every request body goes through;
//     request.go reads a body with them, prefix.go keys a prompt.
//   - settle.go: holding requests until the node settles; wake.go, until
//     a deployment at zero wakes; server.go: the
//     http.Server, its connections, and the stop (Server.Shutdown).
//   - policy.go, prefix.go: the policies; table.go: the routing table;
//     scrape.go: load scrapes; limits.go, keys.go: per-key limits and the
//     keys file; errors.go, metrics.go, accesslog.go, stats.go: the
//     answers, figures and log the gateway gives.
package gateway
