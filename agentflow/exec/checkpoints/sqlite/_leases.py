"""The run leases of `SQLiteCheckpointStore`, and the statements every table of expiring rows shares.

One row per run that is or was held (schema version 2 in `sqlite.file.MIGRATIONS`)::

    leases (run_id TEXT PRIMARY KEY, owner TEXT, token TEXT, expires_at REAL)

The markers (`sqlite._markers`) keep the same layout in a table of their own (a key, a
value, ``token``, ``expires_at``), so both go through `Expiring`, under the same rules:

Every process sharing the file runs on the same host, so expiry is judged against that
host's ``time.time()``, read inside the job, after the write lock is held. A row whose
``expires_at`` is not past ``now`` is live; a lapsed row stays until the next take (or
put) overwrites it, and nothing reads it as held.

Each write is a job for the store's write transaction (`sqlite.file.in_immediate`, ``BEGIN
IMMEDIATE``), so no other connection to the file writes between its statements:

- take (`Expiring.put`): one upsert that writes only where the row is free, lapsed or
  this token's, then the row read back: this token's if the upsert wrote, else the live
  holder's, unchanged. Of racing takers, the first to get the write lock wins; each later
  one finds a live row of another token and reads it back.
- renew (leases only): an UPDATE of the live row of this token, then the row read back.
- release (`Expiring.drop`): a DELETE of this token's row; it says whether the row was
  still live.
- move (`move`, leases only): the lease moved in the transaction of a record or a save
  (`LeaseMoving`): the row read and judged, then written for the new token or deleted.

Reads (`Expiring.live`) need no transaction. Every row read is checked for type (SQLite
columns take values of any type): a mismatch is `CheckpointStoreCorrupt` naming the row's
key and the column. No statement uses ``RETURNING``, so SQLite 3.24 (the first with
upserts) is enough.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, Generic, TypeVar

from agentflow._errors import CheckpointStoreCorrupt
from agentflow.exec.checkpoints.records import Lease, LeaseMove
from agentflow.exec.checkpoints.rules import check_lease_move

_T = TypeVar("_T")

#: How many keys one `Expiring.live` statement asks for (older SQLite allows 999 parameters).
_CHUNK: Final = 500


class Expiring(Generic[_T]):
    """A table of rows each holding a key for a token until it lapses: the key, a value, ``token``, ``expires_at``.

    Args:
        table: the table's name.
        key: its primary-key column.
        value: the column of what the row says (a lease's owner, a marker's value).
        make: builds the record from a row's four values, in column order.
        noun: names a row in errors, before its key (``lease of run``, ``marker``).
    """

    __slots__ = ("_drop_any", "_drop_live", "_live", "_make", "_noun", "_one", "_set", "_value")

    def __init__(self, table: str, key: str, value: str, make: Callable[[str, str, str, float], _T], noun: str) -> None:
        self._value = value
        self._make: Callable[[str, str, str, float], _T] = make
        self._noun = noun
        self._set = (
            f"INSERT INTO {table} ({key}, {value}, token, expires_at) VALUES (:id, :what, :token, :now + :ttl) "
            f"ON CONFLICT ({key}) DO UPDATE SET {value} = excluded.{value}, token = excluded.token, "
            f"expires_at = excluded.expires_at WHERE {table}.expires_at <= :now OR {table}.token = excluded.token"
        )
        read = f"SELECT {key}, {value}, token, expires_at FROM {table} WHERE"
        self._one = f"{read} {key} = ?"
        self._live = f"{read} expires_at > ? AND {key} IN "
        self._drop_live = f"DELETE FROM {table} WHERE {key} = ? AND token = ? AND expires_at > ?"
        self._drop_any = f"DELETE FROM {table} WHERE {key} = ? AND token = ?"

    def checked(self, row: Sequence[Any], path: Path) -> _T:
        """Rebuild a row read from `path`, checking each column's type (an int is taken as a float expiry)."""
        key, value, token, expires_at = row
        for column, found, kind in (
            (self._value, value, str),
            ("token", token, str),
            ("expires_at", expires_at, float),
        ):
            if kind is float and isinstance(found, int) and not isinstance(found, bool):
                continue
            if not isinstance(found, kind):
                shown = "NULL" if found is None else type(found).__name__
                raise CheckpointStoreCorrupt(f"{self._noun} {key!r} in {path}: column {column} holds {shown}")
        return self._make(key, value, token, float(expires_at))

    def put(self, key: str, value: str, token: str, ttl_s: float, path: Path, conn: sqlite3.Connection) -> _T:
        """Set the row unless another live token holds it; return the row as it stands. In the write transaction."""
        conn.execute(self._set, {"id": key, "what": value, "token": token, "now": time.time(), "ttl": ttl_s})
        held = self.get(key, path, conn)
        if held is None:
            raise CheckpointStoreCorrupt(f"{path}: the {self._noun} {key!r} was written but cannot be read back")
        return held

    def get(self, key: str, path: Path, conn: sqlite3.Connection) -> _T | None:
        """The row of `key`, live or lapsed, or None if there is none."""
        row = conn.execute(self._one, (key,)).fetchone()
        return None if row is None else self.checked(row, path)

    def drop(self, key: str, token: str, conn: sqlite3.Connection) -> bool:
        """Delete `token`'s row of `key`, live or lapsed; return whether it was live. In the write transaction."""
        live = conn.execute(self._drop_live, (key, token, time.time())).rowcount
        conn.execute(self._drop_any, (key, token))  # a lapsed one of its own
        return live > 0

    def live(self, keys: Sequence[str], path: Path, conn: sqlite3.Connection) -> dict[str, _T]:
        """The live rows among `keys`, in the order of `keys`, a chunk of keys per statement."""
        now = time.time()
        found: dict[str, _T] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), _CHUNK):
            chunk = unique[start : start + _CHUNK]
            rows = conn.execute(f"{self._live}({', '.join('?' * len(chunk))})", (now, *chunk)).fetchall()
            found.update((row[0], self.checked(row, path)) for row in rows)
        return {key: found[key] for key in unique if key in found}


