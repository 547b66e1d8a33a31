# choreo: every set-up step lives here so a fresh machine needs only `make demo` or `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: setup system-deps engine cluster-binaries test test-fast lint bench demo soak clean

# Debian packages the project runs for real: a Prometheus server for the metrics tests.
SYSTEM_PACKAGES := prometheus openssl
system-deps:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.deps: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

# The compiled engine: cargo rebuilds only what changed.
engine: $(VENV)/.deps
	$(BIN)/maturin develop --release --quiet -m synthesizer/engine/Cargo.toml

# gRPC modules are generated from the proto (never committed).
setup: system-deps engine
	$(BIN)/python -m choreo.service.protos

# Kubernetes control-plane binaries for the end-to-end tests, built once and cached per version.
cluster-binaries: $(VENV)/.deps
	$(BIN)/choreo-dev build

test: setup cluster-binaries
	cargo test --release --quiet --no-default-features --manifest-path synthesizer/engine/Cargo.toml
	$(BIN)/pytest -q
	$(MAKE) --no-print-directory lint

test-fast: setup
	$(BIN)/pytest -q -m "not e2e and not slow"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo
	cargo clippy --quiet --release --all-targets --manifest-path synthesizer/engine/Cargo.toml -- -D warnings

# Every benchmark table (measured | target | reference | ok). Each exits non-zero on a missed
# target; the leading '-' lets the others still run, and make reports what failed.
bench: setup cluster-binaries
	-$(BIN)/choreo bench
	-$(BIN)/python -m choreo.msccl.bench
	-$(BIN)/python -m choreo.teccl.bench
	-$(BIN)/python -m choreo_dev.gather_bench
	-$(BIN)/python -m choreo_dev.noise_bench
	-$(BIN)/python -m choreo.nccl.versus
	-$(BIN)/python -m choreo.service.bench
	-$(BIN)/python -m choreo.service.spread_bench
	-$(BIN)/python -m choreo_agents.bench
	-$(BIN)/choreo-dev bench
	-$(BIN)/python -m choreo_dev.operator_bench

# The whole product on a local cluster: chart, operator, agents, faults, Prometheus, plots.
demo: setup cluster-binaries
	$(BIN)/choreo-dev demo --out out/demo

# The scenario suite at soak length (scale, then MINUTES of chaos), as a benchmark table.
MINUTES ?= 10
soak: setup cluster-binaries
	$(BIN)/python -m choreo_dev.soak --minutes $(MINUTES)

clean:
	rm -rf $(VENV) synthesizer/engine/target out
