"""Retention of `SQLiteCheckpointStore`: the statements that find finished runs, delete them or trim them.

A run qualifies when its ``runs`` row points at its newest checkpoint row, that row ended
with one of the chosen statuses before the cut-off, and no live lease (``expires_at`` past
the host's clock) holds the run. The ``runs`` row is only the way in (its ``saved_at``
index finds old runs quickly); what is judged is the newest checkpoint row, as the rules
judge saves. A run the listing forgot (no ``runs`` row) is not found, and not pruned.
Given the rows the caller judged (`JudgedRows`), a prune or trim also takes a run only
while that newest row (no row of a higher step after it: the table's max(step) row) has
the judged step and signature, read in the same write transaction as the delete: a save
that came after the judgement added another row, and the run stays, whatever the
columns in clear say. In that transaction too, nothing may lie beyond that row
(`rules.nothing_beyond`): no live cancel request in ``markers``, and no record in
``calls`` the row does not account for (a segment newer than its own, or more records in
a segment than it counted). A run whose later rows were moved out of the way by an
``UPDATE`` (its steps set back, its ``runs`` row pointed at an older row) still has its
later segment's records, so it stays, and is reported.

`prune` is one job for the store's write transaction (``BEGIN IMMEDIATE``): it judges the
runs asked for and deletes those that qualify from ``checkpoints``, ``calls``, ``leases``,
``runs`` and ``events``, all in that one transaction. No other connection writes meanwhile (so no
lease is taken and no save made under it: holding the write lock is holding every lease),
readers see the run before or after it, and a process killed midway leaves the
transaction rolled back: every run whole or gone, never a part.

`trim` is a job for the same transaction: it judges the runs asked for as a prune would,
and also that the run is not a tool loop (`rules.trims`) and still has a checkpoint row
older than its newest; then it deletes those older rows, and nothing else. A trim killed
midway leaves every run trimmed or untouched.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Final

from agentflow.exec.checkpoints.records import JudgedRow
from agentflow.exec.checkpoints.rules import UNTRIMMED_PREFIX, live_marker_keys, nothing_beyond

#: The runs a prune may take: ``{marks}`` is one ``?`` per status; then before, before, now. With each run's
#: newest checkpoint row's step and signature, to compare with the row the caller judged.
_QUALIFY: Final = """
    SELECT r.run_id, r.saved_at, c.step, c.sig, c.segment
    FROM runs AS r JOIN checkpoints AS c ON c.run_id = r.run_id AND c.step = r.step
    WHERE c.status IN ({marks}) AND r.saved_at < ? AND c.saved_at < ?
      AND NOT EXISTS (SELECT 1 FROM checkpoints AS n WHERE n.run_id = r.run_id AND n.step > r.step)
      AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.run_id = r.run_id AND l.expires_at > ?)
"""
#: What a trim adds: not a tool loop (the newest row's flow; then the prefix's length and the prefix), and an
#: older checkpoint row kept.
_TRIMS: Final = """
      AND substr(c.flow, 1, ?) <> ?
      AND EXISTS (SELECT 1 FROM checkpoints AS o WHERE o.run_id = r.run_id AND o.step < r.step)
"""
#: Deletes every checkpoint row of the runs (``{marks}``) older than the one their ``runs`` row names.
_TRIM: Final = """
    DELETE FROM checkpoints WHERE run_id IN ({marks})
      AND step < (SELECT r.step FROM runs AS r WHERE r.run_id = checkpoints.run_id)
