"""`SQLLimits`: limits shared through a database, on SQLAlchemy: PostgreSQL (asyncpg) or a SQLite file (aiosqlite).

Tables (``T`` is the table prefix; the same schema on both databases, made by `MIGRATIONS`)::

    T limit_state   (name, key, closed_until)          one row per limit and tenant key: the lock
    T limit_held    (name, key, token, lapses_at)      the held slots
    T limit_starts  (name, key, token, started_at)     the starts still in the window

Times are seconds since the epoch as doubles. Each operation is one transaction that
first locks its limit and key, then drops lapsed holders and starts that left the window,
then decides; so a slot and a start are taken together or not at all, as in Redis.

- PostgreSQL: the lock is the ``limit_state`` row (``SELECT ... FOR UPDATE``, after an
  upsert that makes it), and now is the server's ``clock_timestamp()``: every host agrees.
- SQLite: the lock is the file's write lock (``BEGIN IMMEDIATE``), and now is this host's
  clock: every process sharing the file runs on this host.

Engines are made per process and event loop (`Connector`, as the SQL store's), lazily.
"""

from __future__ import annotations

import os
import time
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agentflow._errors import CheckpointError, LimitsUnavailable
from agentflow.exec.checkpoints.sqlalchemy.engines import Connector, check_url
from agentflow.exec.limits._protocol import Refusal
from agentflow.exec.limits._spec import Limit

#: The schema, in order; `setup` runs each statement (all idempotent) on the first use in a process.
MIGRATIONS: Final = [
    "CREATE TABLE IF NOT EXISTS {t}limit_state (name TEXT NOT NULL, key TEXT NOT NULL, "
    "closed_until DOUBLE PRECISION NOT NULL DEFAULT 0, PRIMARY KEY (name, key))",
    "CREATE TABLE IF NOT EXISTS {t}limit_held (name TEXT NOT NULL, key TEXT NOT NULL, token TEXT NOT NULL, "
    "lapses_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (name, key, token))",
    "CREATE TABLE IF NOT EXISTS {t}limit_starts (name TEXT NOT NULL, key TEXT NOT NULL, token TEXT NOT NULL, "
    "started_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (name, key, token))",
]


