"""The run leases of `SQLiteCheckpointStore`: the ``leases`` table and the statements on it.

One row per run that is or was held (schema version 2 in `_sqlite_file.MIGRATIONS`)::

    leases (run_id TEXT PRIMARY KEY, owner TEXT, token TEXT, expires_at REAL)

Every process sharing the file runs on the same host, so expiry is judged against that
host's ``time.time()``, read inside the job, after the write lock is held. A row whose
``expires_at`` is not past ``now`` is a live lease; a lapsed row stays until the next take
overwrites it, and nothing reads it as held.

Each write is a job for the store's write transaction (`_sqlite_file._immediate`, ``BEGIN
IMMEDIATE``), so no other connection to the file writes between its statements:

- take: one upsert that writes only where the row is free, lapsed or this token's
  (`_TAKE`), then the row read back: this token's if the upsert wrote, else the live
  holder's, unchanged. Of racing takers, the first to get the write lock wins; each later
  one finds a live row of another token and reads it back.
- renew: an UPDATE of the live row of this token, then the row read back.
- release: a DELETE of this token's row; it says whether the row was still live.

Reads (`read`) need no transaction. No statement uses ``RETURNING``, so SQLite 3.24 (the
first with upserts) is enough.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from agentflow._errors import CheckpointStoreCorrupt
from agentflow.exec.checkpoints._records import Lease

#: Take the lease where it is free, lapsed or already this token's; leave a live holder's row alone.
_TAKE: Final = (
    "INSERT INTO leases (run_id, owner, token, expires_at) VALUES (:run_id, :owner, :token, :now + :ttl) "
    "ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner, token = excluded.token, "
    "expires_at = excluded.expires_at WHERE leases.expires_at <= :now OR leases.token = excluded.token"
)
_RENEW: Final = (
    "UPDATE leases SET expires_at = :now + :ttl WHERE run_id = :run_id AND token = :token AND expires_at > :now"
)
_READ: Final = "SELECT run_id, owner, token, expires_at FROM leases"
#: How many run ids one `read` statement asks for (older SQLite allows 999 parameters).
_CHUNK: Final = 500


def _lease(row: Sequence[Any], path: Path) -> Lease:
    """Rebuild a lease row, checking each column's type (SQLite columns take values of any type)."""
    run_id, owner, token, expires_at = row
    for column, value, kind in (("owner", owner, str), ("token", token, str), ("expires_at", expires_at, float)):
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            continue
        if not isinstance(value, kind):
            found = "NULL" if value is None else type(value).__name__
            raise CheckpointStoreCorrupt(f"lease row of run {run_id!r} in {path}: column {column} holds {found}")
    return Lease(run_id, owner, token, float(expires_at))


def _row(conn: sqlite3.Connection, run_id: str, path: Path) -> Lease | None:
    row = conn.execute(f"{_READ} WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else _lease(row, path)


def take(run_id: str, owner: str, token: str, ttl_s: float, path: Path, conn: sqlite3.Connection) -> Lease:
    """Take the lease unless another live token holds it; return the lease as it stands. In the write transaction."""
    conn.execute(_TAKE, {"run_id": run_id, "owner": owner, "token": token, "now": time.time(), "ttl": ttl_s})
    lease = _row(conn, run_id, path)
    if lease is None:
        raise CheckpointStoreCorrupt(f"{path}: the lease of run {run_id!r} was written but cannot be read back")
    return lease


def renew(run_id: str, token: str, ttl_s: float, path: Path, conn: sqlite3.Connection) -> Lease | None:
    """Push the lease's expiry if `token` holds it live; None if it does not. In the write transaction."""
    cursor = conn.execute(_RENEW, {"run_id": run_id, "token": token, "now": time.time(), "ttl": ttl_s})
    return _row(conn, run_id, path) if cursor.rowcount else None


def release(run_id: str, token: str, conn: sqlite3.Connection) -> bool:
    """Delete `token`'s row of the run; return whether it was live. In the write transaction."""
    now = time.time()
    live = conn.execute(
        "DELETE FROM leases WHERE run_id = ? AND token = ? AND expires_at > ?", (run_id, token, now)
    ).rowcount
    conn.execute("DELETE FROM leases WHERE run_id = ? AND token = ?", (run_id, token))  # a lapsed one of its own
    return live > 0


def read(run_ids: Sequence[str], path: Path, conn: sqlite3.Connection) -> dict[str, Lease]:
    """The live leases among `run_ids`, a chunk of ids per statement."""
    now = time.time()
    found: dict[str, Lease] = {}
    unique = list(dict.fromkeys(run_ids))
    for start in range(0, len(unique), _CHUNK):
        chunk = unique[start : start + _CHUNK]
        marks = ", ".join("?" * len(chunk))
        rows = conn.execute(f"{_READ} WHERE run_id IN ({marks}) AND expires_at > ?", (*chunk, now)).fetchall()
        found.update((lease.run_id, lease) for lease in (_lease(row, path) for row in rows))
    return {run_id: found[run_id] for run_id in unique if run_id in found}
