"""The connection layer of `SQLAlchemyCheckpointStore`: URLs, one engine per event loop, transactions.

A pool belongs to the event loop that opened its connections, so `Connector` keeps one
engine per running loop. Each engine is disposed by an async generator the loop itself
finalizes: ``asyncio.run`` shuts a loop's async generators down before it ends, so a store
used from several ``asyncio.run`` calls in a row leaves no pool open behind each. An engine
whose loop closed without that (a loop closed by hand) is dropped on the next use.

On SQLite the connector takes transaction control from the sqlite3 module (WAL, a busy
timeout, and ``BEGIN IMMEDIATE`` for writes, so a writer holds the write lock before it
reads what it checks). Every driver error becomes one `CheckpointError` naming the
database, with its password hidden (`agentflow._urls.redact`, as everywhere). A password is
percent-encoded in the URL (SQLAlchemy decodes it); one holding a raw ``/``, ``?``, ``#`` or
``@`` is refused before SQLAlchemy parses it.

On PostgreSQL the fast path (`sqlalchemy._pg`) borrows the driver's own connection under a
pooled one: `Connector.driver` lends the asyncpg connection for a single autocommit statement.
A checkout from SQLAlchemy's pool costs about 150 µs of greenlet switching, so each loop
keeps the connections it lent in a free list of its own, up to the pool's size, still
checked out of the pool: they bypass ``pool_recycle`` and ``pool_pre_ping``, and one that
fails at the connection level is invalidated, never lent again. A transaction
(`Connector.begin`) takes a kept connection first, and while any operation waits for the
pool a connection given back goes to the pool, not the free list, so the kept ones never
starve it. They are closed before the engine is disposed. SQLite has no such path: every
operation there is a transaction (`Connector.begin`), its connection back to the pool after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from agentflow._errors import CheckpointConflict, CheckpointError
from agentflow._urls import check_user_part, redact

#: The async driver for each database this store supports.
ASYNC_DRIVERS: Final = {"postgresql": "postgresql+asyncpg", "sqlite": "sqlite+aiosqlite"}
#: How long a SQLite writer waits for another process's write lock before giving up.
SQLITE_BUSY_TIMEOUT_MS: Final = 30_000
#: Execution option naming the statement that opens a SQLite transaction.
_SQLITE_BEGIN: Final = "agentflow_sqlite_begin"


def check_url(url: str) -> sa.URL:
    """Parse `url` and refuse anything but the async drivers this store runs on (messages show it `redact`-ed)."""
    check_user_part(url, "SQLAlchemyCheckpointStore's URL")
    try:
        parsed = sa.make_url(url)
    except ArgumentError:
        raise ValueError("SQLAlchemyCheckpointStore needs a database URL such as postgresql+asyncpg://...") from None
    shown = redact(url)
    backend = {"postgres": "postgresql"}.get(parsed.get_backend_name(), parsed.get_backend_name())
    if backend not in ASYNC_DRIVERS:
        raise ValueError(f"SQLAlchemyCheckpointStore supports PostgreSQL and SQLite, not {shown}")
    if parsed.drivername != ASYNC_DRIVERS[backend]:
        fixed = redact(f"{ASYNC_DRIVERS[backend]}:{url.partition(':')[2]}")
        raise ValueError(f"SQLAlchemyCheckpointStore needs an async driver: write {shown} as {fixed}")
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):  # in memory: MemoryCheckpointStore
        raise ValueError(f"SQLAlchemyCheckpointStore needs a SQLite file path, not {shown}")
    return parsed


def _reason(exc: BaseException) -> str:
    """Return a driver error's first line, without SQLAlchemy's wrapping."""
    inner = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    lines = str(inner).strip().splitlines()
    return (lines[0] if lines else type(inner).__name__)[:300]


def _use_begin_immediate(engine: AsyncEngine) -> None:
    """Take transaction control from sqlite3 (SQLAlchemy's documented recipe), with WAL and a busy timeout."""

    @sa.event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # sqlite3 emits no BEGIN of its own
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()

    @sa.event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql(conn.get_execution_options().get(_SQLITE_BEGIN, "BEGIN"))


class LoopEngine:
    """One loop's engine, disposed by ``keeper``: ``asyncio.run`` closes open async generators before it ends."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.setup_lock = asyncio.Lock()
        self.abandoned = False
        self.keeper = self._keep()
        #: Pooled connections free to lend again (`Connector.driver`), with their asyncpg connections.
        self.idle: list[tuple[AsyncConnection, Any]] = []
        pool = engine.sync_engine.pool
        #: How many connections `idle` keeps: none for a pool that keeps none (NullPool).
        self.keep = pool.size() if isinstance(pool, sa.QueuePool) else 0
        #: Operations of this loop waiting for a connection from the pool: while any does, none is kept.
        self.waiting = 0

    async def _keep(self) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            if not self.abandoned:
                while self.idle:
                    await self.idle.pop()[0].close()
                await self.engine.dispose()

    async def abandon(self, *, sqlite: bool) -> None:
        """Drop the engine of a loop that closed without shutting down its generators."""
        self.abandoned = True
        self.idle = []  # asyncpg connections die with their loop (SQLite keeps none)
        closing = self.keeper.aclose()
        with suppress(StopIteration):  # with nothing to await in `finally`, it closes in one step, loop or not
            closing.send(None)
        if sqlite:  # aiosqlite connections run on threads of their own: any loop can close them
            await self.engine.dispose()
        else:  # asyncpg connections died with their loop; let them go
            self.engine.sync_engine.dispose(close=False)


class Connector:
    """The engines of one store (one per running event loop) and transactions on them."""

    def __init__(self, url: sa.URL, options: Mapping[str, Any]) -> None:
        self.url = url
        self.shown = redact(url.render_as_string(hide_password=False))
        self.sqlite = url.get_backend_name() == "sqlite"
        self._options = dict(options)
        # a SQLite file's folder, checked before each connection: aiosqlite's cleanup of a failed
        # connect can outlive the event loop
        local = self.sqlite and not url.query.get("uri")
        self._folder = Path(url.database or ".").parent if local else None
        self._engines: dict[asyncio.AbstractEventLoop, LoopEngine] = {}

    async def engine(self) -> LoopEngine:
        """This loop's engine, made on first use."""
        loop = asyncio.get_running_loop()
        entry = self._engines.get(loop)
        if entry is None:
            engine = create_async_engine(self.url, **self._options)
            if self.sqlite:
                _use_begin_immediate(engine)
            entry = self._engines[loop] = LoopEngine(engine)
            await anext(entry.keeper)  # registers it with the loop; reaches `yield` without suspending
            await self._forget_closed_loops()
        return entry

    @asynccontextmanager
    async def begin(self, entry: LoopEngine, *, write: bool) -> AsyncIterator[AsyncConnection]:
        """Open a transaction; turn driver errors into one clear `CheckpointError`.

        A connection the PostgreSQL fast path keeps idle is used first (and goes back to the
        pool afterwards), so those kept connections never starve a small pool. On SQLite a
        write opens with ``BEGIN IMMEDIATE`` (the write lock before anything is read), a read
        with ``BEGIN``.
        Duplicate keys are left to the caller (`IntegrityError` is not caught here).
        """
        if self._folder is not None and not self._folder.is_dir():
            raise CheckpointError(f"SQLAlchemyCheckpointStore cannot reach {self.shown}: no directory {self._folder}")
        conn = (await self._checkout(entry))[0]
        try:
            if self.sqlite and write:  # a read opens with the listener's default, BEGIN
                await conn.execution_options(**{_SQLITE_BEGIN: "BEGIN IMMEDIATE"})
            async with conn.begin():
                yield conn
        except (OSError, DBAPIError) as exc:
            raise CheckpointError(f"SQLAlchemyCheckpointStore at {self.shown} failed: {_reason(exc)}") from exc
        finally:
            await conn.close()

    @asynccontextmanager
    async def driver(self, entry: LoopEngine, taken: str | None = None) -> AsyncIterator[Any]:
        """Lend a pooled connection's asyncpg connection for autocommit statements (PostgreSQL only).

        Args:
            entry: this loop's engine.
            taken: what a duplicate key means was written first (a `CheckpointConflict`), if anything.
        """
        import asyncpg

        conn, raw = await self._checkout(entry)
        try:
            if raw is None:
                raw = (await conn.get_raw_connection()).driver_connection
            yield raw
        except asyncpg.UniqueViolationError:
            await self._give_back(entry, conn, raw)
            if taken is None:
                raise
            raise CheckpointConflict(f"{taken} was written by another writer at the same time") from None
        except (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError) as exc:
            await conn.invalidate()
            await conn.close()
            raise CheckpointError(f"SQLAlchemyCheckpointStore at {self.shown} failed: {_reason(exc)}") from exc
        except asyncpg.PostgresError as exc:  # the statement failed; the connection is as good as before
            await self._give_back(entry, conn, raw)
            raise CheckpointError(f"SQLAlchemyCheckpointStore at {self.shown} failed: {_reason(exc)}") from exc
        except BaseException:  # cancelled mid-statement: the connection's state is unknown
            await conn.invalidate()
            await conn.close()
            raise
        else:
            await self._give_back(entry, conn, raw)

    async def _checkout(self, entry: LoopEngine) -> tuple[AsyncConnection, Any]:
        """A kept connection (with its asyncpg connection), else one from the pool (with None)."""
        if entry.idle:
            return entry.idle.pop()
        entry.waiting += 1
        try:
            return await entry.engine.connect(), None
        except (OSError, DBAPIError) as exc:
            raise CheckpointError(f"SQLAlchemyCheckpointStore cannot reach {self.shown}: {_reason(exc)}") from exc
        finally:
            entry.waiting -= 1

    @staticmethod
    async def _give_back(entry: LoopEngine, conn: AsyncConnection, raw: Any) -> None:
        """Keep `conn` for the next operation, unless someone is waiting for the pool (it goes back there)."""
        if len(entry.idle) < entry.keep and not entry.waiting and not entry.abandoned:
            entry.idle.append((conn, raw))
        else:
            await conn.close()

    async def aclose(self) -> None:
        """Dispose this loop's engine and drop those of closed loops."""
        await self._forget_closed_loops()
        entry = self._engines.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry.keeper.aclose()  # its `finally` disposes the engine

    async def _forget_closed_loops(self) -> None:
        for loop in [loop for loop in self._engines if loop.is_closed()]:
            if (entry := self._engines.pop(loop, None)) is not None:  # another thread may have dropped it
                await entry.abandon(sqlite=self.sqlite)
