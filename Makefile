# Every target bootstraps .venv itself; `make demo` and `make test` are all a new user needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.aurora-installed
# torch comes from the local CPU wheel on our machines (pip finds it); any matching release works elsewhere.
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv demo test test-fast lint bench chaos clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

demo: $(STAMP)
	$(PY) -m workers.demo

test: $(STAMP)
	$(PY) -m ruff check aurora_store workers tests
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

lint: $(STAMP)
	$(PY) -m ruff check aurora_store workers tests

bench: $(STAMP)
	$(PY) -m aurora_store.bench codec --json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
