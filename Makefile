# EARS Studio. `make test` and `make demo` each build .venv from scratch when it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: install test test-fast demo clean

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(PIP) install torch==2.13.0
	$(PIP) install -r requirements.txt
	$(PIP) install --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

# The whole suite, slow tests included (what CI runs). pytest's exit code 5 (no tests) fails too.
test: install
	$(PY) -m pytest

# Skip the tests marked slow.
test-fast: install
	$(PY) -m pytest -m "not slow"

demo: install
	$(PY) -m ears_core.demo_tiny

clean:
	rm -rf $(VENV) .pytest_cache
