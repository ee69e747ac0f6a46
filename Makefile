# Two entry points: `make demo` (engine on the CPU + diagnosis) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.srtscope-installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned to the CPU build, so that the unpinned dependency is already satisfied
	$(PY) -m pip install -q --disable-pip-version-check "torch==$${TORCH_VERSION:-2.13.0}"
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/srtscope run --out runs/demo

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs build *.egg-info
