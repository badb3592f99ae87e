# The two commands a newcomer runs: `make demo` and `make test`. Each builds .venv by itself.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("snowflake_db needs Python 3.11+, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m example_project

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy --strict snowflake_db

test: lint
	$(BIN)/python -m pytest
	bash tests/run_django6.sh -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_generate.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
