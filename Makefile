# Two commands for a fresh machine: `make demo` and `make test`. Both set everything up first.
VENV       ?= .venv
PY         := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP      := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: setup demo test lab lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the pinned torch first: an open requirement alone would pull a multi-GB CUDA build
	$(PY) -m pip install -q "$(TORCH_SPEC)" numpy
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PY) -m workbench.demo

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

lab: setup
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1

lint: setup
	$(VENV)/bin/ruff check workbench tests bench

clean:
	rm -rf build .pytest_cache
