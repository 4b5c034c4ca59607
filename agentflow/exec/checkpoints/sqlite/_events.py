"""The event streams of `SQLiteCheckpointStore`: one ``events`` table, its id the cursor.

``id`` is ``AUTOINCREMENT``: never reused, even after the newest rows are deleted, so a
cursor a reader holds never comes to name a later event. An append inserts the events and
trims the run to its newest `EVENTS_KEPT`, in the store's write transaction; a read is one
``SELECT`` on the ``(run_id, id)`` index. Rows are checked for type like the store's others.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Final

from agentflow._errors import CheckpointStoreCorrupt
from agentflow.exec.checkpoints.records import EVENTS_KEPT, SealedEvent, StoredEvent

_INSERT: Final = "INSERT INTO events (run_id, payload, kid, sig) VALUES (?, ?, ?, ?)"
_TRIM: Final = """
    DELETE FROM events WHERE run_id = ? AND id <= (
        SELECT id FROM events WHERE run_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?
    )
"""
_READ: Final = "SELECT id, payload, kid, sig FROM events WHERE run_id = ? AND id > ? ORDER BY id LIMIT ?"


def append(run_id: str, events: Sequence[SealedEvent], conn: sqlite3.Connection) -> None:
    """Insert `events` in order, then drop the run's oldest beyond `EVENTS_KEPT`. In the write transaction."""
    conn.executemany(_INSERT, [(run_id, e.payload, e.kid, e.sig) for e in events])
    conn.execute(_TRIM, (run_id, run_id, EVENTS_KEPT))


def read(run_id: str, after: int, limit: int, conn: sqlite3.Connection, where: str) -> list[StoredEvent]:
    """The run's events whose id is above `after`, oldest first.

    Raises:
        CheckpointStoreCorrupt: a row is not as the store wrote it.
    """
    found = []
    for number, payload, kid, sig in conn.execute(_READ, (run_id, after, max(limit, 0))).fetchall():
        if not (
            isinstance(number, int) and isinstance(payload, bytes) and isinstance(kid, str) and isinstance(sig, str)
        ):
            raise CheckpointStoreCorrupt(f"event row {number!r} of run {run_id!r} in {where} is not as written")
        found.append(StoredEvent(str(number), SealedEvent(run_id, payload, kid, sig)))
    return found
