"""The SQLite fast path of `SQLAlchemyCheckpointStore`: each hot operation is one job, run inline.

aiosqlite runs every call of a connection on a thread of its own and the event loop waits
for each: measured before, a superstep made 4.3 SQLAlchemy transactions of 14 statements
and 55 thread round trips (cursor, execute, fetch, close, commit, and the pool's reset),
each a wake-up of two threads. Now each operation (a save, a call record, records then a
save, a lease take, renewal or release, the live leases, ``latest``, ``head``, a peek at
markers: the cancel check each superstep makes) is one
function of the ``sqlite3`` connection under a pooled one (`Connector.lite`), which runs
its statements and ends its transaction itself:

- Inline first, as `SQLiteCheckpointStore` does: on the event loop's thread (SQLAlchemy
  opens file databases with ``check_same_thread`` off), with the connection's busy timeout
  at zero for the job, so it never waits: about 0.15 ms of CPU, no thread hop.
- On aiosqlite's thread when it cannot: the file is locked by another writer (the job
  fails at once, before writing anything, and waits there for the lock with the usual busy
  timeout, the loop free meanwhile), or the connection is bound to its thread (a URL with
  ``check_same_thread=true``). One round trip.

A write is one ``BEGIN IMMEDIATE`` transaction: the write lock first, then the run's
``runs`` row, `rules` applied in Python on what it read, then the writes, as the store's
SQLAlchemy transactions did (a step 0 refuses to start over stored rows; two writers of
one step 0 meet at the primary key; a duplicate key is `CheckpointConflict`). A commit
waits for the disk as the connection's ``synchronous`` level says (SQLite's default,
``FULL``), except a lease's: leases commit at ``NORMAL`` when the level is ``FULL``, as in
`SQLiteCheckpointStore` (`sqlite.file.unflushed`; only a power loss can drop such a
commit, and it ends every process a SQLite lease means anything to). Lease expiry is judged
on the host's clock, read when the operation starts.

What the rules raise is returned by the job, not raised through the thread, so that the
connection is kept; it is raised once the connection is given back.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import partial
from typing import Any, Final, TypeVar

from agentflow._errors import AgentflowError, CheckpointConflict
from agentflow.exec.checkpoints.records import Lease, LeaseMove, SealedCall, SealedCheckpoint, stored_fields
from agentflow.exec.checkpoints.rules import (
    check_call,
    check_lease_args,
    check_lease_move,
    check_move_args,
    check_no_stored_rows,
    check_save,
)
from agentflow.exec.checkpoints.sqlalchemy.engines import SQLITE_BUSY_TIMEOUT_MS, Connector, LoopEngine
from agentflow.exec.checkpoints.sqlite.file import in_immediate, unflushed

_T = TypeVar("_T")

#: A checkpoint row's columns, in `SealedCheckpoint` field order; a call row's, in `SealedCall`'s.
_CHECKPOINT: Final = tuple(f.name for f in fields(SealedCheckpoint))
_CALL: Final = tuple(f.name for f in stored_fields(SealedCall))
#: A lease row's columns, in `Lease` field order.
_LEASE: Final = tuple(f.name for f in fields(Lease))
#: How many run ids one statement of `leases` asks for (SQLite allows 32,766 parameters).
_CHUNK: Final = 500
#: ``PRAGMA synchronous`` values by name, for `unflushed`.
_LEVELS: Final = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
#: The primary result codes of a lock held elsewhere.
_LOCKED: Final = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class _Elsewhere:
    """Returned by an inline attempt that must be made again on aiosqlite's thread."""


_ELSEWHERE: Final = _Elsewhere()


@dataclass(frozen=True, slots=True)
class _Refused:
    """What the rules (or an argument check) raised in a job, returned to be raised after it."""

    error: Exception


def _guarded(job: Callable[[sqlite3.Connection], _T], conn: sqlite3.Connection) -> _T | _Refused:
    """Run `job`; return what the rules raised instead of raising it (a SQLite error is raised)."""
    try:
        return job(conn)
    except (AgentflowError, ValueError) as refused:
        return _Refused(refused)


