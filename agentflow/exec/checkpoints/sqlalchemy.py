"""`SQLAlchemyCheckpointStore`: checkpoints in PostgreSQL (asyncpg) or SQLite (aiosqlite).

Tables (names start with ``table_prefix``): ``meta`` (``schema_version``), ``checkpoints``,
``runs`` (each run's latest), ``calls`` and ``leases`` (schema version 2; its statements,
the take's single upsert among them, are `_sql_leases`'s). Every statement is built once per store
(`_sql_statements`) and run with a dict of values, so a call builds and compiles nothing.

Each save and call record is one transaction that reads the run's ``runs`` row once,
applies `_rules` in Python, then writes. PostgreSQL locks the row (``FOR UPDATE``; for a
new run the primary key picks the winner); SQLite takes its write lock first (``BEGIN
IMMEDIATE``). The statements of each:

- record: the row, the segment's record count, the INSERT. SQLite reads the count as a
  subquery of the row read (a SQLite transaction reads one snapshot, taken under the write
  lock); PostgreSQL counts in a statement of its own after the lock, because a statement's
  snapshot predates its lock wait and would miss records the previous holder committed.
- save: the row, then one INSERT of the checkpoint carrying the UPDATE (or, for step 0,
  the INSERT) of ``runs`` in its WITH on PostgreSQL; SQLite, which allows no writes in a
  WITH, runs the two. A step 0 reads, instead of the locked row, one row saying whether
  the run has a ``runs`` row and whether any checkpoint or call row of it is stored: a
  run whose ``runs`` row went missing is refused, not started again over its old rows.
- save_after_calls: the row once (the lock keeps it unchanged), each record's count and
  INSERT, then the save's writes.

`latest` (and so `head`) reads the newest ``checkpoints`` row, not through ``runs``, as
every store does; the compare-and-set and the fencing check read the locked ``runs`` row.
`relist` writes that row again from the newest checkpoint row (see its docstring), so a
run whose ``runs`` row was deleted or rolled back takes saves and records again.

Retention (`prunable`, `prune`: one transaction per batch) is `_sql_prune`'s. A duplicate key
is a `CheckpointConflict`. URLs, each loop's engine and its transactions are `_sql_engines`.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import fields
from typing import Any, Final, TypeVar

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from agentflow._errors import CheckpointConflict, CheckpointNotFound, CheckpointStoreCorrupt
from agentflow.exec.checkpoints._records import Lease, Pruned, SealedCall, SealedCheckpoint, SealedEvent, StoredEvent
from agentflow.exec.checkpoints._rules import (
    check_call,
    check_events,
    check_no_stored_rows,
    check_row,
    check_save,
    int_cursor,
)
from agentflow.exec.checkpoints._sql_engines import Connector, check_url
from agentflow.exec.checkpoints._sql_events import SQLEvents
from agentflow.exec.checkpoints._sql_leases import SQLLeases
from agentflow.exec.checkpoints._sql_prune import SQLPrune
from agentflow.exec.checkpoints._sql_statements import (
    CALL_FIELDS,
    LATEST_FIELDS,
    SAVE_FIELDS,
    Tables,
    statements,
    tables,
)

_R = TypeVar("_R", SealedCheckpoint, SealedCall)

#: Allowed table prefixes (40 characters at most keeps index names under PostgreSQL's 63).
_PREFIX: Final = re.compile(r"[a-z_][a-z0-9_]{0,39}")
#: Each sealed row's fields and their types (annotations are strings under postponed evaluation).
_KINDS: Final[dict[str, type]] = {"str": str, "int": int, "float": float, "bytes": bytes}
_LAYOUT: Final[dict[type, list[tuple[str, type]]]] = {
    cls: [(f.name, _KINDS[f.type if isinstance(f.type, str) else f.type.__name__]) for f in fields(cls)]
    for cls in (SealedCheckpoint, SealedCall)
}


def _v1_create_tables(conn: sa.Connection, t: Tables) -> None:
    """Version 1: the checkpoint, latest-run and call tables with their indexes."""
    t.metadata.create_all(conn, tables=[t.checkpoints, t.runs, t.calls], checkfirst=True)


def _v2_create_leases(conn: sa.Connection, t: Tables) -> None:
    """Version 2: the leases table (a database at version 1 gains it on its next setup)."""
    t.metadata.create_all(conn, tables=[t.leases], checkfirst=True)


def _v3_create_events(conn: sa.Connection, t: Tables) -> None:
    """Version 3: the event-stream table (`_sql_events`)."""
    t.metadata.create_all(conn, tables=[t.events], checkfirst=True)


#: Schema changes in order; ``schema_version`` counts how many a database has applied.
MIGRATIONS: Final[list[Callable[[sa.Connection, Tables], None]]] = [
    _v1_create_tables,
    _v2_create_leases,
    _v3_create_events,
]


async def _insert(conn: AsyncConnection, insert: sa.Insert, values: dict[str, Any], taken: str) -> None:
    """Insert a row; a duplicate key means another writer got there first."""
    try:
        await conn.execute(insert, values)
    except IntegrityError:
        raise CheckpointConflict(f"{taken} was written by another writer at the same time") from None


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
    #: Shared with other processes: rows are signed with the runner's ``checkpoint_key``.
    local_key: bytes | None = None

    def __init__(
        self, url: str, *, table_prefix: str = "agentflow_", engine_options: Mapping[str, Any] | None = None
    ) -> None:
        parsed = check_url(url)
        if not isinstance(table_prefix, str) or not _PREFIX.fullmatch(table_prefix):
            raise ValueError(f"table_prefix must match [a-z_][a-z0-9_]* (at most 40 characters), not {table_prefix!r}")
        self._db = Connector(parsed, engine_options or {})
        self._shown = self._db.shown
        self._prefix = table_prefix
        self._sqlite = self._db.sqlite
        self._t = tables(table_prefix)
        self._q = statements(self._t)
        self._leases = SQLLeases(self._t.leases, sqlite=self._sqlite, tx=self._tx, shown=self._shown)
        self._prune = SQLPrune(self._t, sqlite=self._sqlite, tx=self._tx, leases=self._leases)
        self._events = SQLEvents(self._t.events, sqlite=self._sqlite, tx=self._tx, shown=self._shown)
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

    @asynccontextmanager
    async def _tx(self, *, write: bool = False) -> AsyncIterator[AsyncConnection]:
        entry = await self._db.engine()
        if not self._schema_ready:
            async with entry.setup_lock:
                if not self._schema_ready:
                    await self.setup()
        async with self._db.begin(entry.engine, write=write) as conn:
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
        async with self._db.begin(entry.engine, write=True) as conn:
            if not self._sqlite:
                lock = sa.text("SELECT pg_advisory_xact_lock(hashtext(coalesce(current_schema(), '') || :k))")
                await conn.execute(lock, {"k": f":agentflow-setup:{self._prefix}"})
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
        async with self._tx(write=True) as conn:
            if step == 0:
                first = (await conn.execute(self._q.read_first, {"run_id": run_id})).one()
                check_no_stored_rows(run_id, first.step is None and bool(first.stored))
                row = first if first.step is not None else None
            else:
                row, _ = await self._lock_run(conn, run_id, None)
            await self._save_in(conn, run_id, step, checkpoint, row)

    async def save_after_calls(
        self, run_id: str, step: int, checkpoint: SealedCheckpoint, calls: Sequence[SealedCall]
    ) -> None:
        """Append `calls`, then save `checkpoint`, in one transaction: all or nothing."""
        if not calls:  # a plain save (for a step 0, its read also looks for leftover rows)
            await self.save(run_id, step, checkpoint)
            return
        check_row(run_id, step, checkpoint)
        async with self._tx(write=True) as conn:
            first = calls[0].segment
            row, next_seq = await self._lock_run(conn, run_id, first)
            # The row is locked and unchanged (records do not touch it); under the lock only this
            # transaction adds records, so a segment's count moves by one per insert.
            counts = {first: next_seq}
            for record in calls:
                if record.segment not in counts:
                    counts[record.segment] = await self._count(conn, run_id, record.segment)
                await self._record_in(conn, run_id, record, row, counts[record.segment])
                counts[record.segment] += 1
            await self._save_in(conn, run_id, step, checkpoint, row)

    async def _lock_run(
        self, conn: AsyncConnection, run_id: str, segment: int | None
    ) -> tuple[sa.Row[Any] | None, int]:
        """Lock and read the run's row and, given a `segment`, count its records (0 without a row)."""
        params = {"run_id": run_id, "segment": segment}
        if segment is not None and self._sqlite:  # the write lock is held: one statement reads both
            row = (await conn.execute(self._q.read_run_counted, params)).one_or_none()
            return row, row.calls if row else 0
        row = (await conn.execute(self._q.lock_run, params)).one_or_none()
        return row, await self._count(conn, run_id, segment) if row and segment is not None else 0

    async def _count(self, conn: AsyncConnection, run_id: str, segment: int) -> int:
        """How many records the segment holds; trusted only under the run's lock."""
        count: int = (await conn.execute(self._q.count_calls, {"run_id": run_id, "segment": segment})).scalar_one()
        return count

    async def _save_in(
        self, conn: AsyncConnection, run_id: str, step: int, checkpoint: SealedCheckpoint, row: sa.Row[Any] | None
    ) -> None:
        """The compare-and-set and the writes of a save, given the run's row read under the lock.

        Without a row there is nothing to lock yet: the primary key of ``runs`` decides
        between two writers of step 0 (the only step `check_save` lets through then).
        """
        check_save(run_id, step, checkpoint.flow, (row.step, row.flow, row.status) if row else None)
        values = {"run": run_id} | {f: getattr(checkpoint, f) for f in SAVE_FIELDS}
        taken = f"run {run_id!r} step {step}"
        if not self._sqlite:  # one statement writes both tables (SQLite has no INSERT or UPDATE in WITH)
            await _insert(conn, self._q.save_first if row is None else self._q.save_next, values, taken)
            return
        if row is None:
            await _insert(conn, self._q.insert_run, values, taken)
        else:
            await conn.execute(self._q.update_run, values)
        await _insert(conn, self._q.insert_checkpoint, values, taken)

    async def latest(self, run_id: str) -> SealedCheckpoint:
        """Return the newest checkpoint row of the run (read from ``checkpoints``, whatever ``runs`` says)."""
        async with self._tx() as conn:
            row = (await conn.execute(self._q.latest, {"run_id": run_id})).one_or_none()
        if row is None:
            raise CheckpointNotFound(f"no checkpoint is stored for run {run_id!r}")
        return self._sealed(SealedCheckpoint, row, run_id)

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
            row = self._sealed(SealedCheckpoint, newest, run_id)
            entry = {name: getattr(row, name) for name in LATEST_FIELDS}
            if listed is None:
                await _insert(conn, self._q.insert_run, {"run": run_id} | entry, f"the runs row of run {run_id!r}")
            elif {name: getattr(listed, name) for name in LATEST_FIELDS} != entry:
                await conn.execute(self._q.update_run, {"run": run_id} | entry)
        return row

    async def history(self, run_id: str) -> Sequence[SealedCheckpoint]:
        """Return every checkpoint of the run, oldest first."""
        async with self._tx() as conn:
            rows = (await conn.execute(self._q.history, {"run_id": run_id})).all()
        return [self._sealed(SealedCheckpoint, row, run_id) for row in rows]

    async def list_unfinished(self, flow: str) -> Sequence[str]:
        """Return the ids of the flow's running and paused runs."""
        async with self._tx() as conn:
            return list((await conn.scalars(self._q.unfinished, {"flow": flow})).all())

    async def list_runs(self, flow: str | None = None, limit: int = 1000) -> Sequence[SealedCheckpoint]:
        """Return the latest checkpoint of up to `limit` runs, newest first."""
        query = self._q.list_runs if flow is None else self._q.list_runs_of_flow
        async with self._tx() as conn:
            rows = (await conn.execute(query, {"flow": flow, "limit": max(limit, 0)})).all()
        return [self._sealed(SealedCheckpoint, row, row.run_id) for row in rows]

    async def stored_runs(self) -> Sequence[str]:
        """Return the id of every run with a checkpoint row, sorted (read from ``checkpoints``, not ``runs``)."""
        async with self._tx() as conn:
            found = (await conn.scalars(self._q.stored_runs)).all()
        try:
            return sorted(_as(str, run_id, "run_id") for run_id in found)
        except TypeError as exc:
            raise CheckpointStoreCorrupt(f"{self!r}: a stored checkpoint row is unreadable: {exc}") from None

    async def delete(self, run_id: str) -> None:
        """Forget the run: its latest pointer, checkpoints, call records and lease, in one transaction."""
        async with self._tx(write=True) as conn:
            for statement in self._q.delete:
                await conn.execute(statement, {"run_id": run_id})

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        """Append a call record (numbered and fenced; see `CheckpointStore.record_call`)."""
        async with self._tx(write=True) as conn:
            row, next_seq = await self._lock_run(conn, run_id, record.segment)
            await self._record_in(conn, run_id, record, row, next_seq)

    async def _record_in(
        self, conn: AsyncConnection, run_id: str, record: SealedCall, row: sa.Row[Any] | None, next_seq: int
    ) -> None:
        """The numbering and fencing checks and the insert of a record, given the locked row and the count."""
        check_call(run_id, record, (row.step, row.status, row.segment) if row else None, next_seq)
        values = {f: getattr(record, f) for f in CALL_FIELDS}
        await _insert(conn, self._q.insert_call, values, f"call record {record.segment}.{record.seq} of run {run_id!r}")

    async def head(self, run_id: str) -> tuple[SealedCheckpoint, dict[int, int]]:
        """Return the latest checkpoint and how many call records each segment holds.

        The counts are read after the checkpoint, so they can only show more records than
        it saw, never fewer: a handoff never looks cleaner than it is.

        Raises:
            CheckpointNotFound: nothing is stored for the run.
        """
        latest = await self.latest(run_id)
        async with self._tx() as conn:
            rows = (await conn.execute(self._q.segment_counts, {"run_id": run_id})).all()
        return latest, {int(segment): int(count) for segment, count in rows}

    async def calls(self, run_id: str) -> Sequence[SealedCall]:
        """Return the run's call records by segment, then sequence number."""
        async with self._tx() as conn:
            rows = (await conn.execute(self._q.calls, {"run_id": run_id})).all()
        return [self._sealed(SealedCall, row, run_id) for row in rows]

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Lease:
        """Take the run's lease unless another live token holds it: one upsert, then the row read back."""
        return await self._leases.take(run_id, owner, token, ttl_s)

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> Lease | None:
        """Push the lease's expiry if `token` holds it live (see `CheckpointStore.renew_lease`)."""
        return await self._leases.renew(run_id, token, ttl_s)

    async def release_lease(self, run_id: str, token: str) -> bool:
        """Give the lease up if `token` holds it; whether it was live."""
        return await self._leases.release(run_id, token)

    async def leases(self, run_ids: Sequence[str]) -> Mapping[str, Lease]:
        """The live leases among `run_ids`, judged on the database's clock."""
        return await self._leases.read(run_ids)

    async def prunable(self, before: float, statuses: Collection[str], limit: int) -> Sequence[str]:
        """The runs a prune would take now, oldest first (see `RetentionStore.prunable`)."""
        return await self._prune.prunable(before, statuses, limit)

    async def prune(self, run_ids: Sequence[str], before: float, statuses: Collection[str], owner: str) -> Pruned:
        """Delete the runs that still qualify, whole, in one transaction (see `RetentionStore.prune`)."""
        return await self._prune.prune(run_ids, before, statuses, owner)

    # -- event streams (`_sql_events`) -------------------------------------------------

    async def append_events(self, run_id: str, events: Sequence[SealedEvent]) -> None:
        """Append to the run's stream, keeping the newest (see `EventStore.append_events`)."""
        check_events(run_id, events)
        if events:
            await self._events.append(run_id, events)

    async def read_events(self, run_id: str, after: str | None = None, limit: int = 1000) -> Sequence[StoredEvent]:
        """The run's events after cursor `after`, oldest first (see `EventStore.read_events`)."""
        return await self._events.read(run_id, int_cursor(after), limit)

    def _sealed(self, cls: type[_R], row: sa.Row[Any], run_id: str) -> _R:
        """Rebuild a sealed row, checking each field's type (SQLite columns take values of any type)."""
        try:
            return cls(**{name: _as(kind, getattr(row, name), name) for name, kind in _LAYOUT[cls]})
        except TypeError as exc:
            raise CheckpointStoreCorrupt(f"{self!r}: a stored row of run {run_id!r} is unreadable: {exc}") from None


def _as(kind: type, value: object, name: str) -> Any:
    """Return `value` as `kind`, widening int to float and buffers to bytes; refuse anything else."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    elif kind is bytes and isinstance(value, bytearray | memoryview):
        value = bytes(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{name} is {type(value).__name__}, not {kind.__name__}")
    return value