class SQLLimits:
    """Limits kept in a database: shared by every worker (PostgreSQL), or by the processes of one host (SQLite)."""

    def __init__(self, url: str, *, table_prefix: str = "agentflow_") -> None:
        """Limits in the database at `url` (``postgresql+asyncpg://...`` or ``sqlite+aiosqlite:///path``).

        Raises:
            ValueError: the URL names another database or a sync driver, or the prefix is not a plain name.
        """
        if not table_prefix.replace("_", "").isalnum():
            raise ValueError(f"table_prefix must be letters, digits and underscores, not {table_prefix!r}")
        self._url, self._t = check_url(url), table_prefix
        self._db = Connector(self._url, {})
        self._pid = os.getpid()
        self._ready: set[int] = set()

    def _sql(self, text: str) -> sa.TextClause:
        return sa.text(text.replace("{t}", self._t))

    async def _now(self, conn: AsyncConnection, limit: Limit, key: str) -> tuple[float, float]:
        """Lock the limit and key for this transaction; return now and its back-off's end."""
        ids = {"n": limit.name, "k": key}
        await conn.execute(
            self._sql("INSERT INTO {t}limit_state (name, key) VALUES (:n, :k) ON CONFLICT DO NOTHING"), ids
        )
        if self._db.sqlite:  # the transaction holds the file's write lock already
            row = (
                await conn.execute(
                    self._sql("SELECT closed_until FROM {t}limit_state WHERE name = :n AND key = :k"), ids
                )
            ).one()
            return time.time(), float(row[0])
        row = (
            await conn.execute(
                self._sql(
                    "SELECT extract(epoch FROM clock_timestamp()), closed_until FROM {t}limit_state "
                    "WHERE name = :n AND key = :k FOR UPDATE"
                ),
                ids,
            )
        ).one()
        return float(row[0]), float(row[1])

    async def _run(self, op: str, limit: Limit, key: str, token: str = "", seconds: float = 0.0) -> Any:
        if self._pid != os.getpid():  # forked: never use the parent's pools
            self._db, self._pid, self._ready = Connector(self._url, {}), os.getpid(), set()
        try:
            entry = await self._db.engine()
            if id(entry) not in self._ready:
                async with entry.setup_lock, self._db.begin(entry, write=True) as conn:
                    for statement in MIGRATIONS:
                        await conn.execute(self._sql(statement))
                self._ready.add(id(entry))
            async with self._db.begin(entry, write=True) as conn:
                now, closed = await self._now(conn, limit, key)
                return await getattr(self, f"_{op}")(conn, limit, key, token, seconds, now, closed)
        except CheckpointError as exc:  # what the shared connector says when the database fails
            raise LimitsUnavailable(f"SQLLimits: {exc}") from exc

    async def _take(
        self, conn: AsyncConnection, limit: Limit, key: str, token: str, _: float, now: float, closed: float
    ) -> Refusal | None:
        ids = {"n": limit.name, "k": key, "tok": token, "now": now}
        if closed > now:
            return Refusal("closed", closed - now)
        if limit.concurrency is not None:
            count, oldest = await self._live(conn, "held", "lapses_at", now, ids)
            if count >= limit.concurrency:
                return Refusal("concurrency", oldest - now)
        if limit.rate is not None:
            count, oldest = await self._live(conn, "starts", "started_at", now - limit.window_s, ids)
            if count >= limit.rate:
                return Refusal("rate", oldest + limit.window_s - now)
        if limit.concurrency is not None:
            ids["lapses"] = now + limit.hold_s
            await conn.execute(self._sql("INSERT INTO {t}limit_held VALUES (:n, :k, :tok, :lapses)"), ids)
        if limit.rate is not None:
            await conn.execute(self._sql("INSERT INTO {t}limit_starts VALUES (:n, :k, :tok, :now)"), ids)
        return None

    async def _live(
        self, conn: AsyncConnection, table: str, column: str, cutoff: float, ids: dict[str, Any]
    ) -> tuple[int, float]:
        """Drop the rows of `table` whose `column` is at or before `cutoff`; count the rest, and their oldest."""
        where = f"FROM {{t}}limit_{table} WHERE name = :n AND key = :k"
        await conn.execute(self._sql(f"DELETE {where} AND {column} <= :cutoff"), {**ids, "cutoff": cutoff})
        count, oldest = (await conn.execute(self._sql(f"SELECT count(*), min({column}) {where}"), ids)).one()
        return int(count), float(oldest or 0.0)

    async def _start(
        self, conn: AsyncConnection, limit: Limit, key: str, token: str, _: float, now: float, __: float
    ) -> None:
        ids = {"n": limit.name, "k": key, "tok": token, "now": now, "cutoff": now - limit.window_s}
        await conn.execute(
            self._sql(
                "UPDATE {t}limit_starts SET started_at = :now WHERE name = :n AND key = :k AND token = :tok "
                "AND started_at > :cutoff"
            ),
            ids,
        )

    async def _renew(
        self, conn: AsyncConnection, limit: Limit, key: str, token: str, _: float, now: float, __: float
    ) -> bool:
        ids = {"n": limit.name, "k": key, "tok": token, "now": now, "lapses": now + limit.hold_s}
        done = await conn.execute(
            self._sql(
                "UPDATE {t}limit_held SET lapses_at = :lapses WHERE name = :n AND key = :k AND token = :tok "
                "AND lapses_at > :now"
            ),
            ids,
        )
        return bool(done.rowcount)

    async def _release(self, conn: AsyncConnection, limit: Limit, key: str, token: str, *_: float) -> None:
        ids = {"n": limit.name, "k": key, "tok": token}
        await conn.execute(self._sql("DELETE FROM {t}limit_held WHERE name = :n AND key = :k AND token = :tok"), ids)

    async def _close(
        self, conn: AsyncConnection, limit: Limit, key: str, _: str, seconds: float, now: float, closed: float
    ) -> float:
        until = max(closed, now + seconds)
        ids = {"n": limit.name, "k": key, "until": until}
        await conn.execute(
            self._sql("UPDATE {t}limit_state SET closed_until = :until WHERE name = :n AND key = :k"), ids
        )
        return until - now

    async def take(self, limit: Limit, key: str, token: str) -> Refusal | None:
        """See `LimitBackend.take`."""
        found: Refusal | None = await self._run("take", limit, key, token)
        return found

    async def start(self, limit: Limit, key: str, token: str) -> None:
        """See `LimitBackend.start`."""
        await self._run("start", limit, key, token)

    async def renew(self, limit: Limit, key: str, token: str) -> bool:
        """See `LimitBackend.renew`."""
        return bool(await self._run("renew", limit, key, token))

    async def release(self, limit: Limit, key: str, token: str) -> None:
        """See `LimitBackend.release`."""
        await self._run("release", limit, key, token)

    async def close(self, limit: Limit, key: str, seconds: float) -> float:
        """See `LimitBackend.close`."""
        return float(await self._run("close", limit, key, seconds=seconds))

    async def aclose(self) -> None:
        """Dispose of this event loop's engine (the next operation makes a new one)."""
        entry = await self._db.engine()
        await entry.keeper.aclose()
