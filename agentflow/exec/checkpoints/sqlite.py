"""`SQLiteCheckpointStore`: the store protocol on one SQLite file shared by every process on a host.

This module owns the store: its compare-and-set writes, its reads and where each statement
runs. The file itself (schema and `MIGRATIONS`, connection settings, the write transaction
and the worker thread) is `_sqlite_file`'s.

- Every write runs inside ``BEGIN IMMEDIATE`` ... ``COMMIT``. SQLite's write lock is taken
  before the compare-and-set read, so that read and the insert that follows are atomic
  against every other connection to the file, in this process or in another one. WAL lets
  readers carry on meanwhile, and ``busy_timeout`` makes writers queue instead of failing.
- Every checkpoint is kept (``checkpoints``); ``runs`` holds one row per run pointing at its
  latest step, updated in the same transaction, so listings stay cheap. The rules read the
  ``checkpoints`` and ``calls`` rows, never ``runs``: a missing ``runs`` row hides a run
  from the listings but lets no step 0 start over its rows (nor does `stored_runs` miss it),
  and `relist` writes it again from the newest checkpoint row.
- The worker thread: one per store, it owns the main connection (opens the file, migrates
  the schema) and does every piece of work that has to wait, so the store is bound to no
  loop and outlives ``asyncio.run``.
- The inline path (``inline=True``, the default): once the schema is ready, each statement
  runs first on a connection of the calling thread whose busy timeout is zero, so it never
  waits: a write takes ~0.1 ms, far less than a hop to another thread. When the file is
  locked by another writer, the statement fails at once (before anything is written) and
  is handed to the worker thread, which waits for the lock without blocking the loop.
- Payloads are opaque: rows go in and come out exactly as given, checked only for types.
- Leases (``leases`` table) are `_sqlite_leases`'s statements, run here like the other
  writes: a take is one upsert and its read-back in one write transaction.
- Retention (`prunable`, `prune`) is `_sqlite_prune`'s: a batch of runs is judged and
  deleted from every table in one write transaction.
"""

from __future__ import annotations

import asyncio
import math
import os
import sqlite3
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, TypeVar

from agentflow._errors import CheckpointConflict, CheckpointNotFound, CheckpointStoreCorrupt
from agentflow.exec.checkpoints import _sqlite_events, _sqlite_leases, _sqlite_prune
from agentflow.exec.checkpoints._records import (
    UNFINISHED,
    Lease,
    Pruned,
    SealedCall,
    SealedCheckpoint,
    SealedEvent,
    StoredEvent,
)
from agentflow.exec.checkpoints._rules import (
    check_call,
    check_events,
    check_lease_args,
    check_no_stored_rows,
    check_row,
    check_save,
    int_cursor,
)
from agentflow.exec.checkpoints._rules import check_prune_statuses as _statuses
from agentflow.exec.checkpoints._sqlite_file import MIGRATIONS as MIGRATIONS  # re-exported: tests import it here
from agentflow.exec.checkpoints._sqlite_file import _connect, _immediate, _Worker

_T = TypeVar("_T")

#: Columns of a checkpoint row, in `SealedCheckpoint` field order, and the type each must hold.
_CHECKPOINT_COLUMNS: Final = ("run_id", "step", "flow", "status", "segment", "saved_at", "payload", "kid", "sig")
_CHECKPOINT_TYPES: Final = (str, int, str, str, int, float, bytes, str, str)
#: Columns of a call row, in `SealedCall` field order, and the type each must hold.
_CALL_COLUMNS: Final = ("run_id", "segment", "seq", "kind", "payload", "kid", "sig")
_CALL_TYPES: Final = (str, int, int, str, bytes, str, str)

