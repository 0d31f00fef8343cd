# Stoker: the two commands of the README, and a few more for developers.
#   make demo   build and run `stoker demo` (installs what is missing)
#   make test   build and run every test tier that exists (installs what is missing)
#   make bench  criterion benchmarks and the pipeline benchmark (see BENCHMARKS.md)
#   make lint   rustfmt + clippy
#   make fuzz   every fuzz target for FUZZ_SECONDS each (see ARCHITECTURE.md, "Fuzzing")

SHELL := /bin/bash
CARGO ?= cargo
JOBS ?= 2
VENV := .venv
PYTHON := $(abspath $(VENV))/bin/python
# Seconds per fuzz target: `make fuzz`, and the short run inside `make test`.
FUZZ_SECONDS ?= 300
FUZZ_SHORT_SECONDS ?= 15

.PHONY: demo test bench lint deps test-deps venv wheel

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
# `cargo test` and run here), the fuzz targets' short runs beside them, a debug wheel of the
# Python package installed into the venv, and its pytest suite against real `stoker` processes.
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

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy -j$(JOBS) --workspace --all-targets -- -D warnings
