# Interlock: one command surface for people, hooks and CI.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Test processes (pytest-xdist). Most tests wait on real workers, brokers and
# databases rather than on the CPU, so three share two cores well; 0 runs serially.
TEST_WORKERS ?= 3

.DEFAULT_GOAL := help
.PHONY: help install demo test lint format typecheck bench check schemas clean

help: ## show this help
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP) ## create .venv and install Interlock with its dev tools

demo: $(STAMP) ## run the banking agent end to end, no server needed
	$(BIN)/interlock demo $(ARGS)

test: $(STAMP) ## run the whole test suite (real Redis, PostgreSQL and workers)
	$(BIN)/pytest -n $(TEST_WORKERS) $(ARGS)

lint: $(STAMP) ## ruff lint and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP) ## apply ruff format and autofixes
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: $(STAMP) ## mypy strict on the packages and the tests
	$(BIN)/mypy

schemas: $(STAMP) ## regenerate docs/schemas from the message models
	$(BIN)/interlock schemas --out docs/schemas

BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	@touch $(BENCH_STAMP)

# One JSON line per benchmark (bench/README.md). ARGS=--quick for a smoke run.
# bench.queue_cycle starts its own redis-server (needs redis-server on PATH).
bench: $(BENCH_STAMP) ## benchmarks: in process vs LangGraph/Pydantic AI, queued vs bare Celery
	$(BIN)/python -m bench.cycle $(ARGS)
	$(BIN)/python -m bench.growth $(ARGS)
	$(BIN)/python -m bench.queue_cycle $(ARGS)

check: lint typecheck test ## lint, typecheck and test

clean: ## remove the venv and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info