#: The leases table.
LEASES: Final = Expiring("leases", "run_id", "owner", Lease, "lease of run")
_RENEW: Final = (
    "UPDATE leases SET expires_at = :now + :ttl WHERE run_id = :run_id AND token = :token AND expires_at > :now"
)


_HAND: Final = (
    "INSERT INTO leases (run_id, owner, token, expires_at) VALUES (:run_id, :owner, :token, :now + :ttl) "
    "ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner, token = excluded.token, "
    "expires_at = excluded.expires_at"
)


def move(run_id: str, change: LeaseMove, path: Path, conn: sqlite3.Connection) -> None:
    """Move the lease as `change` says (`LeaseMove`), or raise `RunHeld`. In the write transaction, before its rows."""
    held = LEASES.get(run_id, path, conn)
    now = time.time()
    check_lease_move(run_id, change, held if held is not None and held.expires_at > now else None)
    if change.to is None:
        conn.execute("DELETE FROM leases WHERE run_id = ?", (run_id,))
    else:
        values = {"run_id": run_id, "owner": change.owner, "token": change.to, "now": now, "ttl": change.ttl_s}
        conn.execute(_HAND, values)


def take(run_id: str, owner: str, token: str, ttl_s: float, path: Path, conn: sqlite3.Connection) -> Lease:
    """Take the lease unless another live token holds it; return the lease as it stands. In the write transaction."""
    return LEASES.put(run_id, owner, token, ttl_s, path, conn)


def renew(run_id: str, token: str, ttl_s: float, path: Path, conn: sqlite3.Connection) -> Lease | None:
    """Push the lease's expiry if `token` holds it live; None if it does not. In the write transaction."""
    cursor = conn.execute(_RENEW, {"run_id": run_id, "token": token, "now": time.time(), "ttl": ttl_s})
    return LEASES.get(run_id, path, conn) if cursor.rowcount else None


def release(run_id: str, token: str, conn: sqlite3.Connection) -> bool:
    """Delete `token`'s row of the run; return whether it was live. In the write transaction."""
    return LEASES.drop(run_id, token, conn)


def read(run_ids: Sequence[str], path: Path, conn: sqlite3.Connection) -> dict[str, Lease]:
    """The live leases among `run_ids`, a chunk of ids per statement."""
    return LEASES.live(run_ids, path, conn)