def _insert(conn: sqlite3.Connection, sql: str, values: Sequence[Any], taken: str) -> None:
    """Insert a row; a duplicate key means another writer got there first."""
    try:
        conn.execute(sql, values)
    except sqlite3.IntegrityError:
        raise CheckpointConflict(f"{taken} was written by another writer at the same time") from None


class LiteFastPath:
    """The one-job operations of one store on SQLite (its tables prefixed `p`).

    `ready` returns this loop's engine once the store's tables are set up.
    """

    def __init__(self, db: Connector, ready: Callable[[], Awaitable[LoopEngine]], p: str) -> None:
        self._db = db
        self._ready = ready
        #: False once a connection refused to be used off its thread (then every job hops).
        self._inline = True
        self._run = f"SELECT step, flow, status, segment FROM {p}runs WHERE run_id = ?"
        self._count = f"SELECT count(*) FROM {p}calls WHERE run_id = ? AND segment = ?"
        self._stored = (
            f"SELECT EXISTS (SELECT 1 FROM {p}checkpoints WHERE run_id = ?) "
            f"OR EXISTS (SELECT 1 FROM {p}calls WHERE run_id = ?)"
        )
        self._insert_call = f"INSERT INTO {p}calls ({', '.join(_CALL)}) VALUES ({', '.join('?' * len(_CALL))})"
        self._insert_run = (
            f"INSERT INTO {p}runs (run_id, flow, status, step, segment, saved_at) VALUES (?, ?, ?, ?, ?, ?)"
        )
        self._update_run = (
            f"UPDATE {p}runs SET flow = ?, status = ?, step = ?, segment = ?, saved_at = ? WHERE run_id = ?"
        )
        self._insert_checkpoint = (
            f"INSERT INTO {p}checkpoints ({', '.join(_CHECKPOINT)}) VALUES ({', '.join('?' * len(_CHECKPOINT))})"
        )
        self._latest = (
            f"SELECT {', '.join(_CHECKPOINT)} FROM {p}checkpoints WHERE run_id = ? ORDER BY step DESC LIMIT 1"
        )
        self._counts = f"SELECT segment, count(*) FROM {p}calls WHERE run_id = ? GROUP BY segment"
        # the upsert of `sqlalchemy._leases`: a row is overwritten only when it lapsed or is this token's
        self._take = (
            f"INSERT INTO {p}leases AS l ({', '.join(_LEASE)}) VALUES (?, ?, ?, ? + ?) ON CONFLICT (run_id) DO UPDATE "
            "SET owner = excluded.owner, token = excluded.token, expires_at = excluded.expires_at "
            "WHERE l.expires_at <= ? OR l.token = excluded.token"
        )
        self._lease = f"SELECT {', '.join(_LEASE)} FROM {p}leases WHERE run_id = ?"
        self._drop_lease = f"DELETE FROM {p}leases WHERE run_id = ?"
        self._renew = f"UPDATE {p}leases SET expires_at = ? + ? WHERE run_id = ? AND token = ? AND expires_at > ?"
        self._release_live = f"DELETE FROM {p}leases WHERE run_id = ? AND token = ? AND expires_at > ?"
        self._release_any = f"DELETE FROM {p}leases WHERE run_id = ? AND token = ?"
        self._live = f"SELECT {', '.join(_LEASE)} FROM {p}leases WHERE expires_at > ? AND run_id IN "
        self._live_markers = (
            f'SELECT "key", value, token, expires_at FROM {p}markers WHERE expires_at > ? AND "key" IN '
        )

    async def _do(self, job: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run `job` on a lent connection, inline if it need not wait, else on aiosqlite's thread."""
        async with self._db.lite(await self._ready()) as raw:
            outcome = self._attempt(raw._conn, job) if self._inline else _ELSEWHERE
            if isinstance(outcome, _Elsewhere):
                outcome = await raw._execute(_guarded, job, raw._conn)
        if isinstance(outcome, _Refused):
            raise outcome.error
        return outcome

    def _attempt(self, conn: sqlite3.Connection, job: Callable[[sqlite3.Connection], _T]) -> _T | _Refused | _Elsewhere:
        """Run `job` on this thread without waiting for a lock; `_ELSEWHERE` if it must wait or cannot run here."""
        try:
            conn.execute("PRAGMA busy_timeout = 0")
        except sqlite3.ProgrammingError as exc:
            if "same thread" not in str(exc):
                raise
            self._inline = False  # opened with check_same_thread: only aiosqlite's thread may use it
            return _ELSEWHERE
        try:
            return _guarded(job, conn)
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF not in _LOCKED:
                raise
            return _ELSEWHERE  # nothing was written (the job rolled back): wait for the lock off the loop
        finally:
            conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")

    # -- saves and call records --------------------------------------------------------

    async def write(
        self,
        run_id: str,
        step: int | None,
        checkpoint: SealedCheckpoint | None,
        calls: Sequence[SealedCall],
        move: LeaseMove | None = None,
    ) -> None:
        """Append `calls`, then save `checkpoint` as `step` (None: records only), in one transaction.

        `move`: the run's lease moves in the same transaction (`LeaseMoving`), checked first.

        Raises:
            CheckpointConflict: a rule refused it (the message is `rules`'), or another writer won a key.
            RunHeld: `move`'s bearer does not hold the lease, and another token holds it live.
            CheckpointNotFound: records for a run without a checkpoint.
        """
        if move is not None:
            check_move_args(move)
        await self._do(partial(in_immediate, job=partial(self._write, run_id, step, checkpoint, calls, move)))

    def _write(
        self,
        run_id: str,
        step: int | None,
        checkpoint: SealedCheckpoint | None,
        calls: Sequence[SealedCall],
        move: LeaseMove | None,
        conn: sqlite3.Connection,
    ) -> None:
        now = time.time()
        if move is not None:  # the lease's rule first: a refused move writes nothing
            found = conn.execute(self._lease, (run_id,)).fetchone()
            held = None if found is None else Lease(*found)
            check_lease_move(run_id, move, held if held is not None and held.expires_at > now else None)
        self._write_rows(run_id, step, checkpoint, calls, conn)
        if move is not None:
            conn.execute(self._drop_lease, (run_id,))
            if move.to is not None:
                conn.execute(self._take, (run_id, move.owner, move.to, now, move.ttl_s, now))

    def _write_rows(
        self,
        run_id: str,
        step: int | None,
        checkpoint: SealedCheckpoint | None,
        calls: Sequence[SealedCall],
        conn: sqlite3.Connection,
    ) -> None:
        row = conn.execute(self._run, (run_id,)).fetchone()  # (step, flow, status, segment), under the write lock
        if not calls and step == 0 and row is None:  # a new run: none of its rows may be stored yet
            check_no_stored_rows(run_id, bool(conn.execute(self._stored, (run_id, run_id)).fetchone()[0]))
        counts: dict[int, int] = {}  # under the write lock only this transaction adds records
        for record in calls:
            if record.segment not in counts:
                counts[record.segment] = conn.execute(self._count, (run_id, record.segment)).fetchone()[0]
            check_call(run_id, record, None if row is None else (row[0], row[2], row[3]), counts[record.segment])
            taken = f"call record {record.segment}.{record.seq} of run {run_id!r}"
            _insert(conn, self._insert_call, [getattr(record, name) for name in _CALL], taken)
            counts[record.segment] += 1
        if step is None or checkpoint is None:
            return
        check_save(run_id, step, checkpoint.flow, None if row is None else (row[0], row[1], row[2]))
        cp, taken = checkpoint, f"run {run_id!r} step {step}"
        latest = (cp.flow, cp.status, step, cp.segment, cp.saved_at)
        if row is None:  # only a step 0 gets here: the primary key picks one of two writers
            _insert(conn, self._insert_run, (run_id, *latest), taken)
        else:
            conn.execute(self._update_run, (*latest, run_id))
        _insert(conn, self._insert_checkpoint, (run_id, *[getattr(cp, name) for name in _CHECKPOINT[1:]]), taken)

    # -- reads -------------------------------------------------------------------------

    async def latest(self, run_id: str) -> Mapping[str, Any] | None:
        """The run's newest checkpoint row, or None."""
        row = await self._do(lambda conn: conn.execute(self._latest, (run_id,)).fetchone())
        return None if row is None else dict(zip(_CHECKPOINT, row, strict=True))

    async def head(self, run_id: str) -> tuple[Mapping[str, Any] | None, dict[int, int]]:
        """The run's newest checkpoint row (or None) and its records per segment, counted after it."""

        def job(conn: sqlite3.Connection) -> tuple[Any, list[Any]]:
            return conn.execute(self._latest, (run_id,)).fetchone(), conn.execute(self._counts, (run_id,)).fetchall()

        row, counts = await self._do(job)
        found = None if row is None else dict(zip(_CHECKPOINT, row, strict=True))
        return found, {int(segment): int(n) for segment, n in counts}

    # -- leases ------------------------------------------------------------------------

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Mapping[str, Any] | None:
        """Take the run's lease unless another live token holds it; the lease row as it stands."""
        check_lease_args(owner, token, ttl_s)
        now = time.time()

        def take(conn: sqlite3.Connection) -> Any:
            conn.execute(self._take, (run_id, owner, token, now, ttl_s, now))
            return conn.execute(self._lease, (run_id,)).fetchone()

        row = await self._do(partial(self.unflushed, take))
        return None if row is None else dict(zip(_LEASE, row, strict=True))

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> Mapping[str, Any] | None:
        """Push the expiry of `token`'s live lease; the row, or None if it holds none."""
        now = time.time()

        def renew(conn: sqlite3.Connection) -> Any:
            if not conn.execute(self._renew, (now, ttl_s, run_id, token, now)).rowcount:
                return None
            return conn.execute(self._lease, (run_id,)).fetchone()

        row = await self._do(partial(self.unflushed, renew))
        return None if row is None else dict(zip(_LEASE, row, strict=True))

    async def release_lease(self, run_id: str, token: str) -> bool:
        """Delete `token`'s lease of the run, live or lapsed; whether it was live."""
        now = time.time()

        def release(conn: sqlite3.Connection) -> bool:
            live = conn.execute(self._release_live, (run_id, token, now)).rowcount
            conn.execute(self._release_any, (run_id, token))
            return bool(live)

        return await self._do(partial(self.unflushed, release))

    async def leases(self, run_ids: Sequence[str]) -> Sequence[Mapping[str, Any]]:
        """The live lease rows among `run_ids` (each id once)."""
        unique, now = list(dict.fromkeys(run_ids)), time.time()

        def read(conn: sqlite3.Connection) -> list[Any]:
            found = []
            for start in range(0, len(unique), _CHUNK):
                chunk = unique[start : start + _CHUNK]
                found += conn.execute(f"{self._live}({', '.join('?' * len(chunk))})", (now, *chunk)).fetchall()
            return found

        return [dict(zip(_LEASE, row, strict=True)) for row in await self._do(read)] if unique else []

    async def peek_markers(self, keys: Sequence[str]) -> Sequence[Sequence[Any]]:
        """The live marker rows (key, value, token, expires_at) among `keys` (each key once): one read, inline."""
        unique, now = list(dict.fromkeys(keys)), time.time()

        def read(conn: sqlite3.Connection) -> list[Any]:
            found = []
            for start in range(0, len(unique), _CHUNK):
                chunk = unique[start : start + _CHUNK]
                found += conn.execute(f"{self._live_markers}({', '.join('?' * len(chunk))})", (now, *chunk)).fetchall()
            return found

        return await self._do(read) if unique else []

    @staticmethod
    def unflushed(job: Callable[[sqlite3.Connection], _T], conn: sqlite3.Connection) -> _T:
        """Run `job` in a write transaction whose commit does not wait for the disk at ``FULL``."""
        (level,) = conn.execute("PRAGMA synchronous").fetchone()
        return unflushed(conn, job, _LEVELS.get(level, "?"))  # lowered from FULL only
