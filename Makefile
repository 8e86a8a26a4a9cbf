# vgpud — build, test and run. `make help` lists the targets.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
export CGO_ENABLED := 1
# go-nvml binds every NVML function, the ones nvml.h marks deprecated among
# them, and the C compiler warns about each binding whether it is called or
# not (29 warnings from go-nvml v0.13.4-1's own cgo code; vgpud has no C).
# Those warnings say nothing about vgpud, so they are off here; whether
# vgpud calls a deprecated function is checked by `make lint`
# (TestNoDeprecatedNVML), which fails if one comes back.
export CGO_CFLAGS := -O2 -g -Wno-deprecated-declarations
# Keep builds and tests within two cores.
GOFLAGS_PAR ?= -p 2
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/vgpud/vgpud/pkg/version.Version=$(VERSION)
PREFIX ?= /usr/local
DESTDIR ?=
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
GOIMPORTS ?= golang.org/x/tools/cmd/goimports@v0.51.0

.PHONY: all build deps test unit e2e e2e-container bench bench-placement bench-metrics bench-recovery bench-fleet bench-fleet-scale bench-candidates soak demo demo-fleet lint fuzz install uninstall man clean help

all: build

help:
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

build: ## build bin/vgpud and bin/vgpuctl
	$(GO) build $(GOFLAGS_PAR) -trimpath -ldflags '$(LDFLAGS)' -o bin/ ./cmd/vgpud ./cmd/vgpuctl

deps: ## install the system packages (Debian; root)
	scripts/install-deps.sh

test: deps build unit e2e e2e-container ## the whole suite: unit tests, fuzz seed corpora, e2e, the container tier

unit: ## unit tests (race detector on), fuzz seed corpora included
	$(GO) test $(GOFLAGS_PAR) -race -count=1 -timeout 30m ./pkg/... ./cmd/... ./profiles/... ./dashboards/... ./bench/... ./internal/...

# The crash test runs in a step of its own with -v, because go test drops the
# output of a passing package: its summary line ("crash iterations: N, leaks:
# 0, lost: 0") is printed, and everything it wrote when it fails, then its
# seed and failure lines again, last, where a log's tail shows them (the
# daemon's and libvirtd's logs come after them in the test's output).
e2e: build ## end-to-end tests against the built binaries and real services; prints the crash test's summary
	$(GO) test $(GOFLAGS_PAR) -count=1 -timeout 30m -skip '^TestCrashRecovery$$' ./e2e/
	@out=$$(mktemp); \
	if $(GO) test -count=1 -timeout 30m -run '^TestCrashRecovery$$' -v ./e2e/ >"$$out" 2>&1; then \
		grep -E '^(crash iterations:|ok )' "$$out"; rm -f "$$out"; \
	else \
		cat "$$out"; \
		echo "--- TestCrashRecovery failed; its seed and failures, from the output above:"; \
		grep -E '^    crash_test\.go:[0-9]+: ' "$$out" | grep -v -e 'daemon log (tail)' -e ': started ' | tail -n 20; \
		rm -f "$$out"; exit 1; \
	fi

# The package installed into a booted Debian 12 container (systemd as PID 1,
# its system bus and polkitd); e2e/container's doc says what it needs. The
# Debian root is built once per machine (scripts/container-root.sh) and
# cached. Its own step, so the time it adds is on go test's "ok" line.
e2e-container: build ## the container tier: the .deb under systemd, D-Bus activation, polkit (root; builds the cached Debian root once)
	VGPUD_E2E_BIN=$(CURDIR)/bin $(GO) test -count=1 -timeout 20m ./e2e/container/

bench: build ## Go benchmarks; attach vs virsh and 64 concurrent vgpuctl clients (ratios against a baseline in the same run)
	$(GO) test -p 1 -run '^$$' -bench . -benchmem ./pkg/...
	$(GO) test -p 1 -count=1 -run '^$$' -bench . -benchtime 20x ./e2e/

bench-placement: ## placement churn benchmark: first-fit, random, vgpud, vgpud+defrag, oracle -> bench/placement.json
	$(GO) run ./bench/placement -out bench/placement.json

