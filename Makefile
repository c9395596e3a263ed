# The two entry points of README.md. Each creates .venv on first use.
PYTHON ?= python3
VENV ?= .venv
# The CPU wheel on the dev machines; override on a CUDA host (e.g. TORCH_SPEC="torch") to get the CUDA build.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
MODEL ?=

.PHONY: serve test lint format clean

$(BIN)/hyserve: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

serve: $(BIN)/hyserve
	$(BIN)/hyserve serve $(if $(MODEL),--model $(MODEL),) --host $(HOST) --port $(PORT)

test: $(BIN)/hyserve
	$(BIN)/ruff check src tests scripts
	$(BIN)/python -m pytest

lint: $(BIN)/hyserve
	$(BIN)/ruff check src tests scripts
	$(BIN)/ruff format --check src tests scripts

format: $(BIN)/hyserve
	$(BIN)/ruff format src tests scripts
	$(BIN)/ruff check --fix src tests scripts

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
