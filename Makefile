# make test: create .venv, install dpledger with its dependencies (torch pinned), run the suite.
# make demo: same install, then the end-to-end demo on the embedded default.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.dpledger-installed
# One thread: on 2 shared cores the default 2-thread OpenMP runs 4x slower (measured; README, Performance).
export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install test test-slow lint typecheck docs wheel-check demo bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned, so that nothing pulls a CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,dask]'
	touch $(STAMP)

install: $(STAMP)

# the suite on every core, at most 4 (pytest-xdist; CI has 2): TEST_WORKERS=0 runs it in this process.
# Whole files go to the workers, the longest first (tests/durations.py), not reordered by test count.
TEST_WORKERS ?= auto
XDIST := -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile --no-loadscope-reorder
# The kernels compile first, once, split across the cores (dpledger.mechanisms.warmup): in a clean clone the
# workers, Dask workers and CLI subprocesses would otherwise each compile them at once.
test: install
	$(PY) -m dpledger.mechanisms.warmup
	$(PY) -m pytest -q $(XDIST) tests

test-slow: install
	$(PY) -m dpledger.mechanisms.warmup
	$(PY) -m pytest -q $(XDIST) -m slow tests

lint: install
	$(VENV)/bin/ruff check .

# mypy: strict on accounting/ and mechanisms/, the default level elsewhere (pyproject.toml, [tool.mypy])
typecheck: install
	.ci/typecheck $(VENV)/bin/mypy

# the API reference from the docstrings (pdoc), into build/api
docs: install
	.ci/api_docs $(PY) build/api

# a wheel in a fresh venv runs every subcommand beside folders named like the project's packages
wheel-check: install
	.ci/wheel_check $(PY)

demo: install
	$(PY) -m dpledger demo

# DPLEDGER_REFERENCE=/path/to/pmixed (a checkout of james-flemings/pmixed): time its own steps beside
# dpledger's; unset, an in-repo baseline that follows them (benchmarks/baselines.py)
bench: install
	$(PY) benchmarks/run_benchmarks.py

clean:
	rm -rf $(VENV) runs .dpledger-cache