"""
#: The records each segment of the runs (``{marks}``) holds.
_COUNTS: Final = "SELECT run_id, segment, COUNT(*) FROM calls WHERE run_id IN ({marks}) GROUP BY run_id, segment"
#: Which of the markers (``{marks}``: keys) are live at the time given last.
_LIVE: Final = "SELECT key FROM markers WHERE key IN ({marks}) AND expires_at > ?"
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
    run_ids: Sequence[str],
    before: float,
    statuses: Sequence[str],
    judged: dict[str, JudgedRow] | None,
    conn: sqlite3.Connection,
) -> tuple[list[str], int, list[tuple[str, str]]]:
    """Delete the runs of `run_ids` that qualify, whole, in the write transaction.

    Returns them, their row count, and the runs left with a problem (`rules.beyond_judged`).
    """
    unique = list(dict.fromkeys(run_ids))
    problems: list[tuple[str, str]] = []
    chosen = _chosen(_qualify(statuses), (*statuses, before, before, time.time()), unique, judged, conn, problems)
    pruned = [run_id for run_id in unique if run_id in chosen]
    rows = 0
    for start in range(0, len(pruned), _CHUNK):
        chunk = pruned[start : start + _CHUNK]
        marks = ", ".join("?" * len(chunk))
        for table in _TABLES:
            deleted = conn.execute(f"DELETE FROM {table} WHERE run_id IN ({marks})", chunk).rowcount
            rows += deleted if table in _TABLES[:2] else 0
    return pruned, rows, problems


def _chosen(
    sql: str,
    params: tuple[object, ...],
    run_ids: list[str],
    judged: dict[str, JudgedRow] | None,
    conn: sqlite3.Connection,
    problems: list[tuple[str, str]],
) -> set[str]:
    """The runs of `run_ids` that `sql` (a qualifying select given `params`) still takes, at the rows `judged`.

    With nothing beyond them either (`rules.nothing_beyond`): the call log's counts and the
    live markers are read in this transaction; a run left with a problem goes to `problems`.
    """
    asked = [run_id for run_id in run_ids if judged is None or run_id in judged]
    chosen: set[str] = set()
    now = time.time()
    for start in range(0, len(asked), _CHUNK):
        chunk = asked[start : start + _CHUNK]
        marks = ", ".join("?" * len(chunk))
        newest = {
            str(r[0]): (int(r[2]), str(r[3]), int(r[4]))
            for r in conn.execute(sql + f" AND r.run_id IN ({marks})", (*params, *chunk))
        }
        counts: dict[str, dict[int, int]] = {}
        for run_id, segment, n in conn.execute(_COUNTS.format(marks=marks), chunk):
            counts.setdefault(str(run_id), {})[int(segment)] = int(n)
        keys = [key for run_id in newest for key in live_marker_keys(run_id)]
        live = {str(k).partition("/")[2] for k in _rows(conn, _LIVE, keys, now)}
        for run_id, row in newest.items():
            if nothing_beyond(judged, run_id, row, counts.get(run_id, {}), run_id in live, problems):
                chosen.add(run_id)
    return chosen


def _rows(conn: sqlite3.Connection, sql: str, keys: list[str], *after: object) -> list[object]:
    """The first column of `sql` (``{marks}``: one ``?`` per key, then `after`) over `keys`, a chunk at a time."""
    found: list[object] = []
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start : start + _CHUNK]
        found += [row[0] for row in conn.execute(sql.format(marks=", ".join("?" * len(chunk))), (*chunk, *after))]
    return found


def trimmable(
    before: float, statuses: Sequence[str], limit: int, since: float | None, conn: sqlite3.Connection
) -> list[tuple[str, float]]:
    """The runs a trim would take now, ``(run_id, saved_at)`` oldest first (a read: no transaction needed)."""
    sql = _qualify(statuses) + _TRIMS + ("" if since is None else " AND r.saved_at >= ?")
    sql += " ORDER BY r.saved_at, r.run_id LIMIT ?"
    params = (*statuses, before, before, time.time(), len(UNTRIMMED_PREFIX), UNTRIMMED_PREFIX)
    rows = conn.execute(sql, (*params, *(() if since is None else (since,)), max(limit, 0))).fetchall()
    return [(str(row[0]), float(row[1])) for row in rows]


def trim(
    run_ids: Sequence[str],
    before: float,
    statuses: Sequence[str],
    judged: dict[str, JudgedRow] | None,
    conn: sqlite3.Connection,
) -> tuple[list[str], int, list[tuple[str, str]]]:
    """Delete the older checkpoints of the runs that qualify, in the write lock.

    Returns them, the rows deleted, and the runs left with a problem (`rules.beyond_judged`).
    """
    unique = list(dict.fromkeys(run_ids))
    problems: list[tuple[str, str]] = []
    params = (*statuses, before, before, time.time(), len(UNTRIMMED_PREFIX), UNTRIMMED_PREFIX)
    chosen = _chosen(_qualify(statuses) + _TRIMS, params, unique, judged, conn, problems)
    trimmed = [run_id for run_id in unique if run_id in chosen]
    rows = 0
    for start in range(0, len(trimmed), _CHUNK):
        chunk = trimmed[start : start + _CHUNK]
        rows += conn.execute(_TRIM.format(marks=", ".join("?" * len(chunk))), chunk).rowcount
    return trimmed, rows, problems
