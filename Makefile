# Capsem build, test and benchmark entry points.
#   make build     bin/capsem and the bin/capsem-mcp-server symlink
#   make test      everything: deps, vet, unit + integration + end-to-end (-race), fuzz smoke
#   make bench     benchmarks, each figure beside its baseline from the same run
#   make generate  regenerate committed msgp code
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/capsem/capsem/core/version.Version=$(VERSION)
TOOLS := $(CURDIR)/.tools
# Shared package cache for sandboxed MCP servers (npx), reused across runs.
export CAPSEM_CACHE_DIR ?= $(TOOLS)/cache
EVERYTHING_VERSION := 2026.8.31
export CAPSEM_EVERYTHING_PKG := @modelcontextprotocol/server-everything@$(EVERYTHING_VERSION)
export CAPSEM_TEST_BIN := $(CURDIR)/bin/capsem
FUZZTIME ?= 5s

.PHONY: build run test bench generate deps fuzz vet clean FORCE

build: bin/capsem

# bin/capsem is the host binary (cgo, for SQLite); bin/capsem-guest is the same
# program built without cgo: it becomes /init inside the guest.
bin/capsem: FORCE
	@mkdir -p bin
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/capsem .
	CGO_ENABLED=0 $(GO) build -ldflags "-s -w $(LDFLAGS)" -o bin/capsem-guest .
	@ln -sf capsem bin/capsem-mcp-server

# run: the main job for now: a gateway with the builtin tools, driven through the
# real relay (initialize, tools/list, one builtin call), then the ledger rows.
run: build
	@set -e; d=$$(mktemp -d); trap 'kill $$gw 2>/dev/null; wait $$gw 2>/dev/null; rm -rf $$d' EXIT; \
	bin/capsem --log-level warn gateway --listen unix:$$d/gw.sock --session-dir $$d/session & gw=$$!; \
	for i in $$(seq 100); do [ -S $$d/gw.sock ] && break; sleep 0.05; done; \
	printf '%s\n' \
	  '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"make-run","version":"1"}}}' \
	  '{"jsonrpc":"2.0","method":"notifications/initialized"}' \
	  '{"jsonrpc":"2.0","id":2,"method":"tools/list"}' \
	  '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"builtin__http_get","arguments":{"url":"http://localhost:1/"}}}' \
	| CAPSEM_MCP_ENDPOINT=unix:$$d/gw.sock bin/capsem-mcp-server | cut -c1-300; \
	echo "--- session.db mcp_calls:"; \
	bin/capsem --log-level error version >/dev/null; \
	sqlite3 $$d/session/session.db 'SELECT method, tool_name, decision, process_name FROM mcp_calls' 2>/dev/null || \
	  echo "(install sqlite3 to print the ledger)"

# deps installs what the tests need: Go modules, and the real MCP reference
# server from npm, fetched once into the shared cache the sandbox may read.
deps:
	@command -v gcc >/dev/null || (apt-get update && apt-get install -y gcc)
	@command -v node >/dev/null || (apt-get update && apt-get install -y nodejs npm)
	$(GO) mod download
	@mkdir -p $(CAPSEM_CACHE_DIR)
	@# The launcher prints its usage (and exits 1) for an unknown transport:
	@# that proves the package is fetched into the cache and runs.
	npm_config_cache=$(CAPSEM_CACHE_DIR)/npm npx -y $(CAPSEM_EVERYTHING_PKG) --help </dev/null 2>&1 | grep -q "Everything Server" || \
	  (echo "fetching $(CAPSEM_EVERYTHING_PKG) failed" >&2; exit 1)
	@# The official TypeScript SDK client, pinned by package-lock.json.
	npm ci --prefix testdata/tsclient --no-audit --no-fund >/dev/null

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); echo "gofmt needed" >&2; exit 1)

test: deps build vet
	CI=$${CI:-true} $(GO) test -race -count=1 -timeout 30m ./...
	$(MAKE) fuzz

# A short run of every fuzz target (the seed corpus always runs in `go test`).
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "fuzz $$pkg $$f"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg >/dev/null; \
	  done; \
	done

bench: deps build
	$(GO) test -run '^$$' -bench . -benchmem ./core/mcpframe/ ./core/ledger/
	$(GO) run ./testdata/benchreport

generate:
	$(GO) generate ./core/aggwire/

clean:
	rm -rf bin