bench-metrics: build ## scrape latency, NVML slowdown, RSS and idle CPU -> bench/metrics.json
	$(GO) run ./bench/metrics -out bench/metrics.json

bench-recovery: ## time to READY after a reboot and a full apply on 8 mixed GPUs with driver latencies, vs critical path and serial sum -> bench/recovery.json
	$(GO) run ./bench/recovery -out bench/recovery.json

bench-fleet: ## 3 simulated hosts, a real Placement, 1/4/16 fleet schedulers, exact and carvable inventories: stale refusals by cause, room offered, over-commit, sync lag -> bench/fleet.json
	$(GO) run ./bench/fleet -out bench/fleet.json

FLEET_SCALE_STEPS ?= 100,300,1000
bench-fleet-scale: ## hosts x 8 mixed GPUs against one Placement on PostgreSQL (FLEET_SCALE_STEPS=100,300,1000): candidates vs Nova's pGPUs, first publish, churn, resync -> bench/fleet-scale.json
	$(GO) run ./bench/fleetscale -steps $(FLEET_SCALE_STEPS) -out bench/fleet-scale.json

bench-candidates: ## Placement's allocation-candidates cost by classes per GPU provider, against Nova's one class, on PostgreSQL -> bench/candidate-cost.json
	$(GO) run ./bench/candidatecost -out bench/candidate-cost.json

soak: build ## the crash test with 1000 iterations
	VGPUD_CRASH_ITERATIONS=1000 $(GO) test -p 1 -count=1 -timeout 120m -run Crash -v ./e2e/

fuzz: ## run each fuzz target for FUZZTIME (default 20s)
	scripts/fuzz.sh $(or $(FUZZTIME),20s)

demo: deps build ## the main job on the built-in simulated host
	scripts/demo.sh

demo-fleet: deps build ## the simulated host published to a real OpenStack Placement: vgpuctl fleet status, allocation candidates
	scripts/demo-fleet.sh

# Debian's eslint (6.4) loads its modules from /usr/share/nodejs, which a
# Node.js not from Debian does not search; -f unix because its default
# formatter needs a module Debian's package does not depend on.
ESLINT ?= eslint
lint: ## gofmt, goimports grouping (the module's own imports last), go vet, staticcheck, no deprecated NVML call, eslint on the Cockpit page
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@out=$$($(GO) run $(GOIMPORTS) -l -local github.com/vgpud/vgpud $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "goimports -local github.com/vgpud/vgpud needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	NVML_MODULE_DIR=$$($(GO) list -m -f '{{.Dir}}' github.com/NVIDIA/go-nvml) $(GO) test -count=1 -run '^(TestNoDeprecatedNVML|TestDeprecatedNVMLCatches)$$' ./internal/conventions/
	@command -v $(ESLINT) >/dev/null || { echo "lint: eslint not found (scripts/install-deps.sh installs Debian's eslint)"; exit 1; }
	node --check cockpit/vgpud/vgpud.js
	NODE_PATH=$${NODE_PATH:+$$NODE_PATH:}/usr/share/nodejs $(ESLINT) --no-eslintrc -c cockpit/eslintrc.json -f unix cockpit/vgpud/*.js

install: build ## install binaries, units, D-Bus/polkit policy, profiles, dashboards, docs, man pages, completions into $(DESTDIR)$(PREFIX)
	DESTDIR='$(DESTDIR)' PREFIX='$(PREFIX)' scripts/install.sh install

uninstall: ## remove what install put into $(DESTDIR)$(PREFIX) (a changed /etc/vgpud/vgpud.yaml stays)
	DESTDIR='$(DESTDIR)' PREFIX='$(PREFIX)' scripts/install.sh uninstall

.PHONY: verify-units
verify-units: build ## install into a temporary DESTDIR, systemd-analyze verify and security --offline; fails above exposure 2.5
	scripts/verify-units.sh

man: build ## man pages (vgpud.8, vgpuctl.1) and shell completions into man/ and completions/
	VGPUCTL=bin/vgpuctl scripts/gen-man.sh .

clean:
	rm -rf bin/ man/ completions/
