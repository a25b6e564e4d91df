# The two commands of README.md: `make demo` runs the main job, `make test` passes the
# tests. Both install what they need on a fresh Debian 12 machine (as root).

SHELL := /bin/bash
CARGO ?= cargo

.PHONY: deps build demo test

deps:
	./scripts/install-deps

build: deps
	$(CARGO) build --workspace --all-targets

demo: build
	./scripts/demo

test: build
	$(CARGO) nextest run --workspace --no-fail-fast