_SELECT_CHECKPOINT: Final = f"SELECT {', '.join(_CHECKPOINT_COLUMNS)} FROM checkpoints"
_SELECT_CALL: Final = f"SELECT {', '.join(_CALL_COLUMNS)} FROM calls"
_LATEST_OF_RUN: Final = "WHERE run_id = ? ORDER BY step DESC LIMIT 1"
_INSERT_CHECKPOINT: Final = f"INSERT INTO checkpoints ({', '.join(_CHECKPOINT_COLUMNS)}) VALUES (?,?,?,?,?,?,?,?,?)"
_INSERT_CALL: Final = f"INSERT INTO calls ({', '.join(_CALL_COLUMNS)}) VALUES (?,?,?,?,?,?,?)"
#: The listing entry (``runs`` row) of a run: what a save writes there, from its checkpoint's fields in clear.
_RUN_COLUMNS: Final = ("flow", "status", "step", "saved_at")
_WRITE_RUN: Final = f"INSERT OR REPLACE INTO runs (run_id, {', '.join(_RUN_COLUMNS)}) VALUES (?, ?, ?, ?, ?)"


def _checked(row: Sequence[Any], columns: Sequence[str], types: Sequence[type], what: str) -> tuple[Any, ...]:
    """Return `row` as a tuple once each value has its column's type.

    Raises:
        CheckpointStoreCorrupt: a value is NULL or of another type; the message names `what`.
    """
    for column, value, expected in zip(columns, row, types, strict=True):
        if not isinstance(value, expected):
            found = "NULL" if value is None else type(value).__name__
            raise CheckpointStoreCorrupt(f"{what}: column {column} holds {found}, not {expected.__name__}")
    return tuple(row)


