"""Retention of `SQLiteCheckpointStore`: the statements that find and delete finished runs.

A run qualifies when its ``runs`` row points at its newest checkpoint row, that row ended
with one of the chosen statuses before the cut-off, and no live lease (``expires_at`` past
the host's clock) holds the run. The ``runs`` row is only the way in (its ``saved_at``
index finds old runs quickly); what is judged is the newest checkpoint row, as the rules
judge saves. A run the listing forgot (no ``runs`` row) is not found, and not pruned.

`prune` is one job for the store's write transaction (``BEGIN IMMEDIATE``): it judges the
runs asked for and deletes those that qualify from ``checkpoints``, ``calls``, ``leases``,
``runs`` and ``events``, all in that one transaction. No other connection writes meanwhile (so no
lease is taken and no save made under it: holding the write lock is holding every lease),
readers see the run before or after it, and a process killed midway leaves the
transaction rolled back: every run whole or gone, never a part.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Final

#: The runs a prune may take: ``{marks}`` is one ``?`` per status; then before, before, now.
_QUALIFY: Final = """
    SELECT r.run_id FROM runs AS r JOIN checkpoints AS c ON c.run_id = r.run_id AND c.step = r.step
    WHERE c.status IN ({marks}) AND r.saved_at < ? AND c.saved_at < ?
      AND NOT EXISTS (SELECT 1 FROM checkpoints AS n WHERE n.run_id = r.run_id AND n.step > r.step)
      AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = r.run_id AND l.expires_at > ?)
"""
#: Run ids per statement (older SQLite allows 999 parameters).
_CHUNK: Final = 400
#: The tables a run has rows in: the ones counted as its rows first.
_TABLES: Final = ("checkpoints", "calls", "leases", "runs", "events")


def _qualify(statuses: Sequence[str]) -> str:
    return _QUALIFY.format(marks=", ".join("?" * len(statuses)))


def prunable(before: float, statuses: Sequence[str], limit: int, conn: sqlite3.Connection) -> list[str]:
    """The runs a prune would take now, oldest first (a read: no transaction needed)."""
    sql = _qualify(statuses) + " ORDER BY r.saved_at LIMIT ?"
    rows = conn.execute(sql, (*statuses, before, before, time.time(), max(limit, 0))).fetchall()
    return [str(row[0]) for row in rows]


def prune(
    run_ids: Sequence[str], before: float, statuses: Sequence[str], conn: sqlite3.Connection
) -> tuple[list[str], int]:
    """Delete the runs of `run_ids` that qualify, whole; return them and their row count. In the write transaction."""
    unique = list(dict.fromkeys(run_ids))
    now = time.time()
    chosen: set[str] = set()
    for start in range(0, len(unique), _CHUNK):
        chunk = unique[start : start + _CHUNK]
        sql = _qualify(statuses) + f" AND r.run_id IN ({', '.join('?' * len(chunk))})"
        chosen.update(str(row[0]) for row in conn.execute(sql, (*statuses, before, before, now, *chunk)))
    pruned = [run_id for run_id in unique if run_id in chosen]
    rows = 0
    for start in range(0, len(pruned), _CHUNK):
        chunk = pruned[start : start + _CHUNK]
        marks = ", ".join("?" * len(chunk))
        for table in _TABLES:
            deleted = conn.execute(f"DELETE FROM {table} WHERE run_id IN ({marks})", chunk).rowcount
            rows += deleted if table in _TABLES[:2] else 0
    return pruned, rows
