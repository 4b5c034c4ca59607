"""The markers of `SQLiteCheckpointStore` (`MarkerStore`): the ``markers`` table, apart from the leases.

One row per key that is or was set (schema version 4 in `sqlite.file.MIGRATIONS`)::

    markers (key TEXT PRIMARY KEY, value TEXT, token TEXT, expires_at REAL)

A row whose ``expires_at`` is past ``now`` is a lapsed marker: free, whatever it still
says, until a put overwrites it or its token takes it. The table is the markers' alone: no
lease is read or written here, and a run's `delete` or prune leaves the markers named after it.

The rows have the leases' layout, so their statements and rules are `sqlite._leases.Expiring`'s:
expiry judged on the host's ``time.time()``, read inside the job; a write run as a job of
the store's write transaction (``BEGIN IMMEDIATE``), so of racing puts on a free key the
first to get the write lock sets it and each later one reads that live marker back:

- put: the upsert that writes where the key is free, lapsed or already this token's (value
  and expiry both replaced: a renewal), then the row read back.
- take: a DELETE of this token's row, live or lapsed; it says whether the row was live.
- peek: a SELECT of the live rows among the keys, a chunk of keys per statement (one
  statement for one key), with no transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from agentflow.exec.checkpoints.records import Marker
from agentflow.exec.checkpoints.sqlite._leases import Expiring

#: The markers table.
MARKERS: Final = Expiring("markers", "key", "value", Marker, "marker")


def put(key: str, value: str, token: str, ttl_s: float, path: Path, conn: sqlite3.Connection) -> Marker:
    """Set the marker unless another token's is live; return the marker as it stands. In the write transaction."""
    return MARKERS.put(key, value, token, ttl_s, path, conn)


def take(key: str, token: str, conn: sqlite3.Connection) -> bool:
    """Delete `token`'s marker of `key`, live or lapsed; return whether it was live. In the write transaction."""
    return MARKERS.drop(key, token, conn)


def peek(keys: Sequence[str], path: Path, conn: sqlite3.Connection) -> dict[str, Marker]:
    """The live markers among `keys`."""
    return MARKERS.live(keys, path, conn)
