"""LangGraph's checkpointers, set up the way the comparisons need them.

- SQLite: the connection handed to the saver gets ``PRAGMA synchronous`` after the saver's
  own ``setup`` (which switches the file to WAL, like agentflow's store), and the setting
  is read back so a comparison never runs at the wrong level by accident.
- PostgreSQL: the saver's tables go into a schema of their own (``search_path``), which is
  dropped afterwards.
- Every run gets a new ``thread_id``, as every agentflow run gets a new run id.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

_threads = itertools.count()


def config() -> dict[str, Any]:
    """A config with a new thread id (one per run)."""
    return {"configurable": {"thread_id": f"t{next(_threads)}"}}


def memory_saver() -> Any:
    from langgraph.checkpoint.memory import InMemorySaver

    return InMemorySaver()


def empty_memory_saver(saver: Any) -> None:
    """Forget every thread an InMemorySaver holds (between timing blocks, like `empty_memory_store`)."""
    saver.storage.clear()
    saver.writes.clear()
    saver.blobs.clear()


def memory_checkpoints(saver: Any, thread_id: str) -> int:
    """How many checkpoints an InMemorySaver holds for one thread."""
    return sum(len(v) for v in saver.storage[thread_id].values())


@asynccontextmanager
async def async_sqlite_saver(path: Path, synchronous: str) -> AsyncIterator[Any]:
    """An `AsyncSqliteSaver` on its own file, at the given ``PRAGMA synchronous``."""
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    conn = await aiosqlite.connect(path)
    try:
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        await conn.execute(f"PRAGMA synchronous = {synchronous}")
        async with conn.execute("PRAGMA synchronous") as cur:
            row = await cur.fetchone()
        assert row is not None
        level = row[0]
        assert level == {"NORMAL": 1, "FULL": 2}[synchronous], level
        yield saver
    finally:
        await conn.close()


def sqlite_saver(path: Path, synchronous: str) -> tuple[Any, sqlite3.Connection]:
    """A sync `SqliteSaver` on its own file, at the given ``PRAGMA synchronous`` (close the connection after)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == {"NORMAL": 1, "FULL": 2}[synchronous]
    return saver, conn


def sqlite_rows(path: Path, thread_id: str) -> tuple[int, int]:
    """(checkpoints, writes) rows a LangGraph SQLite file holds for one thread."""
    with sqlite3.connect(path) as conn:
        cps = conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = ?", (thread_id,)).fetchone()[0]
        writes = conn.execute("SELECT count(*) FROM writes WHERE thread_id = ?", (thread_id,)).fetchone()[0]
    return cps, writes


@asynccontextmanager
async def async_postgres_saver(pg_url: str, schema: str, *, synchronous_commit: bool = True) -> AsyncIterator[Any]:
    """An `AsyncPostgresSaver` whose tables live in `schema` (created here, dropped afterwards).

    ``synchronous_commit=False``: its commits do not wait for the disk (a diagnostic, as for the store).
    """
    import psycopg
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row

    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
        await admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        conn = await psycopg.AsyncConnection.connect(
            pg_url,
            autocommit=True,
            prepare_threshold=0,
            row_factory=dict_row,
            options=f"-c search_path={schema}" + ("" if synchronous_commit else " -c synchronous_commit=off"),
        )
        async with conn:
            saver = AsyncPostgresSaver(conn=conn)
            await saver.setup()
            yield saver
    finally:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
            await admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
