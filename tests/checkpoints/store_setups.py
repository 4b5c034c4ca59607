"""The `store_factory` and `store` fixtures: every contract test runs once per store set-up.

Set-ups: memory, sqlite, fakeredis, redis (real server), sqlalchemy-sqlite (aiosqlite) and
sqlalchemy-pg (real PostgreSQL). Each test gets empty backing storage of its own (a new
file, a new Redis key prefix, a new Postgres table prefix), which is removed afterwards.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from store_kit import Opened, StoreFactory

from agentflow.exec.checkpoints import CheckpointStore, MemoryCheckpointStore
from agentflow.exec.checkpoints.sqlalchemy._pg import drop_functions


def backend_class(module: str, name: str) -> Any:
    """Import a store class from `agentflow.exec.checkpoints.<module>` (a missing one fails the suite)."""
    return getattr(importlib.import_module(f"agentflow.exec.checkpoints.{module}"), name)


# ---------------------------------------------------------------------------------------


@asynccontextmanager
async def _memory(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> AsyncIterator[Opened]:
    # One store object: memory lives in it, so a second object would not see the data.
    store = MemoryCheckpointStore()
    yield (lambda: store), None


@asynccontextmanager
async def _sqlite(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> AsyncIterator[Opened]:
    store_class = backend_class("sqlite", "SQLiteCheckpointStore")
    path = tmp_path / "runs.db"
    yield (lambda: store_class(path)), {"backend": "sqlite", "path": str(path)}


@asynccontextmanager
async def _fakeredis(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> AsyncIterator[Opened]:
    import fakeredis

    store_class = backend_class("redis", "RedisCheckpointStore")
    server = fakeredis.FakeServer()  # every client the store makes talks to this one server
    yield (lambda: store_class(lambda: fakeredis.FakeAsyncRedis(server=server), prefix=prefix)), None


@asynccontextmanager
async def _redis(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> AsyncIterator[Opened]:
    import redis.asyncio

    url: str = request.getfixturevalue("redis_url")
    store_class = backend_class("redis", "RedisCheckpointStore")
    try:
        yield (
            (lambda: store_class(lambda: redis.asyncio.Redis.from_url(url), prefix=prefix)),
            {
                "backend": "redis",
                "url": url,
                "prefix": prefix,
            },
        )
    finally:
        client = redis.asyncio.Redis.from_url(url)
        try:  # only this test's keys: never FLUSHALL a server others use
            keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=500)]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()


@asynccontextmanager
async def _sqlalchemy_sqlite(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> AsyncIterator[Opened]:
    store_class = backend_class("sqlalchemy", "SQLAlchemyCheckpointStore")
    url = f"sqlite+aiosqlite:///{tmp_path / 'runs.db'}"
    yield (lambda: store_class(url)), {"backend": "sqlalchemy", "url": url}


@asynccontextmanager
async def _sqlalchemy_pg(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> AsyncIterator[Opened]:
    import asyncpg

    url: str = request.getfixturevalue("postgres_url")
    store_class = backend_class("sqlalchemy", "SQLAlchemyCheckpointStore")
    table_prefix = f"{prefix}_"
    try:
        yield (
            (lambda: store_class(url, table_prefix=table_prefix)),
            {
                "backend": "sqlalchemy",
                "url": url,
                "table_prefix": table_prefix,
            },
        )
    finally:
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://", 1))
        try:
            tables = await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND starts_with(tablename, $1)",
                table_prefix,
            )
            for row in tables:
                await conn.execute(f'DROP TABLE IF EXISTS "{row["tablename"]}" CASCADE')
            for statement in drop_functions(table_prefix):
                await conn.execute(statement)
        finally:
            await conn.close()


_SETUPS: dict[str, Callable[[pytest.FixtureRequest, Path, str], AbstractAsyncContextManager[Opened]]] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "fakeredis": _fakeredis,
    "redis": _redis,
    "sqlalchemy-sqlite": _sqlalchemy_sqlite,
    "sqlalchemy-pg": _sqlalchemy_pg,
}


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        "fakeredis",
        pytest.param("redis", marks=pytest.mark.redis),
        "sqlalchemy-sqlite",
        pytest.param("sqlalchemy-pg", marks=pytest.mark.postgres),
    ]
)
async def store_factory(
    request: pytest.FixtureRequest, tmp_path: Path, unique_prefix: Callable[[], str]
) -> AsyncIterator[StoreFactory]:
    """Each store set-up in turn, over fresh backing storage; every store opened is closed afterwards."""
    name: str = request.param
    async with _SETUPS[name](request, tmp_path, unique_prefix()) as (make, spec):
        factory = StoreFactory(name, make, spec)
        try:
            yield factory
        finally:
            for store in factory.opened:
                await store.aclose()


@pytest.fixture
async def store(store_factory: StoreFactory) -> CheckpointStore:
    """A store of the set-up under test, empty."""
    return await store_factory()
