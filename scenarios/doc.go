// Package scenarios runs declarative multi-node scenarios against real
// `llmgw node up` processes on one machine (on loopback, or each in a
// network namespace of its own): failover, partitions, restarts, rolling
// updates and scale, each written as a runbook that doubles as a test.
// Run(ctx, Options, file) runs one file; scenarios_test.go runs
// testdata/*.txt and prints a summary table.
//
// This comment is the whole grammar of a scenario file, in one place:
// every command with its keys, every condition of wait-until and every
// form of expect. runner.go's commandTable lists the commands and keys the
// runner accepts; cmd_wait.go's condition the conditions; cmd_expect.go's
// cmdExpect the forms of expect.
//
// # Files
//
// A scenario file (testdata/*.txt) is a sequence of commands in the style of
// cockroachdb/datadriven. Each command is one line, followed by a line
// "----" and the output the command must print, which ends at the first
// blank line. An output that itself contains blank lines is fenced by two
// "----" lines before and after it. Lines starting with '#' and blank lines
// between commands are comments. Header comments before the first command:
//
//	# labels: short            short runs in `make test`; slow, pending, ... only with -all
//	# requires: process-runtime   skipped while the binary cannot run engines
//	# requires: netns             skipped where network namespaces cannot be made
//
// A command is `NAME positional... key=value key=(a,b,c)`. Values with
// spaces are double-quoted; a list may also be written key=a,b. Every
// argument must be used: an unknown command, an unknown key or a leftover
// argument fails the scenario, as does a malformed file. Errors of the
// system under test (an HTTP 400, a node that exits, a condition that never
// comes true) are not failures of the file: they are printed as the
// command's output, so a scenario fails when they were not expected and can
// assert them when they were. The first output that differs from the file
// fails the scenario and the remaining commands are not run (but the
// remaining measure commands still record, for the summary, what their
// events allow). With -rewrite every command runs and the file is rewritten
// with the actual outputs.
//
// Outputs are deterministic: no times, pids, ports or claim stamps. Times
// are measured with `measure` and go to the summary, not to the output.
// There is no sleep: wait for a condition with wait-until.
//
// # Nodes
//
// Nodes are named n1, n2, ... by `cluster`, or as given to `add-node`. A
// NODE argument is a name, an alias set by as=ALIAS on an earlier command,
// "@SHARD" for the node the current plan gives that shard, or "all"; lists
// are comma-separated (n1,n2). Outputs name "@SHARD" nodes as "the node
// planned for SHARD", so they do not depend on which node placement chose.
// The nodes that answer (running and not frozen) are the observers; most
// checks ask every observer, or only those listed in on=(...).
//
// # Commands
//
// There is one cluster per scenario; every command but cluster and measure
// needs it started first. Every command also takes mark=EVENT (see Events).
//
// The cluster and its nodes (cmd_cluster.go):
//
//	cluster nodes=N [gpus=4xH100-80GB] [profile=local] [lease-ttl=3s] [runtime=none] [labels=(k=v,...)]
//	        [net=loopback|netns] [log-level=info] [within=DURATION] [binary=current]
//	        [engine-probe-timeout=D] [engine-probe-failures=N] [engine-progress-window=D]
//	        [engine-hung-restart=D] [engine-start-timeout=D]
//	        [gateway-first-byte-timeout=D] [gateway-stream-idle-timeout=D] [priority-header=NAME]
//	    Start N nodes with free ports, their own data dirs, one shared token
//	    file and gossip key (made for the run, so gossip is encrypted),
//	    --test-hooks and simulated GPUs; wait until every node sees all
//	    N alive with their GPUs (within: 30s and 1s a node unless given).
//	    net=loopback (default): every node on 127.0.0.1. net=netns: every
//	    node in a network namespace of its own (root and iproute2 needed;
//	    see netns.go), so partitions are real. The engine-* and gateway-*
//	    keys are passed to every node (add-node and restart too) as the
//	    `llmgw node up` flags of the same names: the readiness rule that
//	    judges engines (a ready engine leaves routing when probes failed
//	    engine-probe-failures times in a row and its token counters did not
//	    move for engine-progress-window; it is restarted after
//	    engine-hung-restart so) and the gateway's bounds on an engine's
//	    answer; priority-header=NAME is the header whose class the
//	    gateways honour (request-loop's priority=). Left out, the engine
//	    profile's own apply. The output lists
//	    the ones given. binary=NAME runs every node on a binary that
//	    build-binary built (default: current, the runner's own).
//	build-binary NAME commit=REV
//	    Build the llmgw binary of commit REV of the repository the runner
//	    runs in (git archive, then go build with the go command on PATH)
//	    into the work dir, under NAME, for binary= keys: a cluster of the
//	    previous release, upgraded node by node with restart ...
//	    binary=current. A commit missing from the clone is an error (the
//	    scenario fails): fetch the history (.ci/run does).
//	add-node NAME [gpus=...] [labels=(k=v,...)] [within=30s] [binary=current]
//	    Start one more node joining the others (gpus: the cluster's unless
//	    given; NAME: lower-case letters, digits and '-'); wait until every
//	    observer sees it alive.
//	kill NODE [engines=keep|kill] [as=ALIAS]
//	                           SIGKILL the agent: an agent crash, its engines
//	                           keep running (keep, the default), or the whole
//	                           node dying, its engines too (kill).
//	stop NODE [as=ALIAS]       SIGTERM: graceful leave; prints the exit status.
//	restart NODE [within=15s] [binary=NAME]
//	                           Start a stopped or killed node again with the
//	                           same name, data dir and ports (SIGTERM first if
//	                           it runs); waits for its API. A partition rule it
//	                           had is installed again. binary= starts it on
//	                           another binary from then on (an upgrade).
//	freeze NODE [as=ALIAS]     SIGSTOP the agent.
//	thaw NODE                  SIGCONT the agent.
//
// kill, stop, restart, freeze and thaw take one NODE or several (n1,n2 or
// n1 n2); as= names one.
//
// Partitions (cmd_partition.go):
//
//	partition A,B | C,D ...    Split the cluster: two sides or more, every node
//	                           on exactly one. With net=netns each side's
//	                           cluster links move to a bridge of their own: a
//	                           real partition. With net=loopback it is the
//	                           gossip-drop test hook (POST /v1/test/partition
//	                           on every node: it drops gossip to and from the
//	                           other sides; a node that does not answer gets
//	                           its rule when it restarts). Either way the HTTP
//	                           APIs stay reachable. The output says which was
//	                           used.
//	heal                       Undo the partition.
//
// Deployments (cmd_deployments.go):
//
//	place NAME model=M [engine=fake] [replicas=N] [tp=N|auto] [pp=N] [gpu-memory=70GiB|auto]
//	      [max-model-len=N] [max-num-seqs=N] [gpu-type=H100] [labels=(k=v)] [args=(a,b)] [env=(K=V)] [update=surge|recreate]
//	      [start-timeout=2h] [min-replicas=N max-replicas=M [target-inflight=T] [scale-down-delay=5m] [idle-window=10m]] [priority=N] [max-loras=N [max-lora-rank=R] [adapters=(NAME=SOURCE,...)]]
//	      [prefill-replicas=N decode-replicas=M [prefill-tp=T] [decode-tp=T] [pd-fallback=true] [pd-skip-below=TOKENS]] [via=NODE]
//	    POST the deployment to one node (default: the first observer). Keys
//	    left out are not sent: the node's defaults apply. start-timeout is
//	    sent as start_timeout, a duration string; min-replicas and
//	    max-replicas as replicas: {min, max} (autoscaled). engine=vllm and
//	    engine=sglang run the fake engine's personalities through the real
//	    profiles' command lines (see Engines).
//	weights NODE family=F [model=NAME]
//	    Write a header-only copy of a public model family (real shapes, no
//	    weights; cmd_weights.go lists them: llama-3.1-8b, mixtral-8x7b, ...)
//	    into the node's weights dir: as the hub cache lays out ORG/NAME, as
//	    a plain directory NAME, or as a .gguf file. Every node runs with a
//	    weights dir of its own, rescanned every second, and no hub.
//	    family=lora-adapter model=PATH writes a LoRA adapter instead: the
//	    directory PATH with a PEFT adapter_config.json of rank 8.
//	unplace NAME [via=NODE]    DELETE the deployment.
//	crash-engine SHARD         SIGKILL the engine process of SHARD (pid from the
//	                           first observer's /v1/shards).
//	hang-engine SHARD [as=ALIAS]
//	                           POST /debug/hang, with the engine's key, to the
//	                           engine of SHARD (found as crash-engine finds it):
//	                           it keeps running and answers nothing more, not
//	                           even /health, /metrics or its streams. as= names
//	                           the node it runs on, for expect-none-from.
//
// Waiting and checking (cmd_wait.go, cmd_expect.go):
//
//	wait-until CONDITION... [on=(NODES)] [for=DURATION] within DURATION   (or within=DURATION)
//	    Poll every observer (or on=(...)) until CONDITION (below) holds
//	    everywhere; prints "ok", or what was last seen when the time ran
//	    out. With for= it must hold at every poll for that long (a
//	    stability check; the event is still when it first held).
//	expect WHAT ... [on=(NODES)]   Print a deterministic report (below).
//	snapshot NAME              Remember the plan and the engines' pids, as the
//	                           first observer sees them, for expect ... since=NAME.
//
// A background client (cmd_request_loop.go):
//
//	request-loop NAME start deployment=D [via=engines|gateway] [stream=false] [on=(NODES)] [workers=1]
//	        [tokens=N] [prompt-words=N] [timeout=DURATION] [retry=none|next-gateway] [priority=CLASS]
//	        [answered-as=MODEL]
//	    Chat completions in a loop. prompt-words=N adds N words to each
//	    prompt ("ping 7 lorem lorem ..."), so that it spans KV blocks. answered-as=MODEL: an answer whose model
//	    field is not MODEL counts as an error (a LoRA adapter answers as
//	    itself; deployment=ADAPTER asks for it through a gateway). via=engines (the default): each to a
//	    replica whose lease is valid in a fresh /v1/shards, with that
//	    engine's API key (derived from the run's token and the row's engine
//	    ID, as nodes derive it, so a URL gone stale to another engine's port
//	    answers 401); a connection error is retried once on another replica,
//	    as a router would. via=gateway: each to the gateway of the next
//	    observer in turn, which routes and retries itself; with stream=true
//	    every answer is streamed and must end with [DONE]. on=(NODES) asks
//	    only those nodes (their gateways, or their /v1/shards), each while
//	    it is an observer; resolved at start, so on=(@chat-1) stays on the
//	    node planned for chat-1 then. workers=N runs N such clients at
//	    once, started 50 ms apart. Each request asks for a short answer
//	    (max_tokens 4), or with tokens=N for exactly N tokens (max_tokens
//	    and min_tokens N: with the engine's token delay, a request that
//	    keeps it busy). timeout=D bounds each request, its answer read whole
//	    (default 3s, the runner's client; with timeout= the loop has a
//	    client of its own). retry=next-gateway (via=gateway) is a client
//	    that retries as OpenAI's SDKs do, on the next gateway: after a
//	    refused connection, one closed before any answer, or a 503 with
//	    Retry-After; each gateway at most once a request. priority=CLASS
//	    (via=gateway) sends every request with the cluster's
//	    priority-header= set to CLASS (interactive, default or batch).
//	    Every request is recorded: when it was
//	    sent, when its answer began (the response head, or the failure),
//	    its first byte (a stream's first data event; a plain answer's
//	    head) and its end, and the node and replica that served it (the
//	    gateway's Llmgw-Node and Llmgw-Replica headers; via=engines, the
//	    row's).
//	    The requests still in flight are known too (wait-until settled).
//	request-loop NAME stop
//	request-loop NAME expect-no-errors [min-routable=N] [min-success=P%] [before=EVENT] [except-binary=NAME]
//	    "no errors" when every request was answered. min-success=99.9%
//	    allows failures up to 100-P percent of the requests ("at least
//	    99.9% of requests answered"; the counts go to the summary only).
//	    before=EVENT (or EVENT+DURATION) counts only the requests whose
//	    answer began before that moment, so requests a stopping node
//	    refuses afterwards do not count, while a stream it had begun to
//	    answer and then cut does; the output also says whether any of them
//	    was still in flight at the event. min-routable=N (via=engines)
//	    also checks that no /v1/shards the loop read offered fewer than N
//	    routable replicas (surge before drain in a rolling update).
//	    except-binary=NAME leaves out the failures whose last answer came
//	    from a gateway running that binary (an old release's stopping
//	    gateway); the summary counts them.
//	request-loop NAME expect-none-from NODE after=EVENT[+DURATION] [before=EVENT]
//	    No request sent after that moment was served by NODE (name it by
//	    name or alias: "@SHARD" would be resolved now), and at least one
//	    was answered (by others). before=EVENT counts only answers begun
//	    before that event (a gang torn down and formed again serves from
//	    the same node afterwards).
//	request-loop NAME expect-spread min-share=P% [after=EVENT[+DURATION]] [before=EVENT]
//	    Every replica that answered requests of the loop (those sent after
//	    after=, begun before before=) answered at least P percent of them:
//	    prints how many replicas answered, or which fell short with every
//	    replica's share. The shares go to the summary.
//	request-loop NAME expect-ttfb under=DURATION [quantile=95%] [after=EVENT[+DURATION]]
//	    The quantile (p95 unless said) of the answered requests' times to
//	    first byte (sent after after=) is within DURATION: "p95 time to
//	    first byte within 2s", or the figure over it. p50, the quantile,
//	    the max and the count go to the summary.
//	request-loop NAME expect-fail-fast under=DURATION [after=EVENT[+DURATION]]
//	    Every request sent after after= that failed did so with an
//	    OpenAI-shaped error (a code in its body) within DURATION of its
//	    sending: "every failure an OpenAI error within 10s", or "no
//	    request failed". Counts, codes and the slowest go to the summary.
//	request-loop NAME expect-refused match=TEXT
//	    The loop sent requests and every one failed with TEXT in its error
//	    (a removed model's 404, say): "every request refused with TEXT".
//	request-loop NAME expect-cut NODE at=EVENT[+DURATION]
//	    Every request whose answer NODE had begun (the head received,
//	    stream=true) and not finished at that moment ended with an error,
//	    none was completed: an engine that hangs or leaves routing has its
//	    streams cut, not left hanging nor quietly truncated. Prints the
//	    error's code (a stream's error event) or HTTP status; says so when
//	    no such answer was under way. Wait for them to end first (wait-until
//	    settled); the counts go to the summary.
//
// Its counters go to the summary: answered, errors, the share answered
// when some failed, and how many requests each node served.
//
// Whether gateways agree without talking to each other (cmd_affinity.go):
//
//	affinity deployment=D via=(NODES) [tenants=8] [rounds=2]
//	    For each tenant (a long system prompt of its own and a question of
//	    every request's own), rounds requests through each listed node's
//	    gateway in turn, one at a time. Prints for how many tenants every
//	    answer came from one replica (the Llmgw-Replica header); the counts,
//	    with how many replicas were used, go to the summary.
//
// A watch on the engines themselves (cmd_health_loop.go):
//
//	health-loop NAME start deployment=D [timeout=250ms] | stop | expect-no-gap
//	    Every 25 ms, GET /health of every engine process serving D on this
//	    machine (found in /proc by its --model argument, or
//	    --served-model-name under a personality, whatever any node
//	    reports). A poll in which none answers 200 is a gap: no client could
//	    have been served, however it routed. expect-no-gap says whether any
//	    poll found one. The engines are asked at once, each /health within
//	    timeout= (a busy engine's is slow: a poll waits for them all). Its
//	    counters go to the summary, with how long /health took (median,
//	    slowest).
//
// Measuring and debugging (cmd_measure.go):
//
//	measure NAME from=EVENT to=EVENT [max=DURATION]
//	    Record the time between two events in the summary; with max= the
//	    output says whether it stayed within the budget.
//	dump NAME                  Save every observer's /v1/cluster, /v1/plan,
//	                           /v1/shards and /status.json under the work dir
//	                           (see -keep), for debugging a scenario.
//
// # Engines
//
// engine=fake runs the llmgw binary's fake engine (`llmgw engine fake`).
// The vllm and sglang profiles name their engine by command, found on the
// node's PATH; every node the runner starts has first on its PATH a
// directory of the run's own (bin/ in the work dir) with two scripts:
//
//	vllm       exec <llmgw> engine fake --personality vllm "$@"
//	python3    with arguments -m sglang.launch_server ...:
//	           exec <llmgw> engine fake --personality sglang "$@";
//	           else the real python3 of the runner's PATH
//
// So `place NAME engine=vllm` with runtime=process starts the vLLM
// personality through the vllm profile's real command line (`vllm serve
// MODEL --served-model-name ...`): it loads without listening, and every
// request, /health and /metrics included, first waits 0.5 s per request
// running. The fake-only knobs come from the deployment's env=:
// FAKE_ENGINE_STARTUP_DELAY, FAKE_ENGINE_TOKEN_DELAY,
// FAKE_ENGINE_PREFILL_BASE, FAKE_ENGINE_HEALTH_DELAY_PER_RUNNING (see
// `llmgw engine fake --help`). The scripts exec, so each engine is the
// llmgw binary under its own pid, found like the plain fake engine by
// crash-engine, hang-engine, the engines condition and the teardown.
//
// # Events
//
// Every command records an event under its own name (the last one wins) and,
// with mark=EVENT, under that name too: a command's event is when it acted
// (the signal, the POST) or, for wait-until, when the condition was first
// seen to hold. A wait-until that timed out records none.
//
// # Conditions (wait-until)
//
//	all-placed                  every deployment placed in full, nothing unplaced
//	all-ready                   every deployment's ready count equals its replicas
//	replicas NAME ready=N       N replicas of NAME's current spec have a valid
//	                            lease on every shard, on nodes that really run
//	adapter NAME ready=N        LoRA adapter NAME is registered on N ready
//	                            replicas of its deployment (its engines list it)
//	members [alive=N] [suspect=N] [dead=N] [left=N]   as counted in /v1/cluster
//	                            (at least one of them)
//	cached NODE model=M         every observer sees M among NODE's cached models
//	converged                   every observer's /v1/plan is identical, current
//	                            and computed from the same deployments
//	single-holder               the nodes' own records hold exactly the planned
//	                            shards, each on one node (asks every node; a
//	                            frozen node fails it)
//	serving NAME                a chat completion to every replica with a valid
//	                            lease answers, from the engine process its
//	                            record names (checked by the listening socket),
//	                            sent with that engine's API key; without the
//	                            key the engine answers 401
//	restarts SHARD>=N           /v1/shards reports at least N restarts
//	shard SHARD [status=S] [lease=L] [engine=running|gone]   (at least one)
//	served LOOP by=NODE [after=EVENT[+DURATION]]
//	                            request-loop LOOP got an answer served by NODE
//	                            (NODE resolved when the wait begins: by=@chat-0
//	                            is the node planned for chat-0 then); with
//	                            after=, to a request sent after that moment
//	settled LOOP before=EVENT   every request LOOP sent before EVENT (or
//	                            EVENT+DURATION) has ended, answered or failed:
//	                            none still hangs; its event, for measure, is
//	                            when the last of them had ended (to the poll)
//	shards-agree                every observer's /v1/shards shows the same shards,
//	                            nodes, leases, statuses and draining flags
//	engines running=N           N engine processes of this run exist (any node, orphans too)
//	no-orphans                  every engine process runs a shard some node holds
//	isolated yes|no             /status.json says the node is (or is not) isolated:
//	                            it has heard no peer for several probe intervals
//	                            although it expects some
//	cluster-version N           /v1/cluster says the node runs at cluster
//	                            protocol version N (an agent from before
//	                            cluster versions says none)
//
// serving, restarts and shard read the first observer's /v1/shards;
// single-holder, engines and no-orphans look at every running node and at
// the processes, whatever on= says; served and settled read only the
// loop's record.
//
// # Reports (expect)
//
//	expect models [on=(NODES)]                   /v1/deployments as a table (why below it)
//	expect shards [on=(NODES)] [columns=(shard,replica,deployment,node,gpus,lease,status,restarts,draining,engine,reason,role)]
//	                                             default columns: shard,deployment,lease,status,draining
//	expect members [on=(NODES)]                  name, state and GPU count of every member
//	expect plan-agrees [on=(NODES)]              every observer has the same plan
//	expect single-holder                         as the condition, printed
//	expect pids-unchanged since=SNAPSHOT         engines kept their pids
//	expect plan-diff since=SNAPSHOT              assignments added, removed or moved
//	expect no-orphans
//	expect pd-legs DEPLOYMENT                    a disaggregated deployment's engines (the fake's counters) and
//	                                             gateways agree: one prefill leg and one decode KV load per
//	                                             disaggregated request, no decode prompt computed alone
//	expect pd-outcomes DEPLOYMENT                the outcomes other than disaggregated the alive gateways
//	                                             counted: "none" or their names (counts to the summary)
//	expect request-loop NAME [min-routable=N] [min-success=P%] [before=EVENT]
//	                                             same as request-loop NAME expect-no-errors
//	expect log NODE match=TEXT                   how many lines of the node's log (all its
//	                                             runs) contain TEXT
//
// models, shards and members ask every observer (or those in on=); when
// all answer alike the answer is printed once, else each under "as seen by
// NODE:". Wait with shards-agree or converged first where views may still
// differ. pids-unchanged and plan-diff ask the first observer.
package scenarios
