"""`SQLAlchemyCheckpointStore`: checkpoints in PostgreSQL (asyncpg) or SQLite (aiosqlite).

Tables (names start with ``table_prefix``): ``meta`` (``schema_version``), ``checkpoints``,
``runs`` (each run's latest), ``calls``, ``leases`` (version 2), ``events`` (version 3) and
``markers`` (version 5); version 4 installs, on PostgreSQL only, the functions of the fast
path (`sqlalchemy._pg`). Every SQLAlchemy statement is built once per store (`sqlalchemy._statements`)
and run with a dict of values, so a call builds and compiles nothing.

The hot operations (saves, call records, leases, ``latest``, ``head`` and the peek at
markers) go by database: on PostgreSQL each is one statement in autocommit on the pooled
connection's asyncpg connection (`sqlalchemy._pg`); on SQLite each is one transaction of
plain SQLAlchemy statements (`sqlalchemy._plain`), a write one ``BEGIN IMMEDIATE``
transaction. The SQL store on SQLite is the portable path (the same code on both
databases); `SQLiteCheckpointStore` is SQLite's fast store. Both read the run's ``runs``
row under a lock, apply `rules` (PostgreSQL mirrors them in its function and raises with
`rules` on what it read), then write.

`latest` (and so `head`) reads the newest ``checkpoints`` row, not through ``runs``, as
every store does; the compare-and-set and the fencing check read the locked ``runs`` row.
`relist` writes that row again from the newest checkpoint row (see its docstring), so a
run whose ``runs`` row was deleted or rolled back takes saves and records again.

Retention (`prunable`, `prune`, `trimmable`, `trim`: one transaction per batch) is `sqlalchemy._prune`'s, event
streams `sqlalchemy._events`', markers (`put_marker`, `peek_markers`, `take_marker`: one transaction
each, judged on the leases' clock) `sqlalchemy._markers`'. URLs, each loop's engine, its
transactions and the connections lent to the PostgreSQL path are `sqlalchemy.engines`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from agentflow._errors import CheckpointConflict, CheckpointNotFound, CheckpointStoreCorrupt
from agentflow.exec.checkpoints.records import (
    Bookkeeping,
    JudgedRows,
    Lease,
    LeaseMove,
    Marker,
    Pruned,
    SealedCall,
    SealedCheckpoint,
    SealedEvent,
    StoredEvent,
    Trimmed,
    listed,
    listing_bookkeeping,
)
from agentflow.exec.checkpoints.rules import check_events, check_marker_args, check_row, int_cursor
from agentflow.exec.checkpoints.sqlalchemy import _rows as rows_of
from agentflow.exec.checkpoints.sqlalchemy._durability import check_commit
from agentflow.exec.checkpoints.sqlalchemy._events import SQLEvents
from agentflow.exec.checkpoints.sqlalchemy._leases import SQLLeases
from agentflow.exec.checkpoints.sqlalchemy._markers import SQLMarkers
from agentflow.exec.checkpoints.sqlalchemy._pg import PgFastPath, functions
from agentflow.exec.checkpoints.sqlalchemy._plain import PlainPath
from agentflow.exec.checkpoints.sqlalchemy._prune import SQLPrune
from agentflow.exec.checkpoints.sqlalchemy._statements import LATEST_FIELDS, Tables, statements, tables
from agentflow.exec.checkpoints.sqlalchemy.engines import Connector, LoopEngine, check_url

#: Allowed table prefixes (40 characters at most keeps index names under PostgreSQL's 63).
_PREFIX: Final = re.compile(r"[a-z_][a-z0-9_]{0,39}")

_log = logging.getLogger("agentflow.exec.checkpoints.sqlalchemy")


def _v1_create_tables(conn: sa.Connection, t: Tables) -> None:
    """Version 1: the checkpoint, latest-run and call tables with their indexes."""
    t.metadata.create_all(conn, tables=[t.checkpoints, t.runs, t.calls], checkfirst=True)


def _v2_create_leases(conn: sa.Connection, t: Tables) -> None:
    """Version 2: the leases table (a database at version 1 gains it on its next setup)."""
    t.metadata.create_all(conn, tables=[t.leases], checkfirst=True)


def _v3_create_events(conn: sa.Connection, t: Tables) -> None:
    """Version 3: the event-stream table (`sqlalchemy._events`)."""
    t.metadata.create_all(conn, tables=[t.events], checkfirst=True)


def _v4_pg_functions(conn: sa.Connection, t: Tables) -> None:
    """Version 4: on PostgreSQL, the functions of the one-round-trip writes (`sqlalchemy._pg`); nothing on SQLite."""
    if conn.dialect.name == "postgresql":
        for ddl in functions(t.prefix):
            conn.exec_driver_sql(ddl)


def _v5_create_markers(conn: sa.Connection, t: Tables) -> None:
    """Version 5: the markers table (`sqlalchemy._markers`); lease rows of ids under ``agentflow/`` are deleted.

    No run takes an id that starts with ``agentflow/`` (`rules.check_new_run_id`), so such a
    lease row holds no run, and markers are read from their own table only. The prefix is
    compared with ``substr``: LIKE ignores case on SQLite, and ``Agentflow/x`` is a run's id.
    """
    t.metadata.create_all(conn, tables=[t.markers], checkfirst=True)
    conn.execute(sa.delete(t.leases).where(sa.func.substr(t.leases.c.run_id, 1, 10) == "agentflow/"))


def _v6_pg_lease_moves(conn: sa.Connection, t: Tables) -> None:
    """Version 6: on PostgreSQL, the functions again, ``write_moving`` among them (`LeaseMoving`); nothing on SQLite."""
    _v4_pg_functions(conn, t)


#: Schema changes in order; ``schema_version`` counts how many a database has applied.
MIGRATIONS: Final[list[Callable[[sa.Connection, Tables], None]]] = [
    _v1_create_tables,
    _v2_create_leases,
    _v3_create_events,
    _v4_pg_functions,
    _v5_create_markers,
    _v6_pg_lease_moves,
]


class SQLAlchemyCheckpointStore:
    """Keeps checkpoints and call logs in PostgreSQL or SQLite, shared by every process that connects.

    On SQLite it is the portable choice (the same store as on PostgreSQL), and slower than
    `SQLiteCheckpointStore`, SQLite's fast store.

    Args:
        url: ``postgresql+asyncpg://user@host/db`` or ``sqlite+aiosqlite:///path/to/file.db``.
        table_prefix: starts every table name; one prefix per tenant (``[a-z_][a-z0-9_]*``, up to 40).
        engine_options: keyword arguments for `sqlalchemy.ext.asyncio.create_async_engine`.
        allow_volatile: False refuses a PostgreSQL whose ``synchronous_commit`` is ``off``
            (commits that a crash can lose); True warns once (`sqlalchemy._durability`).

    Raises:
        ValueError: the URL is not one of the two async forms, or the prefix is not a plain name.
    """

    in_process = False
    #: Shared with other processes: rows are signed with the runner's ``checkpoint_key``.
    local_key: bytes | None = None

    def __init__(
        self,
        url: str,
        *,
        table_prefix: str = "agentflow_",
        engine_options: Mapping[str, Any] | None = None,
        allow_volatile: bool = True,
    ) -> None:
        parsed = check_url(url)
        self._allow_volatile = allow_volatile
        if not isinstance(table_prefix, str) or not _PREFIX.fullmatch(table_prefix):
            raise ValueError(f"table_prefix must match [a-z_][a-z0-9_]* (at most 40 characters), not {table_prefix!r}")
        self._db = Connector(parsed, engine_options or {})
        self._shown = self._db.shown
        self._prefix = table_prefix
        self._sqlite = self._db.sqlite
        self._t = tables(table_prefix)
        self._q = statements(self._t)
        self._leases = SQLLeases(self._t.leases, sqlite=self._sqlite)
        self._prune = SQLPrune(self._t, sqlite=self._sqlite, tx=self._tx, leases=self._leases)
        self._events = SQLEvents(self._t.events, sqlite=self._sqlite, tx=self._tx, shown=self._shown)
        #: The hot operations (`sqlalchemy._plain` and `sqlalchemy._pg` answer the same calls).
        self._hot: PlainPath | PgFastPath = (
            PlainPath(self._t, self._q, self._tx, self._shown)
            if self._sqlite
            else PgFastPath(self._db, self._ready, table_prefix)
        )
        self._markers = SQLMarkers(
            self._t.markers, sqlite=self._sqlite, tx=self._tx, shown=self._shown, peek_rows=self._hot.peek_markers
        )
        self._schema_ready = False

    def __repr__(self) -> str:
        return f"SQLAlchemyCheckpointStore({self._shown!r}, table_prefix={self._prefix!r})"

    async def __aenter__(self) -> SQLAlchemyCheckpointStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Dispose this loop's engine and drop those of closed loops; the store can be used again."""
        await self._db.aclose()

    async def _ready(self) -> LoopEngine:
        """This loop's engine, the tables set up first if this store has not yet done so."""
        entry = await self._db.engine()
        if not self._schema_ready:
            async with entry.setup_lock:
                if not self._schema_ready:
                    await self.setup()
        return entry

    @asynccontextmanager
    async def _tx(self, *, write: bool = False) -> AsyncIterator[AsyncConnection]:
        entry = await self._ready()
        async with self._db.begin(entry, write=write) as conn:
            yield conn

    async def setup(self) -> None:
        """Create the tables, or bring them up to date by running the `MIGRATIONS` not yet applied.

        Runs by itself on first use; safe when several processes start at once (PostgreSQL
        serializes it with an advisory lock, SQLite with its write lock).

        Raises:
            CheckpointStoreCorrupt: the tables were set up by a newer agentflow.
            CheckpointError: the database cannot be reached, or a migration failed.
        """
        entry = await self._db.engine()
        async with self._db.begin(entry, write=True) as conn:
            if not self._sqlite:
                lock = sa.text("SELECT pg_advisory_xact_lock(hashtext(coalesce(current_schema(), '') || :k))")
                await conn.execute(lock, {"k": f":agentflow-setup:{self._prefix}"})
                await check_commit(conn, self._shown, allow_volatile=self._allow_volatile)
            await conn.run_sync(self._migrate)
        self._schema_ready = True

    def _migrate(self, conn: sa.Connection) -> None:
        meta, known = self._t.meta, len(MIGRATIONS)
        meta.create(conn, checkfirst=True)
        stored = conn.execute(sa.select(meta.c.value).where(meta.c.key == "schema_version")).scalar_one_or_none()
        try:
            version = int(stored or 0)
        except ValueError:
            raise CheckpointStoreCorrupt(f"{self!r}: schema_version {stored!r} is not a number") from None
        if version > known:
            raise CheckpointStoreCorrupt(
                f"{self!r}: the tables are at schema version {version}, but this agentflow knows versions up to "
                f"{known}; upgrade agentflow (or use another table_prefix)"
            )
        for migration in MIGRATIONS[version:]:
            migration(conn, self._t)
        if version < known or stored is None:
            conn.execute(sa.delete(meta).where(meta.c.key == "schema_version"))
            conn.execute(sa.insert(meta).values(key="schema_version", value=str(known)))

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        """Store a checkpoint (compare-and-set; see `CheckpointStore.save`)."""
        check_row(run_id, step, checkpoint)
        await self._hot.write(run_id, step, checkpoint, ())

    async def save_after_calls(
        self, run_id: str, step: int, checkpoint: SealedCheckpoint, calls: Sequence[SealedCall]
    ) -> None:
        """Append `calls`, then save `checkpoint`, in one transaction: all or nothing."""
        check_row(run_id, step, checkpoint)
        await self._hot.write(run_id, step, checkpoint, calls)

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        """Append a call record (numbered and fenced; see `CheckpointStore.record_call`)."""
        if record.run_id != run_id:  # `check_call`'s first rule, before any round trip
            raise ValueError(f"record_call({run_id!r}) was given a record of run {record.run_id!r}")
        await self._hot.write(run_id, None, None, (record,))

    async def record_call_moving(self, run_id: str, record: SealedCall, move: LeaseMove) -> None:
        """`record_call`, moving the run's lease in the same transaction (see `LeaseMoving`)."""
        if record.run_id != run_id:
            raise ValueError(f"record_call({run_id!r}) was given a record of run {record.run_id!r}")
        await self._hot.write(run_id, None, None, (record,), move)

    async def save_after_calls_moving(
        self,
        run_id: str,
        step: int,
        checkpoint: SealedCheckpoint,
        calls: Sequence[SealedCall],
        move: LeaseMove,
        events: Sequence[SealedEvent] = (),
    ) -> None:
        """`save_after_calls`, moving the run's lease in the same transaction (see `LeaseMoving`).

        `events` are appended right after the save is stored (a second round trip: the
        save's function takes no events). An append that fails then is logged, not raised:
        the save is stored, and the events are observation (they are lost, never retried).
        """
        check_row(run_id, step, checkpoint)
        check_events(run_id, events)
        await self._hot.write(run_id, step, checkpoint, calls, move)
        if events:
            try:
                await self._events.append(run_id, events)
            except Exception as exc:
                _log.warning(
                    "run %r: step %d saved, but its %d event entries could not be stored: %s",
                    run_id,
                    step,
                    len(events),
                    exc,
                    extra={"run_id": run_id, "step": step},
                )

    async def latest(self, run_id: str) -> SealedCheckpoint:
        """Return the newest checkpoint row of the run (read from ``checkpoints``, whatever ``runs`` says)."""
        found = await self._hot.latest(run_id)
        if found is None:
            raise CheckpointNotFound(f"no checkpoint is stored for run {run_id!r}")
        return rows_of.sealed(SealedCheckpoint, found, run_id, repr(self))

    async def relist(self, run_id: str) -> SealedCheckpoint | None:
        """Write the run's ``runs`` row again from its newest checkpoint row; return that row.

        One transaction (see `CheckpointStore.relist`). A ``runs`` row that is there is
        locked first, as a save locks it, so no save or record of the run runs meanwhile,
        and it is updated only if its flow, status, step, segment or saved_at differ from
        the newest row's. A missing one is inserted while the newest checkpoint row is held
        FOR SHARE, so a `delete` running at the same time waits and then removes it too. Two
        relists inserting the same row meet at its primary key; the loser reads it again.
        """
        try:
            return await self._relist(run_id)
        except CheckpointConflict:  # another relist inserted the runs row first: compare with it
            return await self._relist(run_id)

    async def _relist(self, run_id: str) -> SealedCheckpoint | None:
        params = {"run_id": run_id}
        async with self._tx(write=True) as conn:
            listed = (await conn.execute(self._q.lock_entry, params)).one_or_none()
            newest = (await conn.execute(self._q.newest_shared, params)).one_or_none()
            if newest is None:
                return None
            row = rows_of.sealed(SealedCheckpoint, newest._mapping, run_id, repr(self))
            entry = {name: getattr(row, name) for name in LATEST_FIELDS}
            if listed is None:
                try:
                    await conn.execute(self._q.insert_run, {"run": run_id} | entry)
                except IntegrityError:  # another relist inserted it first: `relist` reads it again
                    taken = f"the runs row of run {run_id!r}"
                    raise CheckpointConflict(f"{taken} was written by another writer at the same time") from None
            elif {name: getattr(listed, name) for name in LATEST_FIELDS} != entry:
                await conn.execute(self._q.update_run, {"run": run_id} | entry)
        return row

    async def history(self, run_id: str) -> Sequence[SealedCheckpoint]:
        """Return every checkpoint of the run, oldest first."""
        async with self._tx() as conn:
            rows = (await conn.execute(self._q.history, {"run_id": run_id})).all()
        return [rows_of.sealed(SealedCheckpoint, row._mapping, run_id, repr(self)) for row in rows]

    async def list_unfinished(self, flow: str) -> Sequence[str]:
        """Return the ids of the flow's running and paused runs."""
        async with self._tx() as conn:
            return list((await conn.scalars(self._q.unfinished, {"flow": flow})).all())

    async def list_runs(self, flow: str | None = None, limit: int = 1000) -> Sequence[SealedCheckpoint]:
        """Return the latest checkpoint of up to `limit` runs, newest first."""
        query = self._q.list_runs if flow is None else self._q.list_runs_of_flow
        async with self._tx() as conn:
            rows = (await conn.execute(query, {"flow": flow, "limit": max(limit, 0)})).all()
        return [
            listed(str(row.run_id), partial(rows_of.sealed, SealedCheckpoint, row._mapping, row.run_id, repr(self)))
            for row in rows
        ]

    async def stored_runs(self) -> Sequence[str]:
        """Return the id of every run with a checkpoint row, sorted (read from ``checkpoints``, not ``runs``)."""
        async with self._tx() as conn:
            found = (await conn.scalars(self._q.stored_runs)).all()
        try:
            return sorted(rows_of.as_kind(str, run_id, "run_id") for run_id in found)
        except TypeError as exc:
            raise CheckpointStoreCorrupt(f"{self!r}: a stored checkpoint row is unreadable: {exc}") from None

    async def delete(self, run_id: str) -> None:
        """Forget the run: its latest pointer, checkpoints, call records and lease, in one transaction."""
        async with self._tx(write=True) as conn:
            for statement in self._q.delete:
                await conn.execute(statement, {"run_id": run_id})

    async def head(self, run_id: str) -> tuple[SealedCheckpoint, dict[int, int]]:
        """Return the latest checkpoint and how many call records each segment holds.

        The counts are read after the checkpoint, so they can only show more records than
        it saw, never fewer: a handoff never looks cleaner than it is.

        Raises:
            CheckpointNotFound: nothing is stored for the run.
        """
        found, counts = await self._hot.head(run_id)
        if found is None:
            raise CheckpointNotFound(f"no checkpoint is stored for run {run_id!r}")
        return rows_of.sealed(SealedCheckpoint, found, run_id, repr(self)), counts

    async def bookkeeping(self, run_id: str) -> Bookkeeping:
        """The run's newest checkpoint row's step, flow and status beside its ``runs`` row's, in one statement.

        One statement is one snapshot on PostgreSQL too. The store counts a segment's records
        from its rows: there is no counter to set back.
        """
        cps, runs = self._t.checkpoints, self._t.runs
        query = (
            sa.select(cps.c.step, cps.c.flow, cps.c.status, runs.c.step, runs.c.flow, runs.c.status)
            .select_from(cps.outerjoin(runs, runs.c.run_id == cps.c.run_id))
            .where(cps.c.run_id == run_id)
            .order_by(cps.c.step.desc())
            .limit(1)
        )
        async with self._tx() as conn:
            row = (await conn.execute(query)).first()
        return listing_bookkeeping(row, f"{self._shown}: run {run_id!r}")

    async def calls(self, run_id: str) -> Sequence[SealedCall]:
        """Return the run's call records by segment, then sequence number."""
        async with self._tx() as conn:
            rows = (await conn.execute(self._q.calls, {"run_id": run_id})).all()
        return [rows_of.sealed(SealedCall, row._mapping, run_id, repr(self)) for row in rows]

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Lease:
        """Take the run's lease unless another live token holds it: one upsert, then the row read back."""
        row = await self._hot.take_lease(run_id, owner, token, ttl_s)
        if row is None:
            raise CheckpointStoreCorrupt(f"{self._shown}: the lease of run {run_id!r} was taken but cannot be read")
        return rows_of.lease(row.values(), self._shown)

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> Lease | None:
        """Push the lease's expiry if `token` holds it live (see `CheckpointStore.renew_lease`)."""
        row = await self._hot.renew_lease(run_id, token, ttl_s)
        return None if row is None else rows_of.lease(row.values(), self._shown)

    async def release_lease(self, run_id: str, token: str) -> bool:
        """Give the lease up if `token` holds it; whether it was live."""
        return await self._hot.release_lease(run_id, token)

    async def leases(self, run_ids: Sequence[str]) -> Mapping[str, Lease]:
        """The live leases among `run_ids`, judged on the database's clock (the host's, on SQLite)."""
        unique = list(dict.fromkeys(run_ids))
        found = {row["run_id"]: rows_of.lease(row.values(), self._shown) for row in await self._hot.leases(unique)}
        return {run_id: found[run_id] for run_id in unique if run_id in found}

    async def prunable(self, before: float, statuses: Collection[str], limit: int) -> Sequence[str]:
        """The runs a prune would take now, oldest first (see `RetentionStore.prunable`)."""
        return await self._prune.prunable(before, statuses, limit)

    async def prune(
        self,
        run_ids: Sequence[str],
        before: float,
        statuses: Collection[str],
        owner: str,
        judged: JudgedRows | None = None,
    ) -> Pruned:
        """Delete the runs that still qualify, whole, in one transaction (see `RetentionStore.prune`)."""
        return await self._prune.prune(run_ids, before, statuses, owner, judged)

    async def trimmable(
        self, before: float, statuses: Collection[str], limit: int, since: float | None = None
    ) -> Sequence[tuple[str, float]]:
        """The runs a trim would take now, oldest first (see `TrimStore.trimmable`)."""
        return await self._prune.trimmable(before, statuses, limit, since)

    async def trim(
        self, run_ids: Sequence[str], before: float, statuses: Collection[str], judged: JudgedRows | None = None
    ) -> Trimmed:
        """Keep only the newest checkpoint of the runs that still qualify, in one transaction (`TrimStore.trim`)."""
        return await self._prune.trim(run_ids, before, statuses, judged)

    # -- event streams (`sqlalchemy._events`) -------------------------------------------------

    async def append_events(self, run_id: str, events: Sequence[SealedEvent]) -> None:
        """Append to the run's stream, keeping the newest (see `EventStore.append_events`)."""
        check_events(run_id, events)
        if events:
            await self._events.append(run_id, events)

    async def read_events(self, run_id: str, after: str | None = None, limit: int = 1000) -> Sequence[StoredEvent]:
        """The run's events after cursor `after`, oldest first (see `EventStore.read_events`)."""
        return await self._events.read(run_id, int_cursor(after), limit)

    # -- markers (`sqlalchemy._markers`) -------------------------------------------------------

    async def put_marker(self, key: str, value: str, token: str, ttl_s: float) -> Marker:
        """Set the marker unless another token's is live: one upsert and its read-back (`MarkerStore.put_marker`)."""
        check_marker_args(key, value, token, ttl_s)
        return await self._markers.put(key, value, token, ttl_s)

    async def peek_markers(self, keys: Sequence[str]) -> Mapping[str, Marker]:
        """The live markers among `keys`, judged on the database's clock (the host's, on SQLite)."""
        return await self._markers.peek(keys)

    async def take_marker(self, key: str, token: str) -> bool:
        """Remove the marker if `token` set it, live or lapsed; whether it was live."""
        return await self._markers.take(key, token)
