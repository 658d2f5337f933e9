# Two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# On a machine without CUDA take the CPU wheel of torch first; an unpinned torch pulls a CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test lint setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/seqpar check --world 4

test: $(STAMP)
	$(BIN)/ruff check seqpar tests
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check seqpar tests

clean:
	rm -rf $(VENV) mlruns mlflow.db .pytest_cache
