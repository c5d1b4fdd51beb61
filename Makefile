# Two entry points: `make demo` runs the main job on the embedded default (no cluster),
# `make test` runs every check CI runs. Both install what they need into .venv first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: demo test lint typecheck unit

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	touch $@

demo: $(INSTALLED)
	$(BIN)/python examples/wordcount/demo.py

test: lint typecheck unit

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The packages' directories differ from their import names (operator/ must not shadow the
# standard library), so mypy reads them through a link tree named like the imports.
typecheck: $(INSTALLED)
	mkdir -p build/typecheck
	ln -sfn ../../operator build/typecheck/spark_checkpoint_operator
	ln -sfn ../../spark_app build/typecheck/spark_checkpoint
	$(BIN)/mypy -p spark_checkpoint_operator -p spark_checkpoint

unit: $(INSTALLED)
	$(BIN)/python -m pytest
