# The two commands of README.md: `make demo` runs the main job, `make test` passes the
# tests. Both install what they need on a fresh Debian 12 machine (as root).

SHELL := /bin/bash
CARGO ?= cargo

.PHONY: deps build demo test install

deps:
	./scripts/install-deps

build: deps
	$(CARGO) build --workspace --all-targets

demo: build
	./scripts/demo

test: build
	$(CARGO) nextest run --workspace --no-fail-fast

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
