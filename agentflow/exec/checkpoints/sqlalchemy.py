"""`SQLAlchemyCheckpointStore`: checkpoints in PostgreSQL (asyncpg) or SQLite (aiosqlite).

Layout, per tenant (every table name starts with the store's ``table_prefix``):

- ``<p>meta(key, value)``: ``schema_version``, the number of `MIGRATIONS` applied.
- ``<p>checkpoints(run_id, step, ...)``: every checkpoint row, keyed by (run_id, step).
- ``<p>runs(run_id, flow, status, step, segment, saved_at)``: each run's latest checkpoint.
- ``<p>calls(run_id, segment, seq, ...)``: the call log, keyed by (run_id, segment, seq).

Every save and call record is one transaction that reads the run's ``runs`` row, applies
the rules of `_rules` and writes. PostgreSQL locks that row (``FOR UPDATE``); for a new run
the primary key of ``runs`` decides which of two writers wins. SQLite opens the transaction
with ``BEGIN IMMEDIATE``, which takes the database's write lock before the read. Primary keys
back both up: any duplicate row is a `CheckpointConflict`.

An engine's pool belongs to the event loop that opened its connections, so the store keeps
one engine per running loop and disposes it when ``asyncio.run`` shuts that loop down.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, TypeVar

from sqlalchemy import (
    Column,
    Connection,
    Double,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Row,
    Table,
    Text,
    delete,
    event,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from agentflow._errors import CheckpointConflict, CheckpointError, CheckpointNotFound, CheckpointStoreCorrupt
from agentflow.exec.checkpoints._records import UNFINISHED, SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints._rules import check_call, check_row, check_save

_T = TypeVar("_T")

#: The async driver for each database this store supports.
ASYNC_DRIVERS: Final = {"postgresql": "postgresql+asyncpg", "sqlite": "sqlite+aiosqlite"}
_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,39}")
#: How long a SQLite writer waits for another process's write lock before giving up.
_SQLITE_BUSY_TIMEOUT_MS: Final = 30_000
#: Execution option naming the statement that opens a SQLite transaction.
_SQLITE_BEGIN: Final = "agentflow_sqlite_begin"


@dataclass(frozen=True, slots=True)
class _Tables:
    """The tables of one tenant."""

    metadata: MetaData
    meta: Table
    checkpoints: Table
    runs: Table
    calls: Table


def _tables(p: str) -> _Tables:
    md = MetaData()
    meta = Table(f"{p}meta", md, Column("key", Text, primary_key=True), Column("value", Text, nullable=False))
    checkpoints = Table(
        f"{p}checkpoints", md,
        Column("run_id", Text, nullable=False), Column("step", Integer, nullable=False),
        Column("flow", Text, nullable=False), Column("status", Text, nullable=False),
        Column("segment", Integer, nullable=False), Column("saved_at", Double, nullable=False),
        Column("payload", LargeBinary, nullable=False), Column("kid", Text, nullable=False),
        Column("sig", Text, nullable=False),
        PrimaryKeyConstraint("run_id", "step", name=f"{p}checkpoints_pk"),
    )  # fmt: skip
    runs = Table(
        f"{p}runs", md,
        Column("run_id", Text, primary_key=True), Column("flow", Text, nullable=False),
        Column("status", Text, nullable=False), Column("step", Integer, nullable=False),
        Column("segment", Integer, nullable=False), Column("saved_at", Double, nullable=False),
        Index(f"{p}runs_flow_status", "flow", "status"), Index(f"{p}runs_saved_at", "saved_at"),
    )  # fmt: skip
    calls = Table(
        f"{p}calls", md,
        Column("run_id", Text, nullable=False), Column("segment", Integer, nullable=False),
        Column("seq", Integer, nullable=False), Column("kind", Text, nullable=False),
        Column("payload", LargeBinary, nullable=False), Column("kid", Text, nullable=False),
        Column("sig", Text, nullable=False),
        PrimaryKeyConstraint("run_id", "segment", "seq", name=f"{p}calls_pk"),
    )  # fmt: skip
    return _Tables(md, meta, checkpoints, runs, calls)


def _v1_create_tables(conn: Connection, t: _Tables) -> None:
    """Version 1: the checkpoint, latest-run and call tables with their indexes."""
    t.metadata.create_all(conn, tables=[t.checkpoints, t.runs, t.calls], checkfirst=True)


#: Schema changes in order; ``schema_version`` counts how many a database has applied.
MIGRATIONS: Final[list[Callable[[Connection, _Tables], None]]] = [_v1_create_tables]


def _check_url(url: str) -> URL:
    """Parse `url` and refuse anything but the async drivers this store runs on."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ValueError("SQLAlchemyCheckpointStore needs a database URL such as postgresql+asyncpg://...") from None
    shown = parsed.render_as_string(hide_password=True)
    backend = parsed.get_backend_name()
    if backend not in ASYNC_DRIVERS:
        raise ValueError(f"SQLAlchemyCheckpointStore supports PostgreSQL and SQLite, not {shown}")
    if parsed.drivername != ASYNC_DRIVERS[backend]:
        fixed = parsed.set(drivername=ASYNC_DRIVERS[backend]).render_as_string(hide_password=True)
        raise ValueError(f"SQLAlchemyCheckpointStore needs an async driver: {shown} should be written {fixed}")
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise ValueError(
            f"SQLAlchemyCheckpointStore needs a SQLite file, not {shown}; use MemoryCheckpointStore in memory"
        )
    return parsed


