# Two commands for a fresh machine: `make demo` and `make test`. Both set everything up first.
VENV       ?= .venv
PY         := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP      := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# The JupyterLab extension and the dashboard's ES module (extension/src/widget/dashboard.ts ->
# workbench/widgets/dashboard.js) are built by the package build (hatch-jupyter-builder runs jlpm in
# extension/, which needs Node >= 20.19 and npm's registry); rebuilt when their sources change.
LABEXT     := workbench/labextension/package.json
DASHBOARD_JS := workbench/widgets/dashboard.js
EXT_SRC    := $(wildcard extension/src/*.ts extension/src/*.tsx extension/src/widget/*.ts extension/style/*) \
              $(wildcard extension/tsconfig*.json) extension/package.json extension/yarn.lock
JLPM       := $(abspath $(VENV))/bin/jlpm

.PHONY: setup demo notebooks test test-js lab lint lint-js docs clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the pinned torch first: an open requirement alone would pull a multi-GB CUDA build
	$(PY) -m pip install -q "$(TORCH_SPEC)" numpy
	$(PY) -m pip install -q -e ".[test,docs,kubernetes]"
	touch $(STAMP)

$(LABEXT) $(DASHBOARD_JS) &: $(EXT_SRC) | $(STAMP)
	$(PY) -m pip install -q --no-deps -e .
	touch $(LABEXT) $(DASHBOARD_JS)

setup: $(STAMP) $(LABEXT) $(DASHBOARD_JS)

demo: setup
	$(VENV)/bin/workbench demo --out build

# every walkthrough, executed on a local 2-engine CPU pool, then rendered to build/notebooks/*.html
notebooks: setup
	$(PY) -m workbench.demo --html --out build/notebooks $(sort $(wildcard notebooks/*.ipynb))

test: setup test-js
	$(PY) -m pytest $(PYTEST_ARGS)

# TypeScript unit tests of the sidebar and the dashboard's module (jest)
test-js: setup
	cd extension && $(JLPM) test

lab: setup
	$(VENV)/bin/workbench kernels install --sys-prefix
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1

# the docs site (mkdocs.yml) into build/site, every warning an error; make test builds it too (tests/docs)
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d build/site

lint: setup lint-js
	$(VENV)/bin/ruff check workbench tests bench

lint-js: setup
	cd extension && $(JLPM) lint:check && $(JLPM) tsc --noEmit

clean:
	rm -rf build .pytest_cache

# Benchmarks against the tools users would pick instead (issue 9): bench/results/*.json and
# bench/results/RESULTS.md. The anchors (nbdistributed, accelerate) get their own environment,
# torch pinned first; if they cannot be installed, the table says so. BENCH_ARGS: e.g. --only cells
ANCHORS_VENV := bench/.venv-anchors
BENCH_ARGS   ?=
.PHONY: bench
bench: $(STAMP)
	@test -f $(ANCHORS_VENV)/.installed-stamp -a $(ANCHORS_VENV)/.installed-stamp -nt bench/requirements-anchors.txt || \
	  { { test -x $(ANCHORS_VENV)/bin/python || python3 -m venv $(ANCHORS_VENV); } && \
	    $(ANCHORS_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)" numpy && \
	    $(ANCHORS_VENV)/bin/python -m pip install -q -r bench/requirements-anchors.txt && \
	    touch $(ANCHORS_VENV)/.installed-stamp; } || \
	  echo "bench: the anchors could not be installed into $(ANCHORS_VENV); the table will say so"
	$(PY) -m bench.run $(BENCH_ARGS)
