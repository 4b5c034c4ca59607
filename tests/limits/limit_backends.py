"""The ``backend`` fixture: each limits backend in turn, on a prefix of its own.

Backends: local; Redis, real and fakeredis; SQL on a SQLite file and on PostgreSQL.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from _kit.stores import _remove_postgres_tables, _remove_redis_keys

from agentflow.exec.limits import LimitBackend, LocalLimits, RedisLimits
from agentflow.exec.limits.sql import SQLLimits


@pytest.fixture
def prefix() -> str:
    return f"lim{uuid.uuid4().hex[:12]}"


@pytest.fixture(
    params=[
        "local",
        "fakeredis",
        pytest.param("redis", marks=pytest.mark.redis),
        "sql-sqlite",
        pytest.param("sql-postgres", marks=pytest.mark.postgres),
    ]
)
async def backend(request: pytest.FixtureRequest, prefix: str, tmp_path: Path) -> AsyncIterator[LimitBackend]:
    if request.param == "local":
        yield LocalLimits()
        return
    if request.param.startswith("sql-"):
        if request.param == "sql-sqlite":
            db = f"sqlite+aiosqlite:///{tmp_path / 'limits.db'}"
        else:
            db = request.getfixturevalue("postgres_url")
        made_sql = SQLLimits(db, table_prefix=f"{prefix}_")
        try:
            yield made_sql
            await made_sql.aclose()
        finally:
            if request.param == "sql-postgres":
                _remove_postgres_tables(db.replace("+asyncpg", "", 1), f"{prefix}_")
        return
    if request.param == "fakeredis":
        import fakeredis

        server = fakeredis.FakeServer()
        made: LimitBackend = RedisLimits(lambda: fakeredis.FakeAsyncRedis(server=server), prefix=prefix)
        yield made
        await made.aclose()
        return
    url: str = request.getfixturevalue("redis_url")
    made = RedisLimits.from_url(f"{url}#{prefix}")
    try:
        yield made
        await made.aclose()
    finally:
        _remove_redis_keys(url, prefix)  # this test's keys only
