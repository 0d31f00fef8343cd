# Stoker: the two commands of the README, and a few more for developers.
#   make demo   build and run `stoker demo` (installs what is missing)
#   make test   build and run every test tier that exists (installs what is missing)
#   make bench  criterion benchmarks and the pipeline benchmark (see BENCHMARKS.md)
#   make lint   rustfmt + clippy
#   make fuzz   every fuzz target for FUZZ_SECONDS each (see ARCHITECTURE.md, "Fuzzing")
#   make docs   the documentation site (docs/, MkDocs) into target/site
#   make compose-up / compose-down   deploy/compose.yaml on this machine's Docker (deploy/README.md)

SHELL := /bin/bash
CARGO ?= cargo
JOBS ?= 2
VENV := .venv
PYTHON := $(abspath $(VENV))/bin/python
# Seconds per fuzz target: `make fuzz`, and the short run inside `make test`.
FUZZ_SECONDS ?= 300
FUZZ_SHORT_SECONDS ?= 15

.PHONY: demo test bench lint deps test-deps venv wheel docs compose-up compose-down

deps:
	@scripts/ensure-deps.sh

# The tests also run a real Prometheus server and promtool (Debian's prometheus package).
test-deps:
	@scripts/ensure-deps.sh --test

# The venv is rebuilt when the requirements change. python/requirements-torch.txt is PyTorch
# and what trains with it (torchvision, Lightning, torchdata, transformers, accelerate,
# scikit-learn) plus the kubectl client: about 5.9 GB, downloaded once and kept with the venv.
$(VENV)/.installed: tests/compat/requirements.txt python/requirements-dev.txt python/requirements-torch.txt | deps
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/compat/requirements.txt -r python/requirements-dev.txt -r python/requirements-torch.txt
	touch $@

venv: $(VENV)/.installed

demo: deps
	$(CARGO) build --release -j$(JOBS) -p stoker-cli
	./target/release/stoker demo

# Every test tier, each stage timed (scripts/test.sh prints the table): one debug build for the
# cargo tests (cargo-nextest where installed; tests that need the venv are #[ignore]d in a plain
# `cargo test` and run here), a debug wheel of the Python package installed into the venv, and
# beside the cargo tests the fuzz targets' short runs, the container images and the pytest suite
# against real `stoker` processes.
# A failing stage does not hide the others. Installs what is missing first (deps, test-deps, venv).
test:
	JOBS=$(JOBS) FUZZ_SHORT_SECONDS=$(FUZZ_SHORT_SECONDS) VENV=$(VENV) PYTHON=$(PYTHON) scripts/test.sh

# An abi3 wheel of the Python package (CPython >= 3.9) in target/wheels: `pip install` it on a
# machine without Rust. Release build; libjpeg-turbo is linked in statically.
wheel: deps venv
	rm -f target/wheels/stoker-*.whl
	cd python && VIRTUAL_ENV=$(abspath $(VENV)) CARGO_BUILD_JOBS=$(JOBS) $(abspath $(VENV))/bin/maturin build --release --quiet --out $(abspath target/wheels)
	@ls target/wheels/stoker-*.whl

# Criterion micro-benchmarks, then the pipeline against its floor and the Pillow peer on
# ImageNet-like data (scripts/bench_pipeline.py rewrites its table in BENCHMARKS.md).
bench: deps venv
	$(CARGO) bench -j$(JOBS) -p stoker-benches
	$(CARGO) build --release -j$(JOBS) -p stoker-cli
	$(PYTHON) scripts/bench_pipeline.py

.PHONY: fuzz
fuzz: deps
	JOBS=$(JOBS) scripts/fuzz.sh $(FUZZ_SECONDS)

# The documentation site: MkDocs + Material (pinned in docs/requirements.txt), installed into
# .venv on first use (~15 s), built with --strict so a broken link or a page missing from the
# nav fails. The links themselves are also checked by `cargo test` (testkit/tests/it/docs.rs).
$(VENV)/.docs-installed: docs/requirements.txt | deps
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r docs/requirements.txt
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir target/site
	@echo "site: target/site/index.html"

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy -j$(JOBS) --workspace --all-targets -- -D warnings

# deploy/compose.yaml from this checkout on this machine's Docker engine, no registry needed:
# deploy/build-images makes the images (a debootstrap base when debian:bookworm-slim cannot be
# pulled, this checkout's debug `stoker`, Debian's Prometheus), then the stack starts without
# Grafana, every port on 127.0.0.1. Datasets: the folder STOKER_DATASETS (read-only in the
# containers); an empty one gets a small generated sample, registered as `sample`.
STOKER_DATASETS ?= $(abspath deploy/datasets)
COMPOSE := docker-compose -f deploy/compose.yaml -p stoker
export STOKER_DATASETS

compose-up: deps test-deps
	$(CARGO) build -j$(JOBS) -p stoker-cli
	deploy/build-images --binary target/debug/stoker
	@mkdir -p $(STOKER_DATASETS)
	@if [ -z "$$(ls -A $(STOKER_DATASETS))" ]; then \
		echo "==> a generated sample in $(STOKER_DATASETS)/sample"; \
		./target/debug/stoker demo --workdir target/compose-sample --epochs 1 >/dev/null && \
		cp -r target/compose-sample/shards $(STOKER_DATASETS)/sample; \
	fi
	$(COMPOSE) up -d --no-build
	@for i in $$(seq 1 60); do \
		[ "$$($(COMPOSE) ps | grep -c '(healthy)')" -ge 5 ] && break; \
		[ $$i -lt 60 ] || { echo "the stack is not healthy after 120 s: $(COMPOSE) ps; $(COMPOSE) logs" >&2; exit 1; }; sleep 2; \
	done
	@if [ -f $(STOKER_DATASETS)/sample/manifest.json ]; then $(COMPOSE) run --rm cli dataset add sample /datasets/sample || true; fi
	$(COMPOSE) run --rm cli status
	@echo "Prometheus: http://$$($(COMPOSE) port prometheus 9090)"

compose-down:
	$(COMPOSE) down -v --remove-orphans
