# The two commands of README.md: `make demo` runs the main job, `make test` passes the
# tests. Both install what they need on a fresh Debian 12 machine (as root).

SHELL := /bin/bash
CARGO ?= cargo
# Extra arguments for nextest, e.g. `make test NEXTEST_ARGS="-p bftrainer-testcluster"`.
NEXTEST_ARGS ?=

.PHONY: deps deps-system build demo test cluster-up cluster-down

deps:
	./scripts/install-deps

deps-system:
	./scripts/install-deps --system

build: deps
	$(CARGO) build --workspace --all-targets

# For now the demo needs only the cluster (Debian packages, no Rust build).
demo: deps-system
	./scripts/demo

test: build
	$(CARGO) nextest run --workspace --no-fail-fast $(NEXTEST_ARGS)

# A cluster in ./.cluster to work against by hand: eval "$$(make -s cluster-up)".
cluster-up: deps-system
	@tests/cluster/cluster up --dir .cluster

cluster-down:
	tests/cluster/cluster down --dir .cluster