def _reason(exc: BaseException) -> str:
    """Return a driver error's first line, without SQLAlchemy's wrapping."""
    inner = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    lines = str(inner).strip().splitlines()
    return (lines[0] if lines else type(inner).__name__)[:300]


def _use_begin_immediate(engine: AsyncEngine) -> None:
    """Take transaction control from sqlite3 (SQLAlchemy's documented recipe), with WAL and a busy timeout."""

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # sqlite3 emits no BEGIN of its own
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {_SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql(conn.get_execution_options().get(_SQLITE_BEGIN, "BEGIN"))


class _LoopEngine:
    """One event loop's engine, disposed when ``asyncio.run`` shuts that loop down.

    The loop closes every open async generator before it stops (``shutdown_asyncgens``);
    ``keeper`` is such a generator, and disposing the engine is its ``finally``.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.setup_lock = asyncio.Lock()
        self.abandoned = False
        self.keeper = self._keep()

    async def _keep(self) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            if not self.abandoned:
                await self.engine.dispose()

    async def start(self) -> None:
        await anext(self.keeper)

    async def close(self) -> None:
        await self.keeper.aclose()

    def abandon(self) -> None:
        """Drop the engine of a loop that closed without shutting down its generators."""
        self.abandoned = True
        closing = self.keeper.aclose()
        try:  # with nothing to await in `finally`, the close finishes in one step, without a loop
            closing.send(None)
        except StopIteration:
            pass
        self.engine.sync_engine.dispose(close=False)  # its connections died with their loop


class SQLAlchemyCheckpointStore:
    """Keeps checkpoints and call logs in PostgreSQL or SQLite, shared by every process that connects.

    Args:
        url: ``postgresql+asyncpg://user@host/db`` or ``sqlite+aiosqlite:///path/to/file.db``.
        table_prefix: starts every table name; one prefix per tenant (``[a-z_][a-z0-9_]*``, up to 40).
        engine_options: keyword arguments for `sqlalchemy.ext.asyncio.create_async_engine`.

    Raises:
        ValueError: the URL is not one of the two async forms, or the prefix is not a plain name.
    """

    in_process = False

    def __init__(
        self, url: str, *, table_prefix: str = "agentflow_", engine_options: Mapping[str, Any] | None = None
    ) -> None:
        self._url = _check_url(url)
        if not isinstance(table_prefix, str) or not _PREFIX.fullmatch(table_prefix):
            raise ValueError(f"table_prefix must match [a-z_][a-z0-9_]* (at most 40 characters), not {table_prefix!r}")
        self._shown = self._url.render_as_string(hide_password=True)
        self._prefix = table_prefix
        self._sqlite = self._url.get_backend_name() == "sqlite"
        self._options = dict(engine_options or {})
        self._t = _tables(table_prefix)
        self._engines: dict[asyncio.AbstractEventLoop, _LoopEngine] = {}
        self._schema_ready = False

    def __repr__(self) -> str:
        return f"SQLAlchemyCheckpointStore({self._shown!r}, table_prefix={self._prefix!r})"

    async def __aenter__(self) -> SQLAlchemyCheckpointStore:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Dispose this loop's engine (and drop those of closed loops); the store can be used again."""
        self._forget_closed_loops()
        entry = self._engines.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry.close()

    def _forget_closed_loops(self) -> None:
        for loop in [loop for loop in self._engines if loop.is_closed()]:
            self._engines.pop(loop).abandon()

    async def _engine(self) -> _LoopEngine:
        loop = asyncio.get_running_loop()
        entry = self._engines.get(loop)
        if entry is None:
            self._forget_closed_loops()
            engine = create_async_engine(self._url, **self._options)
            if self._sqlite:
                _use_begin_immediate(engine)
            entry = self._engines[loop] = _LoopEngine(engine)
            await entry.start()
        return entry

    @asynccontextmanager
    async def _begin(self, engine: AsyncEngine, *, write: bool) -> AsyncIterator[AsyncConnection]:
        """Open a transaction; turn driver errors other than duplicate keys into one clear `CheckpointError`."""
        try:
            conn = await engine.connect()
        except (OSError, DBAPIError) as exc:
            raise CheckpointError(f"SQLAlchemyCheckpointStore cannot reach {self._shown}: {_reason(exc)}") from exc
        try:
            if write and self._sqlite:
                await conn.execution_options(**{_SQLITE_BEGIN: "BEGIN IMMEDIATE"})
            async with conn.begin():
                yield conn
        except IntegrityError:
            raise
        except (OSError, DBAPIError) as exc:
            raise CheckpointError(f"SQLAlchemyCheckpointStore at {self._shown} failed: {_reason(exc)}") from exc
        finally:
            await conn.close()

    @asynccontextmanager
    async def _tx(self, *, write: bool = False) -> AsyncIterator[AsyncConnection]:
        entry = await self._engine()
        if not self._schema_ready:
            async with entry.setup_lock:
                if not self._schema_ready:
                    await self.setup()
        async with self._begin(entry.engine, write=write) as conn:
            yield conn

    async def setup(self) -> None:
        """Create the tables, or bring them up to date by running the `MIGRATIONS` not yet applied.

        Runs by itself on first use; safe when several processes start at once (PostgreSQL
        serializes it with an advisory lock, SQLite with its write lock).

        Raises:
            CheckpointStoreCorrupt: the database was set up by a newer agentflow.
            CheckpointError: the database cannot be reached.
        """
        entry = await self._engine()
        async with self._begin(entry.engine, write=True) as conn:
            if not self._sqlite:
                key = f"agentflow-setup:{self._prefix}"
                await conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(current_schema() || :k))"), {"k": key})
            await conn.run_sync(self._migrate)
        self._schema_ready = True

    def _migrate(self, conn: Connection) -> None:
        t = self._t
        t.meta.create(conn, checkfirst=True)
        stored = conn.execute(select(t.meta.c.value).where(t.meta.c.key == "schema_version")).scalar_one_or_none()
        try:
            version = int(stored or 0)
        except ValueError:
            raise CheckpointStoreCorrupt(f"{self!r}: schema_version {stored!r} is not a number") from None
        if version > len(MIGRATIONS):
            raise CheckpointStoreCorrupt(
                f"{self!r}: the tables are at schema version {version}, but this agentflow knows only up to "
                f"{len(MIGRATIONS)}; upgrade agentflow (or use another table_prefix)"
            )
        for migration in MIGRATIONS[version:]:
            migration(conn, t)
        if stored is None:
            conn.execute(insert(t.meta).values(key="schema_version", value=str(len(MIGRATIONS))))
        elif version < len(MIGRATIONS):
            conn.execute(update(t.meta).where(t.meta.c.key == "schema_version").values(value=str(len(MIGRATIONS))))

    async def _insert(self, conn: AsyncConnection, table: Table, values: dict[str, Any], taken: str) -> None:
        try:
            await conn.execute(insert(table).values(**values))
        except IntegrityError:
            raise CheckpointConflict(f"{taken} was written by another writer at the same time") from None

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        """Store a checkpoint (compare-and-set; see `CheckpointStore.save`)."""
        check_row(run_id, step, checkpoint)
        runs = self._t.runs
        latest = {c: getattr(checkpoint, c) for c in ("flow", "status", "step", "segment", "saved_at")}
        async with self._tx(write=True) as conn:
            found = await conn.execute(
                select(runs.c.step, runs.c.flow, runs.c.status).where(runs.c.run_id == run_id).with_for_update()
            )
            row = found.one_or_none()
            check_save(run_id, step, checkpoint.flow, (row.step, row.flow, row.status) if row else None)
            if row is None:  # the primary key decides between two writers of step 0
                await self._insert(conn, runs, {"run_id": run_id, **latest}, f"run {run_id!r} step 0")
            else:
                await conn.execute(update(runs).where(runs.c.run_id == run_id).values(**latest))
            values = {f: getattr(checkpoint, f) for f in self._t.checkpoints.c.keys()}
            await self._insert(conn, self._t.checkpoints, values, f"run {run_id!r} step {step}")

    async def latest(self, run_id: str) -> SealedCheckpoint:
        """Return the newest checkpoint of the run."""
        runs, cps = self._t.runs, self._t.checkpoints
        joined = runs.outerjoin(cps, (cps.c.run_id == runs.c.run_id) & (cps.c.step == runs.c.step))
        query = select(runs.c.step.label("latest_step"), *cps.c).select_from(joined).where(runs.c.run_id == run_id)
        async with self._tx() as conn:
            row = (await conn.execute(query)).one_or_none()
        if row is None:
            raise CheckpointNotFound(f"no checkpoint is stored for run {run_id!r}")
        if row.run_id is None:
            raise CheckpointStoreCorrupt(f"{self!r}: run {run_id!r} points at step {row.latest_step}, which is missing")
        return self._checkpoint(row, run_id)

    async def history(self, run_id: str) -> Sequence[SealedCheckpoint]:
        """Return every checkpoint of the run, oldest first."""
        cps = self._t.checkpoints
        async with self._tx() as conn:
            rows = (await conn.execute(select(cps).where(cps.c.run_id == run_id).order_by(cps.c.step))).all()
        return [self._checkpoint(row, run_id) for row in rows]

    async def list_unfinished(self, flow: str) -> Sequence[str]:
        """Return the ids of the flow's running and paused runs."""
        runs = self._t.runs
        query = select(runs.c.run_id).where(runs.c.flow == flow, runs.c.status.in_(sorted(UNFINISHED)))
        async with self._tx() as conn:
            return list((await conn.scalars(query.order_by(runs.c.run_id))).all())

    async def list_runs(self, flow: str | None = None, limit: int = 1000) -> Sequence[SealedCheckpoint]:
        """Return the latest checkpoint of up to `limit` runs, newest first."""
        if limit <= 0:
            return []
        runs, cps = self._t.runs, self._t.checkpoints
        joined = runs.join(cps, (cps.c.run_id == runs.c.run_id) & (cps.c.step == runs.c.step))
        query = select(cps).select_from(joined).order_by(runs.c.saved_at.desc(), runs.c.run_id).limit(limit)
        if flow is not None:
            query = query.where(runs.c.flow == flow)
        async with self._tx() as conn:
            rows = (await conn.execute(query)).all()
        return [self._checkpoint(row, row.run_id) for row in rows]

    async def delete(self, run_id: str) -> None:
        """Forget the run: its latest pointer, checkpoints and call records, in one transaction."""
        async with self._tx(write=True) as conn:
            for table in (self._t.runs, self._t.checkpoints, self._t.calls):  # runs first: the lock order of save
                await conn.execute(delete(table).where(table.c.run_id == run_id))

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        """Append a call record (numbered and fenced; see `CheckpointStore.record_call`)."""
        runs, calls = self._t.runs, self._t.calls
        async with self._tx(write=True) as conn:
            found = await conn.execute(
                select(runs.c.step, runs.c.status, runs.c.segment).where(runs.c.run_id == run_id).with_for_update()
            )
            row = found.one_or_none()
            count = select(func.count()).where(calls.c.run_id == run_id, calls.c.segment == record.segment)
            next_seq = (await conn.execute(count)).scalar_one() if row else 0
            check_call(run_id, record, (row.step, row.status, row.segment) if row else None, next_seq)
            values = {f: getattr(record, f) for f in calls.c.keys()}
            await self._insert(conn, calls, values, f"call record {record.segment}.{record.seq} of run {run_id!r}")

    async def calls(self, run_id: str) -> Sequence[SealedCall]:
        """Return the run's call records by segment, then sequence number."""
        calls = self._t.calls
        query = select(calls).where(calls.c.run_id == run_id).order_by(calls.c.segment, calls.c.seq)
        async with self._tx() as conn:
            rows = (await conn.execute(query)).all()
        return [self._call(row, run_id) for row in rows]

    def _checkpoint(self, row: Row[Any], run_id: str) -> SealedCheckpoint:
        try:
            return SealedCheckpoint(
                _as(str, row.run_id, "run_id"), _as(int, row.step, "step"), _as(str, row.flow, "flow"),
                _as(str, row.status, "status"), _as(int, row.segment, "segment"),
                _as(float, row.saved_at, "saved_at"), _as(bytes, row.payload, "payload"),
                _as(str, row.kid, "kid"), _as(str, row.sig, "sig"),
            )  # fmt: skip
        except TypeError as exc:
            raise CheckpointStoreCorrupt(f"{self!r}: a checkpoint row of run {run_id!r} is unreadable: {exc}") from None

    def _call(self, row: Row[Any], run_id: str) -> SealedCall:
        try:
            return SealedCall(
                _as(str, row.run_id, "run_id"), _as(int, row.segment, "segment"), _as(int, row.seq, "seq"),
                _as(str, row.kind, "kind"), _as(bytes, row.payload, "payload"),
                _as(str, row.kid, "kid"), _as(str, row.sig, "sig"),
            )  # fmt: skip
        except TypeError as exc:
            raise CheckpointStoreCorrupt(f"{self!r}: a call record of run {run_id!r} is unreadable: {exc}") from None


def _as(kind: type[_T], value: object, name: str) -> _T:
    """Return `value` as `kind`, widening int to float and buffers to bytes; refuse anything else."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    elif kind is bytes and isinstance(value, bytearray | memoryview):
        value = bytes(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{name} is {type(value).__name__}, not {kind.__name__}")
    return value
