"""The rows of `SQLiteCheckpointStore`: their columns, type checks, and the writes run in its transactions.

Every function that takes a connection runs inside the store's ``BEGIN IMMEDIATE``
transaction (`sqlite.file.in_immediate`), so what it reads under the write lock stays true
until it commits. The rules read the ``checkpoints`` and ``calls`` rows, never ``runs``
(the listing entry, which a save writes in the same transaction and `relist` rewrites).
A value read back is checked against its column's type (SQLite columns take any type):
anything else is `CheckpointStoreCorrupt` naming the file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from agentflow._errors import CheckpointConflict, CheckpointStoreCorrupt
from agentflow.exec.checkpoints.records import SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints.rules import check_call, check_no_stored_rows, check_save

#: Columns of a checkpoint row, in `SealedCheckpoint` field order, and the type each must hold.
CHECKPOINT_COLUMNS: Final = ("run_id", "step", "flow", "status", "segment", "saved_at", "payload", "kid", "sig")
_CHECKPOINT_TYPES: Final = (str, int, str, str, int, float, bytes, str, str)
#: Columns of a call row, in `SealedCall` field order, and the type each must hold.
_CALL_COLUMNS: Final = ("run_id", "segment", "seq", "kind", "payload", "kid", "sig")
_CALL_TYPES: Final = (str, int, int, str, bytes, str, str)

SELECT_CHECKPOINT: Final = f"SELECT {', '.join(CHECKPOINT_COLUMNS)} FROM checkpoints"
SELECT_CALL: Final = f"SELECT {', '.join(_CALL_COLUMNS)} FROM calls"
LATEST_OF_RUN: Final = "WHERE run_id = ? ORDER BY step DESC LIMIT 1"
_INSERT_CHECKPOINT: Final = f"INSERT INTO checkpoints ({', '.join(CHECKPOINT_COLUMNS)}) VALUES (?,?,?,?,?,?,?,?,?)"
_INSERT_CALL: Final = f"INSERT INTO calls ({', '.join(_CALL_COLUMNS)}) VALUES (?,?,?,?,?,?,?)"
#: The listing entry (``runs`` row) of a run: what a save writes there, from its checkpoint's fields in clear.
_RUN_COLUMNS: Final = ("flow", "status", "step", "saved_at")
_WRITE_RUN: Final = f"INSERT OR REPLACE INTO runs (run_id, {', '.join(_RUN_COLUMNS)}) VALUES (?, ?, ?, ?, ?)"


def checked(row: Sequence[Any], columns: Sequence[str], types: Sequence[type], what: str) -> tuple[Any, ...]:
    """Return `row` as a tuple once each value has its column's type.

    Raises:
        CheckpointStoreCorrupt: a value is NULL or of another type; the message names `what`.
    """
    for column, value, expected in zip(columns, row, types, strict=True):
        if not isinstance(value, expected):
            found = "NULL" if value is None else type(value).__name__
            raise CheckpointStoreCorrupt(f"{what}: column {column} holds {found}, not {expected.__name__}")
    return tuple(row)


def checkpoint_of(row: Sequence[Any], path: Path) -> SealedCheckpoint:
    """A checkpoint row read from `path`, checked."""
    what = f"checkpoint row (run {row[0]!r}, step {row[1]!r}) in {path}"
    return SealedCheckpoint(*checked(row, CHECKPOINT_COLUMNS, _CHECKPOINT_TYPES, what))


def call_of(row: Sequence[Any], path: Path) -> SealedCall:
    """A call row read from `path`, checked."""
    what = f"call row (run {row[0]!r}, record {row[1]!r}.{row[2]!r}) in {path}"
    return SealedCall(*checked(row, _CALL_COLUMNS, _CALL_TYPES, what))


def insert_checkpoint(row: SealedCheckpoint, path: Path, conn: sqlite3.Connection) -> None:
    """Check the compare-and-set rule and insert `row`, with its listing entry."""
    last = conn.execute(f"SELECT step, flow, status FROM checkpoints {LATEST_OF_RUN}", (row.run_id,)).fetchone()
    if last is not None:
        what = f"latest checkpoint row of run {row.run_id!r} in {path}"
        last = checked(last, ("step", "flow", "status"), (int, str, str), what)
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


def insert_call(run_id: str, record: SealedCall, path: Path, conn: sqlite3.Connection) -> None:
    """Check numbering and fencing and insert `record`."""
    last = conn.execute(f"SELECT step, status, segment FROM checkpoints {LATEST_OF_RUN}", (run_id,)).fetchone()
    if last is not None:
        what = f"latest checkpoint row of run {run_id!r} in {path}"
        last = checked(last, ("step", "status", "segment"), (int, str, int), what)
    (count,) = conn.execute(
        "SELECT COUNT(*) FROM calls WHERE run_id = ? AND segment = ?", (run_id, record.segment)
    ).fetchone()
    check_call(run_id, record, last, count)
    values = (run_id, record.segment, record.seq, record.kind, record.payload, record.kid, record.sig)
    try:
        conn.execute(_INSERT_CALL, values)
    except sqlite3.IntegrityError as exc:
        taken = f"call record {record.segment}.{record.seq}"
        raise CheckpointConflict(f"run {run_id!r}: {taken} is already stored") from exc


def relist(run_id: str, path: Path, conn: sqlite3.Connection) -> SealedCheckpoint | None:
    """Rewrite the ``runs`` row if it differs from the newest checkpoint; return that checkpoint."""
    newest = conn.execute(f"{SELECT_CHECKPOINT} {LATEST_OF_RUN}", (run_id,)).fetchone()
    if newest is None:
        return None
    row = checkpoint_of(newest, path)
    entry = (row.flow, row.status, row.step, row.saved_at)
    listed = conn.execute(f"SELECT {', '.join(_RUN_COLUMNS)} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    if listed is None or tuple(listed) != entry:
        conn.execute(_WRITE_RUN, (run_id, *entry))
    return row
