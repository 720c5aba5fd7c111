# llmgw — see README.md. `make run` starts a local demo cluster, `make test`
# runs the tests.
GO      ?= go
BIN     := bin/llmgw
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
DEMO    ?= $(CURDIR)/.demo
# The official OpenAI SDK, pinned, that scenarios' TestOpenAISDKThroughTheGateway
# points at a gateway (Node.js 20 or later and npm).
SDK     := scenarios/testdata/openai-sdk
# go-nvml's cgo bindings call functions the NVML header marks deprecated.
export CGO_CFLAGS := -Wno-deprecated-declarations

.PHONY: build test race bench run stop observe lint clean scenarios fuzz sdk scale

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/llmgw

# The scenarios assert failover budgets in wall-clock time, so they run on
# their own after the other packages rather than beside them on a small box.
test: build sdk
	@sock=$${LLMGW_TEST_CONTAINERD_SOCKET:-/run/containerd/containerd.sock}; [ -S "$$sock" ] || \
		echo "note: no containerd socket at $$sock: the containerd integration tests will skip (start one with: eval \"\$$(.ci/containerd.sh start)\")"
	$(GO) vet ./...
	$(GO) test -timeout 25m $$($(GO) list ./... | grep -v /scenarios | grep -v /scaletest)
	$(GO) test -timeout 15m ./scenarios/
	$(GO) test -timeout 10m ./supervisor/scaletest/

# Install the SDK as its lock file says when it is missing or the lock is
# newer. Without npm the SDK test fails and says how to install it;
# LLMGW_SKIP_NODE_TESTS=1 skips both.
sdk:
	@[ "$${LLMGW_SKIP_NODE_TESTS:-}" = 1 ] && exit 0; \
	lock=$(SDK)/node_modules/.package-lock.json; \
	[ -f $$lock ] && [ ! $(SDK)/package-lock.json -nt $$lock ] && exit 0; \
	if command -v npm >/dev/null; then echo "npm ci --prefix $(SDK)"; npm ci --prefix $(SDK) --no-audit --no-fund; \
	else echo "note: npm not found: TestOpenAISDKThroughTheGateway will fail (install Node.js 20+ and npm, or set LLMGW_SKIP_NODE_TESTS=1)"; fi

# The race detector over every package but the scenarios (whose nodes are
# separate processes: build them with -race to check those, see README) and
# the scale harness (held to CPU budgets the detector's cost would break).
race:
	$(GO) test -race -timeout 25m $$($(GO) list ./... | grep -v /scenarios | grep -v /scaletest)

# Benchmarks: placement at scale, gossip propagation, runtime start-up, the
# API under load, the gateway's cost; then the routing policies compared,
# once (each takes two minutes of fake engines). Benchmarks here are noisy: -count gives medians.
bench:
	$(GO) test -run '^$$' -bench . -skip 'Policies|PDStepInterference' -benchtime 5x -count 3 -timeout 30m ./placement/ ./gossip/ ./supervisor/...
	$(GO) test -run '^$$' -bench Policies -benchtime 1x -timeout 30m ./supervisor/gateway/
	$(GO) test -run '^$$' -bench PDStepInterference -benchtime 3x -timeout 30m ./supervisor/gateway/

# Many full nodes in one process, measured at each size (supervisor/scaletest):
# idle CPU, gossip bytes, passes, and how soon every node sees every member and
# agrees on a plan. Sizes past what the machine's cores carry fail their waits
# and say so. `make test` runs 25 nodes against the budgets.
SCALE ?= 25,50,100,200,500
scale:
	$(GO) test -v -run TestScale -timeout 120m ./supervisor/scaletest/ -args -nodes $(SCALE) -budgets=false

run: build
	$(BIN) demo up --dir $(DEMO)

stop: build
	@bash deploy/observe.sh $(DEMO) stop
	$(BIN) demo down --dir $(DEMO)

# A Prometheus (the system's package) scraping the demo through its
# discovery endpoint, for the dashboard in deploy/grafana.
observe:
	@bash deploy/observe.sh $(DEMO)

# Like test, it installs the SDK first: TestOpenAISDKThroughTheGateway is
# one of the scenarios' tests.
scenarios: build sdk
	$(GO) test -v -timeout 60m ./scenarios/ -args -all

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 30s ./gossip/
	$(GO) test -run '^$$' -fuzz FuzzLoadDeployments -fuzztime 30s ./gossip/
	$(GO) test -run '^$$' -fuzz FuzzDecodeDeployment -fuzztime 30s ./placement/
	$(GO) test -run '^$$' -fuzz FuzzDecodeSpecMemory -fuzztime 30s ./supervisor/spec/
	$(GO) test -run '^$$' -fuzz '^FuzzScanObject$$' -fuzztime 30s ./supervisor/gateway/

clean:
	rm -rf bin $(DEMO) $(SDK)/node_modules
