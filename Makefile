# The two set-up commands of the README: `make run` and `make test`. Each installs what it needs
# into .venv first (once; again when pyproject.toml changes).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
# With pip's --no-compile (below) the venv's bytecode is written when first imported; with
# PYTHONDONTWRITEBYTECODE set it never is (docs/development.md#stack-notes).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test test-fast install lint bench docker-lint

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch==2.13.0 is pinned in pyproject.toml: pip takes the CPU build from the local disk.
	# --no-compile: Python compiles a module when it is first imported, only the ones used;
	# compiling all ~24,000 files installed, at ~5 ms a file, took pip about two minutes.
	$(BIN)/pip install --quiet --no-compile -e ".[dev]"
	echo "$(CURDIR)" > $@

# A .venv copied along with the checkout still runs the original's code (its editable install
# and scripts hold the old paths): the marker names the checkout it was made for.
install: $(VENV)/.installed
	@test "$$(cat $<)" = "$(CURDIR)" || { rm -f $<; $(MAKE) --no-print-directory install; }

run: install  ## the whole pipeline on the embedded defaults (params.yaml)
	bertflow run

# The suite in WORKERS processes, a test file each at a time (a file's tests share its fixtures),
# in file order: tests/conftest.py puts the longest files first.
WORKERS ?= 2
PYTEST_PARALLEL := -n $(WORKERS) --dist loadfile --no-loadscope-reorder

test: install  ## the test suite: real Prefect, DVC, MLflow, GX and Lightning (what CI runs)
	pytest $(PYTEST_PARALLEL) --durations=25

test-fast: install  ## the fast loop while editing: every test not marked slow (< 3 min)
	pytest $(PYTEST_PARALLEL) -m "not slow"

lint: install
	ruff check .

# The speed set (benchmarks/speed) that needs no pipeline run, then batch prediction and serving,
# which need `make run` first; the others are run by hand (docs/benchmarks.md). Each rewrites its
# section of benchmarks/RESULTS.md.
bench: install  ## speed benchmarks; prediction and serving need `make run` first
	python -m benchmarks.speed.data_throughput
	python -m benchmarks.speed.pretrain_throughput
	python -m benchmarks.speed.cpu_bf16
	python -m benchmarks.speed.optimizer_step
	python -m benchmarks.speed.predict_throughput
	python -m benchmarks.speed.serve_load
