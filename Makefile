# slokit developer entry points. Everything bootstraps itself on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
VLLM_VENV := .venv-vllm

.PHONY: help venv vllm-env loadtools-env system-deps demo test test-fast test-loadtools lint bench clean

help:
	@echo "make demo       the main job on the simulator: replicas, sidecar, load, findings, explain"
	@echo "make test       the whole suite (bootstraps .venv, .venv-vllm, prometheus, chromium, gcc)"
	@echo "make test-fast  unit tests only (no real vLLM, no Prometheus, no browser)"
	@echo "make lint       ruff + mypy"
	@echo "make bench      benchmarks (figures quoted in README)"

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

vllm-env:
	bash scripts/vllm-env.sh $(VLLM_VENV)

# .venv-aiperf and .venv-guidellm: the real load tools for tests/loadtools. `make test`
# builds the ones the suite runs (LOADTOOLS, both); e.g. `make loadtools-env LOADTOOLS=aiperf`.
LOADTOOLS ?= aiperf guidellm
loadtools-env:
	SLOKIT_LOADTOOLS="$(LOADTOOLS)" bash scripts/loadtools-env.sh

system-deps:
	bash scripts/system-deps.sh

demo: venv
	$(BIN)/slokit demo

test: venv vllm-env loadtools-env system-deps
	SLOKIT_REQUIRE_VLLM=$${SLOKIT_REQUIRE_VLLM:-1} SLOKIT_REQUIRE_LOADTOOLS=$${SLOKIT_REQUIRE_LOADTOOLS:-1} \
	  bash scripts/test-tiers.sh $(BIN)/python

test-loadtools: venv loadtools-env
	SLOKIT_REQUIRE_LOADTOOLS=1 $(BIN)/python -m pytest -q -m loadtools tests/loadtools

test-fast: venv
	$(BIN)/python -m pytest -q -m "not vllm and not prometheus and not chromium and not slow and not loadtools"

lint: venv
	$(BIN)/ruff check slokit tests benchmarks
	$(BIN)/ruff format --check slokit tests benchmarks
	$(BIN)/mypy slokit

bench: venv
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
