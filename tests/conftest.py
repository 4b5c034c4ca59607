"""Servers the tests use, read from the environment: skipped locally when absent, a failure under CI."""

from __future__ import annotations

import asyncio
import gc
import os
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from _kit.cluster import redis_cluster
from _kit.stores import any_store, shared_spec, store_setup
from _kit.workers import workers

__all__ = ["any_store", "redis_cluster", "shared_spec", "store_setup", "workers"]  # the kit's fixtures, for every test

#: Sockets still unclosed when the session ends, as their finalizers said (see `pytest_sessionfinish`).
_LEFT_OPEN: list[str] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Collect what the tests left behind, and say so in the summary instead of failing a passed run.

    pytest collects garbage once more after the session and fails the run on any warning a
    finalizer raises then, with no test to name. An unclosed socket found there belongs to
    no test (a long-lived client of a kit that its test did not close): it is listed in the
    terminal summary, so it stays visible. A warning during a test still fails that test.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for _ in range(5):
            gc.collect()
    _LEFT_OPEN.extend(str(w.message) for w in caught if issubclass(w.category, ResourceWarning))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _LEFT_OPEN:
        terminalreporter.section("left open at the end of the session")
        for message in _LEFT_OPEN:
            terminalreporter.line(message)


REDIS_URL = os.environ.get("AGENTFLOW_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get("AGENTFLOW_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")


def _unavailable(what: str, exc: BaseException) -> None:
    reason = f"{what} is not reachable ({type(exc).__name__}: {exc})"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must start it", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def redis_url() -> str:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        _unavailable(f"Redis at {REDIS_URL}", exc)
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture(scope="session")
def postgres_url() -> str:
    import asyncpg

    async def ping() -> None:
        conn = await asyncpg.connect(asyncpg_dsn(POSTGRES_URL), timeout=3)
        await conn.close()

    try:
        # On a thread of its own: a fixture may ask for this one while an event loop runs.
        with ThreadPoolExecutor(max_workers=1) as pool:
            pool.submit(lambda: asyncio.run(ping())).result()
    except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
        _unavailable(f"PostgreSQL at {POSTGRES_URL}", exc)
    return POSTGRES_URL


def asyncpg_dsn(url: str) -> str:
    """The SQLAlchemy URL without its driver name, as asyncpg takes it."""
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


@pytest.fixture
def unique_prefix() -> Callable[[], str]:
    """Make names no other test uses (Redis key prefixes, SQL table prefixes): ``t`` and 16 hex digits."""
    # 16 hex digits: unique enough, and short enough that prefixed Postgres index names stay under 63 bytes.
    return lambda: f"t{uuid.uuid4().hex[:16]}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``-n``), keep the tests that start Celery workers on one process, one at a time.

    Those are the tests marked ``celery`` and every test of tests/celery: they time real worker
    processes against leases and beat intervals, and two of them side by side would share the
    machine's two cores with each other's workers (and RabbitMQ's virtual host is one per
    process). The other tests spread over every process.

    First among the hooks: xdist's own turns the ``xdist_group`` mark into the node id's
    ``@celery`` suffix that its scheduler groups by, and sees no mark added after it (the
    suffix shows in the ids of failures: ``...::test_x@celery``).
    """
    for item in items:
        if item.get_closest_marker("celery") is not None or _CELERY_TESTS in item.path.parents:
            item.add_marker(pytest.mark.xdist_group("celery"))


def pytest_configure(config: pytest.Config) -> None:
    """Refuse ``--dist loadgroup`` where pytest-xdist cannot group (it would spread every test on its own).

    pytest-xdist 3.8 groups by a ``@<group>`` suffix it writes into each node id, which pytest
    9.2's structured node ids no longer take (pytest-dev/pytest-xdist#1386): the Celery tests
    would then run side by side on the two processes. pyproject.toml pins pytest below 9.2.
    """
    if getattr(config.option, "dist", None) != "loadgroup" or hasattr(config, "workerinput"):
        return
    from importlib.metadata import version as installed

    def version(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())

    xdist = installed("pytest-xdist")
    if version(pytest.__version__) >= (9, 2) and version(xdist) <= (3, 8):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with pytest-xdist {xdist} does not group tests under "
            "--dist loadgroup (pytest-dev/pytest-xdist#1386); install the versions pyproject.toml pins "
            "(pip install -e '.[dev]'), or run in one process: make test PYTEST_XDIST="
        )


_CELERY_TESTS = Path(__file__).parent / "celery"
