"""`SQLiteCheckpointStore`: the store protocol on one SQLite file shared by every process on a host.

This module owns the store: its compare-and-set writes, its reads and where each statement
runs. The file itself (schema and `MIGRATIONS`, connection settings, the write transaction
and the worker thread) is `sqlite.file`'s.

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
- Leases (``leases`` table) are `sqlite._leases`'s statements, run here like the other
  writes: a take is one upsert and its read-back in one write transaction. Their commits
  do not wait for the disk (`sqlite.file.unflushed`): a lease matters only to live
  processes, and the power loss that could drop such a commit ends every one of them.
- Markers (``markers`` table, `MarkerStore`) are `sqlite._markers`'s statements, the
  leases' rules on a table of their own: a put is one upsert and its read-back, a take
  one DELETE, each in one write transaction; a peek reads without one. Their commits
  wait for the disk as every write but a lease's does.
- The rows' columns, type checks and the statements of a save, a call record and a
  relist (run inside the write transaction) are `sqlite._rows`'.
- Retention (`prunable`, `prune`, `trimmable`, `trim`) is `sqlite._prune`'s: a batch of
  runs is judged (each newest checkpoint row against the row the caller judged, when it
  passes them) and deleted from every table (or trimmed) in one write transaction.
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
from typing import Any, Literal, TypeVar

from agentflow._errors import CheckpointNotFound
from agentflow.exec.checkpoints.records import (
    UNFINISHED,
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
from agentflow.exec.checkpoints.rules import (
    check_events,
    check_judged,
    check_lease_args,
    check_marker_args,
    check_row,
    int_cursor,
)
from agentflow.exec.checkpoints.rules import check_prune_statuses as _statuses
from agentflow.exec.checkpoints.sqlite import _events as _sqlite_events
from agentflow.exec.checkpoints.sqlite import _leases as _sqlite_leases
from agentflow.exec.checkpoints.sqlite import _markers as _sqlite_markers
from agentflow.exec.checkpoints.sqlite import _prune as _sqlite_prune
from agentflow.exec.checkpoints.sqlite import _rows as _sqlite_rows
from agentflow.exec.checkpoints.sqlite._rows import (
    CHECKPOINT_COLUMNS,
    LATEST_OF_RUN,
    SELECT_CALL,
    SELECT_CHECKPOINT,
    call_of,
    checked,
    checkpoint_of,
    insert_call,
    insert_checkpoint,
)
from agentflow.exec.checkpoints.sqlite.file import MIGRATIONS as MIGRATIONS  # re-exported: tests import it here
from agentflow.exec.checkpoints.sqlite.file import _connect, _Worker, in_immediate, unflushed

_T = TypeVar("_T")


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

    # -- checkpoints -------------------------------------------------------------------

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        """Store a checkpoint (compare-and-set; see `CheckpointStore.save`)."""
        check_row(run_id, step, checkpoint)
        await self._do(partial(in_immediate, job=partial(insert_checkpoint, checkpoint, self.path)))

    async def latest(self, run_id: str) -> SealedCheckpoint:
        """Return the newest checkpoint of the run."""
        rows = await self._fetch(f"{SELECT_CHECKPOINT} {LATEST_OF_RUN}", (run_id,))
        if not rows:
            raise CheckpointNotFound(f"no checkpoint is stored for run {run_id!r}")
        return checkpoint_of(rows[0], self.path)

    async def history(self, run_id: str) -> Sequence[SealedCheckpoint]:
        """Return every checkpoint of the run, oldest first."""
        rows = await self._fetch(f"{SELECT_CHECKPOINT} WHERE run_id = ? ORDER BY step", (run_id,))
        return [checkpoint_of(row, self.path) for row in rows]

    async def list_unfinished(self, flow: str) -> Sequence[str]:
        """Return the ids of the flow's running and paused runs."""
        marks = ", ".join("?" * len(UNFINISHED))
        rows = await self._fetch(
            f"SELECT run_id FROM runs WHERE flow = ? AND status IN ({marks}) ORDER BY saved_at",
            (flow, *sorted(UNFINISHED)),
        )
        return [checked(row, ("run_id",), (str,), f"runs row of flow {flow!r} in {self.path}")[0] for row in rows]

    async def list_runs(self, flow: str | None = None, limit: int = 1000) -> Sequence[SealedCheckpoint]:
        """Return the latest checkpoint of each run, newest first."""
        columns = ", ".join(f"c.{column}" for column in CHECKPOINT_COLUMNS)
        where, params = ("WHERE r.flow = ?", (flow,)) if flow is not None else ("", ())
        rows = await self._fetch(
            f"SELECT {columns} FROM runs AS r JOIN checkpoints AS c ON c.run_id = r.run_id AND c.step = r.step "
            f"{where} ORDER BY r.saved_at DESC LIMIT ?",
            (*params, max(limit, 0)),
        )
        return [listed(str(row[0]), partial(checkpoint_of, row, self.path)) for row in rows]

    async def stored_runs(self) -> Sequence[str]:
        """Return the id of every run with a checkpoint row, sorted (read from ``checkpoints``, not ``runs``)."""
        rows = await self._fetch("SELECT DISTINCT run_id FROM checkpoints")
        return sorted(checked(row, ("run_id",), (str,), f"checkpoint row in {self.path}")[0] for row in rows)

    async def relist(self, run_id: str) -> SealedCheckpoint | None:
        """Write the run's ``runs`` row again from its newest checkpoint row; return that row.

        One write transaction (see `CheckpointStore.relist`). A ``runs`` row that already
        holds the newest row's flow, status, step and saved_at is left untouched. The rules
        read the ``checkpoints`` rows, so saves and call records never needed the entry; the
        listings do.
        """
        return await self._do(partial(in_immediate, job=partial(_sqlite_rows.relist, run_id, self.path)))

    async def delete(self, run_id: str) -> None:
        """Forget the run: its checkpoints, its listing row, its call log, its lease and its events."""

        def job(conn: sqlite3.Connection) -> None:
            for table in ("checkpoints", "runs", "calls", "leases", "events"):
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))

        await self._do(partial(in_immediate, job=job))

    # -- call records ------------------------------------------------------------------

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        """Append a call record (numbered and fenced; see `CheckpointStore.record_call`)."""
        await self._do(partial(in_immediate, job=partial(insert_call, run_id, record, self.path)))

    async def save_after_calls(
        self, run_id: str, step: int, checkpoint: SealedCheckpoint, calls: Sequence[SealedCall]
    ) -> None:
        """Append `calls`, then save `checkpoint`, in one transaction (one commit, one fsync)."""
        check_row(run_id, step, checkpoint)

        def job(conn: sqlite3.Connection) -> None:
            for record in calls:
                insert_call(run_id, record, self.path, conn)
            insert_checkpoint(checkpoint, self.path, conn)

        await self._do(partial(in_immediate, job=job))

    async def record_call_moving(self, run_id: str, record: SealedCall, move: LeaseMove) -> None:
        """`record_call`, moving the run's lease in the same transaction (see `LeaseMoving`)."""

        def job(conn: sqlite3.Connection) -> None:
            _sqlite_leases.move(run_id, move, self.path, conn)
            insert_call(run_id, record, self.path, conn)

        await self._do(partial(in_immediate, job=job))

    async def save_after_calls_moving(
        self,
        run_id: str,
        step: int,
        checkpoint: SealedCheckpoint,
        calls: Sequence[SealedCall],
        move: LeaseMove,
        events: Sequence[SealedEvent] = (),
    ) -> None:
        """`save_after_calls`, moving the run's lease and appending `events` in the same transaction (`LeaseMoving`)."""
        check_row(run_id, step, checkpoint)
        check_events(run_id, events)

        def job(conn: sqlite3.Connection) -> None:
            _sqlite_leases.move(run_id, move, self.path, conn)
            for record in calls:
                insert_call(run_id, record, self.path, conn)
            insert_checkpoint(checkpoint, self.path, conn)
            if events:
                _sqlite_events.append(run_id, events, conn)

        await self._do(partial(in_immediate, job=job))

    async def head(self, run_id: str) -> tuple[SealedCheckpoint, Mapping[int, int]]:
        """Return the latest checkpoint and the record count of each segment.

        One job on one connection: the counts are read after the checkpoint, so they can
        show records written since, never fewer than it saw.

        Raises:
            CheckpointNotFound: nothing is stored for the run.
        """

        def job(conn: sqlite3.Connection) -> tuple[list[Any], list[Any]]:
            latest = conn.execute(f"{SELECT_CHECKPOINT} {LATEST_OF_RUN}", (run_id,)).fetchall()
            counts = conn.execute(
                "SELECT segment, COUNT(*) FROM calls WHERE run_id = ? GROUP BY segment", (run_id,)
            ).fetchall()
            return latest, counts

        latest, counts = await self._do(job)
        if not latest:
            raise CheckpointNotFound(f"no checkpoint is stored for run {run_id!r}")
        what = f"call rows of run {run_id!r} in {self.path}"
        counted = dict(checked(c, ("segment", "count"), (int, int), what) for c in counts)
        return checkpoint_of(latest[0], self.path), counted

    async def bookkeeping(self, run_id: str) -> Bookkeeping:
        """The run's newest checkpoint row's step, flow and status beside its ``runs`` row's, in one statement.

        SQLite counts a segment's records from its rows: there is no counter to set back.
        """
        rows = await self._fetch(
            "SELECT c.step, c.flow, c.status, r.step, r.flow, r.status FROM checkpoints AS c "
            "LEFT JOIN runs AS r ON r.run_id = c.run_id WHERE c.run_id = ? ORDER BY c.step DESC LIMIT 1",
            (run_id,),
        )
        return listing_bookkeeping(rows[0] if rows else None, f"run {run_id!r} in {self.path}")

    async def calls(self, run_id: str) -> Sequence[SealedCall]:
        """Return the run's call records by segment, then sequence number."""
        rows = await self._fetch(f"{SELECT_CALL} WHERE run_id = ? ORDER BY segment, seq", (run_id,))
        return [call_of(row, self.path) for row in rows]

    # -- leases (`sqlite._leases`) ------------------------------------------------------

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Lease:
        """Take the run's lease unless another live token holds it: one upsert and its read-back, one transaction."""
        check_lease_args(owner, token, ttl_s)
        job = partial(_sqlite_leases.take, run_id, owner, token, ttl_s, self.path)
        return await self._do(partial(unflushed, job=job, level=self._synchronous))

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> Lease | None:
        """Push the lease's expiry if `token` holds it live (see `CheckpointStore.renew_lease`)."""
        job = partial(_sqlite_leases.renew, run_id, token, ttl_s, self.path)
        return await self._do(partial(unflushed, job=job, level=self._synchronous))

    async def release_lease(self, run_id: str, token: str) -> bool:
        """Give the lease up if `token` holds it; whether it was live."""
        job = partial(_sqlite_leases.release, run_id, token)
        return await self._do(partial(unflushed, job=job, level=self._synchronous))

    async def leases(self, run_ids: Sequence[str]) -> Mapping[str, Lease]:
        """The live leases among `run_ids`."""
        return await self._do(partial(_sqlite_leases.read, list(run_ids), self.path))

    # -- markers (`sqlite._markers`) ---------------------------------------------------

    async def put_marker(self, key: str, value: str, token: str, ttl_s: float) -> Marker:
        """Set the marker unless another token's is live: one upsert and its read-back (`MarkerStore.put_marker`)."""
        check_marker_args(key, value, token, ttl_s)
        job = partial(_sqlite_markers.put, key, value, token, ttl_s, self.path)
        return await self._do(partial(in_immediate, job=job))

    async def peek_markers(self, keys: Sequence[str]) -> Mapping[str, Marker]:
        """The live markers among `keys`."""
        return await self._do(partial(_sqlite_markers.peek, list(keys), self.path))

    async def take_marker(self, key: str, token: str) -> bool:
        """Remove the marker if `token` set it, live or lapsed; whether it was live."""
        return await self._do(partial(in_immediate, job=partial(_sqlite_markers.take, key, token)))

    # -- retention (`sqlite._prune`) ----------------------------------------------------

    async def prunable(self, before: float, statuses: Collection[str], limit: int) -> Sequence[str]:
        """The runs a prune would take now, oldest first (see `RetentionStore.prunable`)."""
        return await self._do(partial(_sqlite_prune.prunable, before, _statuses(statuses), limit))

    async def prune(
        self,
        run_ids: Sequence[str],
        before: float,
        statuses: Collection[str],
        owner: str,
        judged: JudgedRows | None = None,
    ) -> Pruned:
        """Delete the runs that still qualify, whole, in one write transaction (see `RetentionStore.prune`)."""
        job = partial(_sqlite_prune.prune, list(run_ids), before, _statuses(statuses), check_judged(judged))
        pruned, rows, problems = await self._do(partial(in_immediate, job=job))
        return Pruned(tuple(pruned), rows, tuple(problems))

    async def trimmable(
        self, before: float, statuses: Collection[str], limit: int, since: float | None = None
    ) -> Sequence[tuple[str, float]]:
        """The runs a trim would take now, oldest first (see `TrimStore.trimmable`)."""
        return await self._do(partial(_sqlite_prune.trimmable, before, _statuses(statuses, "a trim"), limit, since))

    async def trim(
        self, run_ids: Sequence[str], before: float, statuses: Collection[str], judged: JudgedRows | None = None
    ) -> Trimmed:
        """Keep only the newest checkpoint of the runs that qualify, in one write transaction (`TrimStore.trim`)."""
        job = partial(_sqlite_prune.trim, list(run_ids), before, _statuses(statuses, "a trim"), check_judged(judged))
        trimmed, rows, problems = await self._do(partial(in_immediate, job=job))
        return Trimmed(tuple(trimmed), rows, tuple(problems))

    # -- event streams (`sqlite._events`) -----------------------------------------------

    async def append_events(self, run_id: str, events: Sequence[SealedEvent]) -> None:
        """Append to the run's stream, keeping the newest (see `EventStore.append_events`)."""
        check_events(run_id, events)
        if events:
            await self._do(partial(in_immediate, job=partial(_sqlite_events.append, run_id, events)))

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
