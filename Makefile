# Entry points: `make demo` (engine on the CPU + diagnosis), `make lint` (ruff + mypy) and
# `make test` (lint, then pytest).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.srtscope-installed
# Where torch comes from, e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu (the CPU builds;
# PyPI's default torch wheel is a CUDA build). Empty: pip's own configuration decides.
TORCH_INDEX ?=

.PHONY: demo lint test test-all install clean engines engines-vllm engines-sglang

# torch first, pinned to a version (TORCH_VERSION, default 2.13.0), so that the unpinned
# dependency is already satisfied. The pin names no build: which wheel comes is up to pip's
# configuration. On the project's machines pip's find-links (/opt/wheels, see `pip config list`)
# holds the local 2.13.0+cpu wheel, which pip takes; elsewhere PyPI's default wheel is a CUDA
# build. TORCH_INDEX adds --index-url for this one install only.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)") \
		"torch==$${TORCH_VERSION:-2.13.0}"
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The demo: the engine on the CPU (its embedded tiny model, 8 requests x 32 new tokens) with a 20 ms
# busy-wait planted in the scheduler every step. The diagnosis must name it: scheduler / sched_cpu,
# with a what-if that gives the step time back without it. (A run without a planted delay is called
# clean: "no dominant bottleneck", its batch preparation under a quarter of the step.)
DEMO_ARGS ?= --requests 8 --max-new-tokens 32 --inject sched=20000
demo: $(STAMP)
	$(VENV)/bin/srtscope run --out runs/demo $(DEMO_ARGS)
	@echo "The verdict above should read SCHEDULER / sched_cpu (the planted 20 ms). srtscope is in $(VENV)/bin,"
	@echo "not on your PATH: type $(VENV)/bin/srtscope ..., or 'source $(VENV)/bin/activate' once per shell."

# ruff and mypy as configured in pyproject.toml; mypy checks the package as srtscope.* (see
# scripts/typecheck.py for why not the folders by path)
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) scripts/typecheck.py

# Real engines (not part of `make test`: 3 GB venvs, minutes): vLLM's CPU build and SGLang 0.5.23 on
# the CPU with delays injected into their own functions: vLLM offline on every capture path (vllm_rig)
# and as a multi-process server under capture --server (vllm_server_rig); SGLang offline and as a
# server, from its own profiler's traces (sglang_rig).
# VLLM_VENV / SGLANG_VENV: where the rigs' venvs live (made on first use by benchmarks/engines/setup_vllm.sh
# and setup_sglang.sh). `make engines-vllm` / `make engines-sglang`: one engine.
VLLM_VENV ?= benchmarks/engines/.venv
SGLANG_VENV ?= benchmarks/engines/.venv-sglang
engines: engines-vllm engines-sglang

engines-vllm: $(STAMP)
	[ -f "$(VLLM_VENV)/tiny-llama-decode/config.json" ] || benchmarks/engines/setup_vllm.sh "$(VLLM_VENV)"
	$(PY) -m benchmarks.engines.vllm_rig --venv "$(VLLM_VENV)"
	$(PY) -m benchmarks.engines.vllm_server_rig --venv "$(VLLM_VENV)"

engines-sglang: $(STAMP)
	[ -f "$(SGLANG_VENV)/tiny-llama-decode/config.json" ] || benchmarks/engines/setup_sglang.sh "$(SGLANG_VENV)"
	$(PY) -m benchmarks.engines.sglang_rig --venv "$(SGLANG_VENV)"

# The fast tier (a few minutes); test-all adds the slow tier (tests/slow_tier.py: engine runs, big
# exports, Dask clusters, killed processes, the browser) and is what CI runs.
test: lint
	$(PY) -m pytest -q -m "not slow"

test-all: test
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) runs build *.egg-info
