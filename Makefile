# One command per chore. `make run` and `make test` set everything up themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU wheel of torch 2.13 is what pip finds on our machines; installing it first stops a
# dependency from pulling the (several GB) CUDA build.
TORCH := torch==2.13.0

.PHONY: install install-test run test test-fast lint bench server deploy clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

## run: the main job (morphogenesis flow growing the MNIST-1D CNN, ephemeral Prefect, SQLite, CPU);
## RECIPE=digits-mlp (or any recipe) to grow another, ARGS for more options
RECIPE ?= mnist1d-cnn-grown
run: install
	$(BIN)/esper run --recipe $(RECIPE) $(ARGS)

## test: lint, then the whole suite, slow-marked tests included (what CI runs), one worker per
## core up to 4: most slow tests wait on a child process or a server, so two workers on CI's two
## cores keep both busy
test: lint
	$(BIN)/python -m pytest -n auto --maxprocesses 4 --dist worksteal $(PYTEST_ARGS)

## lint: ruff, then mypy over esper_core ([tool.mypy] in pyproject.toml lists the modules whose
## type errors are still debt)
lint: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy esper_core

## test-fast: skip slow-marked tests
test-fast: install-test
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

bench: install
	$(BIN)/esper bench seed-reference

## server: local Prefect server (UI http://127.0.0.1:4200, database under ESPER_HOME) and a
## worker for the esper pool, in the foreground; Ctrl-C stops both. PORT=4201 to move it.
PORT ?= 4200
server: install
	$(BIN)/esper server start --port $(PORT)

## deploy: register every deployment of prefect.yaml with the server `make server` runs
deploy: install
	$(BIN)/esper server deploy --port $(PORT)

clean:
	rm -rf $(VENV) .esper .pytest_cache
