# Two commands matter: `make demo` and `make test`. Both create .venv when it is absent.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint typecheck docs pytest services bench all clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,redis,sqlalchemy,celery]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m agentflow.demo

# lint-imports checks the layers: the contracts in pyproject.toml's [tool.importlinter] (no cache dir left behind).
lint: $(STAMP)
	$(VENV)/bin/ruff check agentflow workers config tests bench
	$(VENV)/bin/ruff format --check agentflow workers config tests bench
	$(VENV)/bin/lint-imports --no-logo --no-cache

typecheck: $(STAMP)
	$(VENV)/bin/mypy agentflow workers config

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir $(or $(SITE_DIR),site)

services:
	@scripts/services.sh

pytest: $(STAMP) services
	$(PY) -m pytest $(PYTEST_ARGS)

test: lint typecheck docs pytest

all: test

# bench/ is type-checked here, where its extra (LangGraph, matplotlib) is installed.
bench: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	$(VENV)/bin/mypy bench
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
