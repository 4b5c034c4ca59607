"""Stores on the real servers, each in a namespace of its own that is removed afterwards.

Redis: a unique key prefix; cleanup unlinks every key under it (SCAN, never FLUSHALL or
KEYS). PostgreSQL: a unique table prefix for agentflow (its tables are dropped) and a
unique schema for LangGraph (dropped with CASCADE).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any


def redis_parser() -> str:
    """The reply parser redis-py uses by default here: ``hiredis`` when that package is installed."""
    from redis.asyncio.connection import DefaultParser

    return "hiredis" if "Hiredis" in DefaultParser.__name__ else "pure Python"


def redis_factory(url: str, *, pure_python: bool = False) -> Any:
    """A client factory as the workers make them (no socket timeout: the store's deadline bounds each
    command); `pure_python` forces redis-py's own RESP3 parser even when hiredis is installed."""
    import redis.asyncio as aioredis

    if pure_python:
        from redis._parsers.resp3 import _AsyncRESP3Parser

        return lambda: aioredis.Redis.from_url(
            url, parser_class=_AsyncRESP3Parser, protocol=3, socket_timeout=None, socket_connect_timeout=5
        )
    return lambda: aioredis.Redis.from_url(url, socket_timeout=None, socket_connect_timeout=5)


async def redis_unlink_prefix(url: str, prefix: str) -> int:
    """Remove every key under ``prefix:`` and return how many there were."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    removed = 0
    try:
        batch: list[bytes] = []
        async for key in client.scan_iter(match=f"{prefix}:*", count=5000):
            batch.append(key)
            if len(batch) >= 5000:
                removed += await client.unlink(*batch)
                batch = []
        if batch:
            removed += await client.unlink(*batch)
    finally:
        await client.aclose()
    return removed


async def pg_drop_prefix(url: str, prefix: str) -> None:
    """Drop every table of the current schema whose name starts with `prefix`, and the store's functions."""
    import asyncpg

    from agentflow.exec.checkpoints.sqlalchemy._pg import drop_functions

    conn = await asyncpg.connect(url)
    try:
        names = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND starts_with(tablename, $1)", prefix
        )
        for (name,) in names:
            await conn.execute(f'DROP TABLE IF EXISTS "{name}" CASCADE')
        for statement in drop_functions(prefix):
            await conn.execute(statement)
    finally:
        await conn.close()


@asynccontextmanager
async def redis_store(url: str, prefix: str) -> AsyncIterator[Any]:
    """A `RedisCheckpointStore` under `prefix`; its keys are removed afterwards."""
    from agentflow.exec.checkpoints import RedisCheckpointStore

    store = RedisCheckpointStore(redis_factory(url), prefix=prefix, ttl_s=3600)
    try:
        yield store
    finally:
        await store.aclose()
        await redis_unlink_prefix(url, prefix)


@asynccontextmanager
async def fakeredis_store(prefix: str) -> AsyncIterator[Any]:
    """A `RedisCheckpointStore` on an in-process fakeredis server."""
    import fakeredis

    from agentflow.exec.checkpoints import RedisCheckpointStore

    server = fakeredis.FakeServer()
    store = RedisCheckpointStore(lambda: fakeredis.FakeAsyncRedis(server=server), prefix=prefix, ttl_s=3600)
    try:
        yield store
    finally:
        await store.aclose()


@asynccontextmanager
async def sqlalchemy_pg_store(url: str, table_prefix: str, *, synchronous_commit: bool = True) -> AsyncIterator[Any]:
    """A `SQLAlchemyCheckpointStore` on PostgreSQL under `table_prefix`; its tables are dropped afterwards.

    ``synchronous_commit=False`` sets it off for the store's sessions: commits stop waiting
    for the disk (a diagnostic of how much of a write is the flush, never a set-up to run).
    """
    from agentflow.exec.checkpoints import SQLAlchemyCheckpointStore

    settings = {} if synchronous_commit else {"connect_args": {"server_settings": {"synchronous_commit": "off"}}}
    store = SQLAlchemyCheckpointStore(
        url.replace("postgresql://", "postgresql+asyncpg://", 1), table_prefix=table_prefix, engine_options=settings
    )
    try:
        yield store
    finally:
        await store.aclose()
        await pg_drop_prefix(url, table_prefix)
