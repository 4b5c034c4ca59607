# Two commands matter: `make demo` and `make test`. Both create .venv when it is absent.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo example test check lint typecheck docs pytest services bench sim sim-mutants failover soak all clean durations

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,redis,sqlalchemy,celery,metrics,otel]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m agentflow.demo

# A pydantic-ai agent on a fleet built from the package alone (examples/agent_fleet): two workers (one
# with beat) and Flower from its ten-line app module, a worker SIGKILLed inside the charge tool, the run
# parked on the charge in doubt, the operator's decision, and every order charged once. On the Redis of
# AGENTFLOW_REDIS_URL (default: the local one `make services` checks or starts).
example: $(STAMP) services
	$(PY) examples/agent_fleet/run_fleet.py

# The layers (pyproject.toml's [tool.importlinter] contracts) are checked by tests/test_layers.py, which
# runs lint-imports on the tree and breaks each contract on purpose in a copy: in `make check` and `make test`.
lint: $(STAMP)
	$(VENV)/bin/ruff check agentflow workers config tests bench scripts examples
	$(VENV)/bin/ruff format --check agentflow workers config tests bench scripts examples

# One mypy run over agentflow, workers, config and tests: pyproject.toml's [tool.mypy] names the files
# and how strict each module is (the tests may leave functions unannotated). A folder's conftest.py is
# the module `conftest` to mypy, which one run takes once: tests/conftest.py is checked, and the
# folders' ones, which only register fixtures from a module beside them (checked), are left out.
typecheck: $(STAMP)
	$(VENV)/bin/mypy

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir $(or $(SITE_DIR),site)

services:
	@scripts/services.sh

# Three test processes (pytest-xdist) on the 2 cores, each with its own Redis database, RabbitMQ
# virtual host, key prefixes, queues and port band (tests/conftest.py), so the Celery tests spread
# over them like the rest. Two left about a quarter of the CPU idle (tests wait on leases, worker
# processes and servers): a third fills it (pytest 490 s against 630 s, fresh clones at rest). An idle
# process takes tests queued on another (worksteal). PYTEST_XDIST= runs everything in one.
PYTEST_XDIST ?= -n 3 --dist worksteal

pytest: $(STAMP) services
	$(PY) -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

test: lint typecheck docs pytest

# The inner loop: lint, the type check and the tests that need no server (no Redis, PostgreSQL,
# RabbitMQ, Celery worker or browser): those marked redis, postgres, celery, browser or slow are left
# out, and tests/celery, whose tests go by their folder, not a mark. `make test` runs them all.
CHECK_TESTS ?= -m "not (redis or postgres or celery or browser or slow)" --ignore=tests/celery
check: lint typecheck
	$(PY) -m pytest -n 2 $(CHECK_TESTS) $(PYTEST_ARGS)

# Where `make test`'s time goes: runs its stages timed (caches removed first, as in a fresh clone)
# and rewrites tests/DURATIONS.md (the stages, test time per folder, the slowest tests).
durations: $(STAMP) services
	$(PY) scripts/durations.py

all: test

# The deterministic simulation of the run protocol (docs/simulation.md): STEPS scheduling steps on
# each store set-up (SETUP: memory, sqlite or fakeredis; all by default). A failure prints the
# episode's seed: SEED=... (and SUPPRESS=..., as printed) replays that one episode. LOST_WRITES=0.002
# adds failovers that lose acknowledged writes, on memory (breaks) and memory-waiting (holds).
STEPS ?= 1000000
sim: $(STAMP)
	$(PY) -m agentflow.sim --steps $(STEPS) $(if $(SETUP),--setup $(SETUP)) $(if $(SEED),--episode $(SEED)) \
		$(if $(SUPPRESS),--suppress $(SUPPRESS)) $(if $(LOST_WRITES),--lost-writes $(LOST_WRITES))

# The mutation kit (docs/simulation.md, Reach): each planted bug hunted from SEEDS seeds, MUTANT_STEPS
# steps at most per hunt (and MUTANT_SECONDS of wall clock), one hunt at a time; prints the steps to
# detection per mutant and seed, and fails when a mutant was not found from every seed. MUTANT=name
# hunts one (repeatable through the module: python -m agentflow.sim.mutants --help).
SEEDS ?= 5
MUTANT_STEPS ?= 300000
MUTANT_SECONDS ?= 600
sim-mutants: $(STAMP)
	$(PY) -m agentflow.sim.mutants --seeds $(SEEDS) --steps $(MUTANT_STEPS) --seconds $(MUTANT_SECONDS) \
		$(if $(MUTANT),--mutant $(MUTANT)) $(if $(SETUP),--setup $(SETUP))

# bench/ is type-checked here, where its extra (LangGraph, matplotlib) is installed.
bench: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	$(VENV)/bin/mypy bench
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# The failover tests' long form (docs/stores/redis.md, Failover and durability): ROUNDS failovers per
# set-up, through Sentinel and by host crash, each with and without the store's durability options;
# prints each set-up's tally (runs, duplicated effects, runs lost, calls in doubt).
ROUNDS ?= 20
failover: $(STAMP) services
	AGENTFLOW_FAILOVER_ROUNDS=$(ROUNDS) $(PY) -m pytest tests/celery/test_failover.py -q -s -p no:warnings

# The soaks' long forms, which `make test` runs at their shortest meaningful length: the chaos soak
# for CHAOS_SECONDS of random SIGKILLs over CHAOS_RUNS runs on each set-up, AGENT_KILLS random SIGKILLs
# of durable pydantic-ai agents' worker processes (tests/agent) and as many of their Celery workers, then
# `make failover`.
CHAOS_SECONDS ?= 600
CHAOS_RUNS ?= 500
AGENT_KILLS ?= 200
soak: $(STAMP) services
	AGENTFLOW_CHAOS_SECONDS=$(CHAOS_SECONDS) AGENTFLOW_CHAOS_RUNS=$(CHAOS_RUNS) \
		$(PY) -m pytest tests/celery/test_chaos.py -q -s -p no:warnings
	AGENT_KILLS=$(AGENT_KILLS) $(PY) -m pytest tests/agent/test_agent_crash.py -k random_kills -q -s -p no:warnings \
		--timeout 3600
	AGENT_WORKER_KILLS=$(AGENT_KILLS) $(PY) -m pytest tests/celery/test_agent_workers.py -k random_worker_kills -q -s \
		-p no:warnings --timeout 7200
	$(MAKE) failover ROUNDS=$(ROUNDS)
