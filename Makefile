# pinboard-go. Two set-up commands on a fresh machine:
#   make run    pinboard on the embedded memory: store with a dev passport
#   make test   installs what the tests need, then runs every test
SHELL := /bin/bash
GO ?= go
PYTHON ?= python3
VENV := .venv
BIN := bin
DEV_TOKEN ?= dev-token-change-me
PORT ?= 8080
# make run listens on loopback: the dev passport admits anyone, and its
# well-known token may register a worker at any host. RUN_HOST=0.0.0.0
# (or another address) to reach it from elsewhere.
RUN_HOST ?= 127.0.0.1
# The URL make run prints: RUN_HOST, loopback when it is all interfaces,
# an IPv6 address in brackets.
RUN_URL_HOST = $(if $(filter-out 0.0.0.0 ::,$(strip $(RUN_HOST))),$(if $(findstring :,$(RUN_HOST)),[$(strip $(RUN_HOST))],$(strip $(RUN_HOST))),127.0.0.1)

DEV_PASSPORT := {"providers":[{"type":"staticToken","id":"pinboard","keys":[{"name":"dev","token":{"env":"PINBOARD_TOKEN"},"scopes":["pinboard:worker","pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}}]}],"namespaces":{"*":{"allow":"anonymous"}}}

.PHONY: all build run test deps deps-redis deps-python unit e2e lint bench bench-deps clean

all: build

build:
	$(GO) build -o $(BIN)/pinboard ./cmd/pinboard
	$(GO) build -o $(BIN)/pinboardctl ./cmd/pinboardctl

# pinboard on memory: with a dev passport (anonymous clients, one token for
# workers and operators). Dev only: see README.md for production.
run: build
	@echo "pinboard dev token: $(DEV_TOKEN)"
	@echo "  workers:   PINBOARD_URL=http://$(RUN_URL_HOST):$(PORT) PINBOARD_TOKEN=$(DEV_TOKEN)"
	@echo "  operators: curl -H 'Authorization: Bearer $(DEV_TOKEN)' http://$(RUN_URL_HOST):$(PORT)/registry/workers"
	PINBOARD_TOKEN='$(DEV_TOKEN)' PINBOARD_PASSPORT='$(DEV_PASSPORT)' REDIS_URL=memory: HOST=$(RUN_HOST) PORT=$(PORT) \
		./$(BIN)/pinboard

# The zero-allocation tests skip under -race (sync.Pool drops items on
# purpose there): run once more without it, or they never run at all.
ALLOC_TESTS = $(GO) test -count=1 -run 'Alloc' ./proxy/ ./attest/ && \
	$(GO) test -count=1 -run 'Contract/LookupDoesNotAllocate' ./directory/

# Everything the tests need, then every test.
test: deps lint
	PINBOARD_E2E_PYTHON=$(CURDIR)/$(VENV)/bin/python PINBOARD_REF_PYTHON=$(CURDIR)/$(VENV)/bin/python $(GO) test -race -count=1 -timeout 12m ./...
	$(ALLOC_TESTS)

deps: deps-redis deps-python

# redis-server from Debian's packages (the tests start their own servers).
deps-redis:
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null || { \
		echo "installing redis-server from Debian's packages"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@redis-server --version

# A Python venv with the reference worker (pinned==0.16.0) for the e2e suite.
deps-python: $(VENV)/.installed

# Debian's python3 makes venvs only with python3-venv (ensurepip):
# installed from Debian's packages when the first try fails.
$(VENV)/.installed: tools/e2e/requirements.txt
	$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
		rm -rf $(VENV); echo "installing python3-venv from Debian's packages"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; \
		$(PYTHON) -m venv $(VENV); }
	$(VENV)/bin/pip install -q -r tools/e2e/requirements.txt
	touch $@

unit:
	$(GO) test -race -count=1 -short ./...
	$(ALLOC_TESTS)

e2e: deps-python
	PINBOARD_E2E_PYTHON=$(CURDIR)/$(VENV)/bin/python $(GO) test -count=1 -v ./e2e/

# Benchmarks: every scenario against the fleet directly, through nginx and
# through pinboard, in rotating rounds; rewrites BENCHMARKS.md and the
# plots in docs/bench, raw results in bench/results/<time>/ (about 25
# minutes; BENCH_QUICK=1 for a 3-minute indicative run).
#   BENCH_QUICK=1            short phases, one round
#   BENCH_REDIS=redis://…    the Redis-store scenarios (redis, storm-split) on that server
#                            (default auto: a private redis-server; empty: skip)
#   BENCH_ARGS='-scenarios hot,sse -proxy-cpu 1 -fleet-cpu 0 -gen-cpu 0'
BENCH_QUICK ?=
BENCH_REDIS ?= auto
BENCH_ARGS ?=

bench: build bench-deps deps-redis
	$(GO) build -o $(BIN)/pinbench ./cmd/pinbench
	./$(BIN)/pinbench run -pinboard $(BIN)/pinboard $(if $(BENCH_QUICK),-quick) $(if $(BENCH_REDIS),-redis $(BENCH_REDIS)) $(BENCH_ARGS)

# nginx (the baseline, Debian's nginx-light) and taskset for the benchmarks.
bench-deps:
	@command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || { \
		echo "installing nginx-light from Debian's packages"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null; }
	@command -v taskset >/dev/null || { echo "taskset (util-linux) is required"; exit 1; }

# gofmt, go vet and staticcheck (default checks, no exceptions: a finding
# is fixed, not silenced).
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

lint:
	$(GO) vet ./...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) run $(STATICCHECK) ./...

clean:
	rm -rf $(BIN)