class SQLiteCheckpointStore:
    """Keeps checkpoints and call logs in one SQLite file that every process on the host can share.

    Args:
        path: the database file; it is created on first use, its directory must exist.
        busy_timeout_s: how long a write waits for another writer's lock before failing.
        synchronous: SQLite's ``synchronous`` setting; ``FULL`` survives power loss, ``NORMAL``
            in WAL mode may lose the last commits on power loss (not on a process crash).
        inline: run statements that need no waiting on the calling thread (see the module
            docstring); False sends every statement to the store's thread.

    Raises:
        ValueError: `path` is ``:memory:`` or empty, or a setting is out of range.
    """

    in_process = False
    #: Shared with other processes: rows are signed with the runner's ``checkpoint_key``.
    local_key: bytes | None = None

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout_s: float = 30.0,
        synchronous: Literal["NORMAL", "FULL"] = "FULL",
        inline: bool = True,
    ) -> None:
        if os.fspath(path) in ("", ":memory:"):
            raise ValueError(
                "an in-memory SQLite database belongs to one connection, so other processes cannot "
                "share it: use MemoryCheckpointStore instead"
            )
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', not {synchronous!r}")
        if not (math.isfinite(busy_timeout_s) and busy_timeout_s >= 0):
            raise ValueError(f"busy_timeout_s must be a finite number >= 0, not {busy_timeout_s!r}")
        self.path = Path(path).absolute()
        self._busy_timeout_s = busy_timeout_s
        self._synchronous = synchronous
        self._inline = inline
        # Connections for the inline path, one per calling thread (sqlite3 objects stay on theirs).
        self._local = threading.local()
        self._ready = False
        # Guards `_worker` so a store shared across threads never loses a job to a closed pool.
        self._lock = threading.Lock()
        self._worker: _Worker | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"

    async def __aenter__(self) -> SQLiteCheckpointStore:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- plumbing ----------------------------------------------------------------------

    async def _run(self, job: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run `job` with the connection on the store's worker thread and await its result."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._worker is None:
                self._worker = _Worker(partial(_connect, self.path, self._busy_timeout_s, self._synchronous))
            # The job is queued before the lock is released, so `aclose` always comes after it.
            future = loop.run_in_executor(self._worker.pool, partial(self._worker.run, job))
        result = await future
        self._ready = True  # the worker opened the file: the schema is in place
        return result

    async def _do(self, job: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run `job` inline if it need not wait for a lock, else on the worker thread."""
        conn = self._inline_connection() if self._inline and self._ready else None
        if conn is not None:
            try:
                return job(conn)
            except sqlite3.OperationalError as exc:
                if getattr(exc, "sqlite_errorcode", None) not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                    raise
                # Another writer holds the lock; nothing was written. Wait for it off the loop.
        return await self._run(job)

    def _inline_connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            conn = sqlite3.connect(self.path, timeout=0, isolation_level=None)
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one read-only statement and return its rows."""
        return await self._do(lambda conn: conn.execute(sql, params).fetchall())

    def _checkpoint(self, row: Sequence[Any]) -> SealedCheckpoint:
        what = f"checkpoint row (run {row[0]!r}, step {row[1]!r}) in {self.path}"
        return SealedCheckpoint(*_checked(row, _CHECKPOINT_COLUMNS, _CHECKPOINT_TYPES, what))

    def _call(self, row: Sequence[Any]) -> SealedCall:
        what = f"call row (run {row[0]!r}, record {row[1]!r}.{row[2]!r}) in {self.path}"
        return SealedCall(*_checked(row, _CALL_COLUMNS, _CALL_TYPES, what))

    # -- checkpoints -------------------------------------------------------------------

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        """Store a checkpoint (compare-and-set; see `CheckpointStore.save`)."""
        check_row(run_id, step, checkpoint)
        await self._do(partial(_immediate, job=partial(self._insert_checkpoint, checkpoint)))

    def _insert_checkpoint(self, row: SealedCheckpoint, conn: sqlite3.Connection) -> None:
        """Check the compare-and-set rule and insert `row`; runs inside the write transaction."""
        last = conn.execute(f"SELECT step, flow, status FROM checkpoints {_LATEST_OF_RUN}", (row.run_id,)).fetchone()
        if last is not None:
            what = f"latest checkpoint row of run {row.run_id!r} in {self.path}"
            last = _checked(last, ("step", "flow", "status"), (int, str, str), what)
        check_save(row.run_id, row.step, row.flow, last)
        if last is None:  # a step 0: no checkpoint row, and no call row may be left either
            leftover = conn.execute("SELECT 1 FROM calls WHERE run_id = ? LIMIT 1", (row.run_id,)).fetchone()
            check_no_stored_rows(row.run_id, leftover is not None)
        values = (row.run_id, row.step, row.flow, row.status, row.segment, row.saved_at, row.payload, row.kid, row.sig)
        try:
            conn.execute(_INSERT_CHECKPOINT, values)
        except sqlite3.IntegrityError as exc:
            raise CheckpointConflict(f"run {row.run_id!r}: step {row.step} is already stored") from exc
        conn.execute(_WRITE_RUN, (row.run_id, row.flow, row.status, row.step, row.saved_at))

    async def latest(self, run_id: str) -> SealedCheckpoint:
        """Return the newest checkpoint of the run."""
        rows = await self._fetch(f"{_SELECT_CHECKPOINT} {_LATEST_OF_RUN}", (run_id,))
        if not rows:
            raise CheckpointNotFound(f"no checkpoint is stored for run {run_id!r}")
        return self._checkpoint(rows[0])

    async def history(self, run_id: str) -> Sequence[SealedCheckpoint]:
        """Return every checkpoint of the run, oldest first."""
        rows = await self._fetch(f"{_SELECT_CHECKPOINT} WHERE run_id = ? ORDER BY step", (run_id,))
        return [self._checkpoint(row) for row in rows]

    async def list_unfinished(self, flow: str) -> Sequence[str]:
        """Return the ids of the flow's running and paused runs."""
        marks = ", ".join("?" * len(UNFINISHED))
        rows = await self._fetch(
            f"SELECT run_id FROM runs WHERE flow = ? AND status IN ({marks}) ORDER BY saved_at",
            (flow, *sorted(UNFINISHED)),
        )
        return [_checked(row, ("run_id",), (str,), f"runs row of flow {flow!r} in {self.path}")[0] for row in rows]

    async def list_runs(self, flow: str | None = None, limit: int = 1000) -> Sequence[SealedCheckpoint]:
        """Return the latest checkpoint of each run, newest first."""
        columns = ", ".join(f"c.{column}" for column in _CHECKPOINT_COLUMNS)
        where, params = ("WHERE r.flow = ?", (flow,)) if flow is not None else ("", ())
        rows = await self._fetch(
            f"SELECT {columns} FROM runs AS r JOIN checkpoints AS c ON c.run_id = r.run_id AND c.step = r.step "
            f"{where} ORDER BY r.saved_at DESC LIMIT ?",
            (*params, max(limit, 0)),
        )
        return [self._checkpoint(row) for row in rows]

    async def stored_runs(self) -> Sequence[str]:
        """Return the id of every run with a checkpoint row, sorted (read from ``checkpoints``, not ``runs``)."""
        rows = await self._fetch("SELECT DISTINCT run_id FROM checkpoints")
        return sorted(_checked(row, ("run_id",), (str,), f"checkpoint row in {self.path}")[0] for row in rows)

    async def relist(self, run_id: str) -> SealedCheckpoint | None:
        """Write the run's ``runs`` row again from its newest checkpoint row; return that row.

        One write transaction (see `CheckpointStore.relist`). A ``runs`` row that already
        holds the newest row's flow, status, step and saved_at is left untouched. The rules
        read the ``checkpoints`` rows, so saves and call records never needed the entry; the
        listings do.
        """
        return await self._do(partial(_immediate, job=partial(self._relist, run_id)))

    def _relist(self, run_id: str, conn: sqlite3.Connection) -> SealedCheckpoint | None:
        """Rewrite the ``runs`` row if it differs from the newest checkpoint; runs in the write transaction."""
        newest = conn.execute(f"{_SELECT_CHECKPOINT} {_LATEST_OF_RUN}", (run_id,)).fetchone()
        if newest is None:
            return None
        row = self._checkpoint(newest)
        entry = (row.flow, row.status, row.step, row.saved_at)
        listed = conn.execute(f"SELECT {', '.join(_RUN_COLUMNS)} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if listed is None or tuple(listed) != entry:
            conn.execute(_WRITE_RUN, (run_id, *entry))
        return row

    async def delete(self, run_id: str) -> None:
        """Forget the run: its checkpoints, its listing row, its call log, its lease and its events."""

        def job(conn: sqlite3.Connection) -> None:
            for table in ("checkpoints", "runs", "calls", "leases", "events"):
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))

        await self._do(partial(_immediate, job=job))

    # -- call records ------------------------------------------------------------------

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        """Append a call record (numbered and fenced; see `CheckpointStore.record_call`)."""
        await self._do(partial(_immediate, job=partial(self._insert_call, run_id, record)))

    def _insert_call(self, run_id: str, record: SealedCall, conn: sqlite3.Connection) -> None:
        """Check numbering and fencing and insert `record`; runs inside the write transaction."""
        last = conn.execute(f"SELECT step, status, segment FROM checkpoints {_LATEST_OF_RUN}", (run_id,)).fetchone()
        if last is not None:
            what = f"latest checkpoint row of run {run_id!r} in {self.path}"
            last = _checked(last, ("step", "status", "segment"), (int, str, int), what)
        (count,) = conn.execute(
            "SELECT COUNT(*) FROM calls WHERE run_id = ? AND segment = ?", (run_id, record.segment)
        ).fetchone()
        check_call(run_id, record, last, count)
        values = (run_id, record.segment, record.seq, record.kind, record.payload, record.kid, record.sig)
        try:
            conn.execute(_INSERT_CALL, values)
        except sqlite3.IntegrityError as exc:
            raise CheckpointConflict(
                f"run {run_id!r}: call record {record.segment}.{record.seq} is already stored"
            ) from exc

    async def save_after_calls(
        self, run_id: str, step: int, checkpoint: SealedCheckpoint, calls: Sequence[SealedCall]
    ) -> None:
        """Append `calls`, then save `checkpoint`, in one transaction (one commit, one fsync)."""
        check_row(run_id, step, checkpoint)

        def job(conn: sqlite3.Connection) -> None:
            for record in calls:
                self._insert_call(run_id, record, conn)
            self._insert_checkpoint(checkpoint, conn)

        await self._do(partial(_immediate, job=job))

    async def head(self, run_id: str) -> tuple[SealedCheckpoint, Mapping[int, int]]:
        """Return the latest checkpoint and the record count of each segment.

        One job on one connection: the counts are read after the checkpoint, so they can
        show records written since, never fewer than it saw.

        Raises:
            CheckpointNotFound: nothing is stored for the run.
        """

        def job(conn: sqlite3.Connection) -> tuple[list[Any], list[Any]]:
            latest = conn.execute(f"{_SELECT_CHECKPOINT} {_LATEST_OF_RUN}", (run_id,)).fetchall()
            counts = conn.execute(
                "SELECT segment, COUNT(*) FROM calls WHERE run_id = ? GROUP BY segment", (run_id,)
            ).fetchall()
            return latest, counts

        latest, counts = await self._do(job)
        if not latest:
            raise CheckpointNotFound(f"no checkpoint is stored for run {run_id!r}")
        what = f"call rows of run {run_id!r} in {self.path}"
        return self._checkpoint(latest[0]), dict(_checked(c, ("segment", "count"), (int, int), what) for c in counts)

    async def calls(self, run_id: str) -> Sequence[SealedCall]:
        """Return the run's call records by segment, then sequence number."""
        rows = await self._fetch(f"{_SELECT_CALL} WHERE run_id = ? ORDER BY segment, seq", (run_id,))
        return [self._call(row) for row in rows]

    # -- leases (`_sqlite_leases`) ------------------------------------------------------

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Lease:
        """Take the run's lease unless another live token holds it: one upsert and its read-back, one transaction."""
        check_lease_args(owner, token, ttl_s)
        job = partial(_sqlite_leases.take, run_id, owner, token, ttl_s, self.path)
        return await self._do(partial(_immediate, job=job))

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> Lease | None:
        """Push the lease's expiry if `token` holds it live (see `CheckpointStore.renew_lease`)."""
        job = partial(_sqlite_leases.renew, run_id, token, ttl_s, self.path)
        return await self._do(partial(_immediate, job=job))

    async def release_lease(self, run_id: str, token: str) -> bool:
        """Give the lease up if `token` holds it; whether it was live."""
        return await self._do(partial(_immediate, job=partial(_sqlite_leases.release, run_id, token)))

    async def leases(self, run_ids: Sequence[str]) -> Mapping[str, Lease]:
        """The live leases among `run_ids`."""
        return await self._do(partial(_sqlite_leases.read, list(run_ids), self.path))

    # -- retention (`_sqlite_prune`) ----------------------------------------------------

    async def prunable(self, before: float, statuses: Collection[str], limit: int) -> Sequence[str]:
        """The runs a prune would take now, oldest first (see `RetentionStore.prunable`)."""
        return await self._do(partial(_sqlite_prune.prunable, before, _statuses(statuses), limit))

    async def prune(self, run_ids: Sequence[str], before: float, statuses: Collection[str], owner: str) -> Pruned:
        """Delete the runs that still qualify, whole, in one write transaction (see `RetentionStore.prune`)."""
        job = partial(_sqlite_prune.prune, list(run_ids), before, _statuses(statuses))
        pruned, rows = await self._do(partial(_immediate, job=job))
        return Pruned(tuple(pruned), rows)

    # -- event streams (`_sqlite_events`) -----------------------------------------------

    async def append_events(self, run_id: str, events: Sequence[SealedEvent]) -> None:
        """Append to the run's stream, keeping the newest (see `EventStore.append_events`)."""
        check_events(run_id, events)
        if events:
            await self._do(partial(_immediate, job=partial(_sqlite_events.append, run_id, events)))

    async def read_events(self, run_id: str, after: str | None = None, limit: int = 1000) -> Sequence[StoredEvent]:
        """The run's events after cursor `after`, oldest first (see `EventStore.read_events`)."""
        after_no = int_cursor(after)
        return await self._do(partial(_sqlite_events.read, run_id, after_no, limit, where=str(self.path)))

    # -- lifecycle ---------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the connections and stop the worker thread; the next call opens them again."""
        inline: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if inline is not None and getattr(self._local, "pid", None) == os.getpid():
            inline.close()
        self._local = threading.local()
        self._ready = False
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is None:
            return
        try:
            # Queued after every job already submitted, so those finish on the connection first.
            await asyncio.get_running_loop().run_in_executor(worker.pool, worker.close)
        finally:
            worker.pool.shutdown(wait=False)
