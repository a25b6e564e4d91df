# The two commands of README.md: `make demo` runs the main job, `make test` passes the
# tests. Both install what they need on a fresh Debian 12 machine (as root).

SHELL := /bin/bash
# `make deps` may install Rust with rustup; its cargo must be found by the later steps.
export PATH := $(or $(CARGO_HOME),$(HOME)/.cargo)/bin:$(PATH)
CARGO ?= cargo
# Extra arguments for nextest, e.g. `make test NEXTEST_ARGS="-p bftrainer-testcluster"`.
NEXTEST_ARGS ?=
# The Slurm release for `make demo` and `make cluster-up`: empty for the host's (22.05),
# or 24.11 / 26.05, run from a Debian root (scripts/slurm-root).
SLURM ?=

.PHONY: deps deps-system build demo test deb install cluster-up cluster-down

deps:
	./scripts/install-deps

deps-system:
	./scripts/install-deps --system

build: deps
	$(CARGO) build --workspace --all-targets

# The replay of the committed sample, then the live cluster with the plugins loaded.
# `make demo SLURM=26.05` (or 24.11) builds for that release and runs the whole demo
# inside its Debian root (scripts/slurm-root); plain `make demo` uses the host's Slurm.
DEMO_CRATES := -p bftrainer-daemon -p bft-run -p job_submit_bftrainer -p spank_bftrainer
demo: deps
ifeq ($(SLURM),)
	$(CARGO) build --release $(DEMO_CRATES)
	./scripts/demo
else
	venv=$$(scripts/python-env) && BFT_VENV=$$venv CARGO_TARGET_DIR=$(CURDIR)/target/slurm-$(SLURM) \
	  scripts/slurm-root run $(SLURM) bash -c 'cargo build --release $(DEMO_CRATES) && ./scripts/demo'
endif

# The runtime's tests need torch: scripts/python-env makes (or reuses) a virtualenv.
# The Rust tests run on every supported Slurm release (scripts/test-releases): all of
# them on the host's (22.05), and the integration tests again on 24.11 and 26.05, each
# built and run inside a Debian root (scripts/slurm-root; made once, cached under
# /var/tmp). `make test RELEASES=` runs the host's only; `RELEASES=26.05` one root.
RELEASES ?= 24.11 26.05

test: build
	venv=$$(scripts/python-env) && \
	  PYTHONPATH=$(CURDIR)/wrappers/python/src $$venv/bin/python -m pytest -q wrappers/python && \
	  BFT_VENV=$$venv BFT_TEST_RELEASES="$(RELEASES)" NEXTEST_ARGS="$(NEXTEST_ARGS)" scripts/test-releases

# Debian packages for every supported Slurm release into target/deb (scripts/make-deb):
# the plugins and bftrainerd per release (exact libslurm dependency), bft-run, the wheel.
# `make deb RELEASES="22.05"` builds the host's only.
deb: deps
	scripts/make-deb $(if $(filter command line,$(origin RELEASES)),$(RELEASES))

# A cluster in ./.cluster to work against by hand: eval "$$(make -s cluster-up)";
# `make -s cluster-up SLURM=26.05` starts one of another release (from its Debian root).
cluster-up: deps-system
	@tests/cluster/cluster up --dir .cluster $(if $(SLURM),--slurm $(SLURM))

cluster-down:
	tests/cluster/cluster down --dir .cluster

# Installs the two plugins into Slurm's PluginDir under the names Slurm looks for.
# PluginDir is taken from the running slurmctld's config, else Debian's default;
# override with `make install PLUGIN_DIR=/path` (e.g. a directory for
# `tests/cluster/cluster up --plugins DIR`). Each file is copied beside its target and
# renamed over it: overwriting a loaded plugin in place would crash slurmctld.
PLUGIN_DIR ?= $(firstword $(subst :, ,$(shell scontrol show config 2>/dev/null | sed -n 's/^PluginDir *= *//p')) /usr/lib/x86_64-linux-gnu/slurm-wlm)

install:
	$(CARGO) build --release -p job_submit_bftrainer -p spank_bftrainer
	install -d $(DESTDIR)$(PLUGIN_DIR)
	for p in job_submit_bftrainer spank_bftrainer; do \
	  install -m 0755 target/release/lib$$p.so $(DESTDIR)$(PLUGIN_DIR)/.$$p.so.new && \
	  mv -f $(DESTDIR)$(PLUGIN_DIR)/.$$p.so.new $(DESTDIR)$(PLUGIN_DIR)/$$p.so || exit 1; \
	done
	@echo "installed job_submit_bftrainer.so and spank_bftrainer.so into $(DESTDIR)$(PLUGIN_DIR)"
