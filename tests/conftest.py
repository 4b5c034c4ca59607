"""Servers the tests use, read from the environment: skipped locally when absent, a failure under CI."""

from __future__ import annotations

import asyncio
import gc
import os
import urllib.parse
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

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


def _own_database(url: str, worker: str | None) -> str:
    """`url` on this pytest-xdist process's own Redis database: ``gw0`` on the URL's database + 1, ``gw1`` + 2, ...

    Without xdist (`worker` None), the URL as given. The processes' tests then share no key,
    pub/sub channel (kombu names its fanout channels after the database: Celery's events and
    remote control) nor SCAN of the keyspace. What Redis keeps server-wide stays shared:
    ACL users (the tests make them under unique names) and Redis Functions libraries (named
    after their scripts' digest, loaded with REPLACE: the same text from every process).
    """
    if worker is None:
        return url
    parts = urllib.parse.urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{base + 1 + int(worker.removeprefix('gw'))}"))


REDIS_URL = _own_database(
    os.environ.get("AGENTFLOW_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), os.environ.get("PYTEST_XDIST_WORKER")
)
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


def pytest_configure(config: pytest.Config) -> None:
    """Refuse ``--dist loadgroup`` where pytest-xdist cannot group (it would spread every test on its own).

    pytest-xdist 3.8 groups by a ``@<group>`` suffix it writes into each node id, which pytest
    9.2's structured node ids no longer take (pytest-dev/pytest-xdist#1386): the tests of an
    ``xdist_group`` would then run side by side. pyproject.toml pins pytest below 9.2. (The
    Celery tests no longer form a group: each xdist process has its own Redis database, see
    `_own_database`, RabbitMQ virtual host, key prefixes, queues and port band, so they spread
    over every process like the others.)
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
