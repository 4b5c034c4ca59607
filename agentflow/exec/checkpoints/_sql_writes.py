"""The writes of `SQLAlchemyCheckpointStore` on SQLite: each save or call record one transaction.

Each transaction takes SQLite's write lock first (``BEGIN IMMEDIATE``, `Connector.begin`),
then reads the run's ``runs`` row once, applies `_rules` in Python, and writes. A SQLite
transaction reads one snapshot, taken under the write lock, so what it reads stays true
until it commits. (PostgreSQL writes through `_sql_pg` instead, one round trip each.)

- record: the row with the segment's record count in one statement, then the INSERT.
- save: the row, then the INSERT (step 0) or UPDATE of ``runs`` and the checkpoint's
  INSERT. A step 0 reads, instead, one row saying whether the run has a ``runs`` row and
  whether any checkpoint or call row of it is stored: a run whose ``runs`` row went
  missing is refused, not started again over its old rows.
- save_after_calls: the row once (the lock keeps it unchanged), each record's count and
  INSERT, then the save's writes.

A duplicate key is a `CheckpointConflict`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from agentflow._errors import CheckpointConflict
from agentflow.exec.checkpoints._records import SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints._rules import check_call, check_no_stored_rows, check_save
from agentflow.exec.checkpoints._sql_leases import Transaction
from agentflow.exec.checkpoints._sql_statements import CALL_FIELDS, SAVE_FIELDS, Statements


async def insert(conn: AsyncConnection, statement: sa.Insert, values: dict[str, Any], taken: str) -> None:
    """Insert a row; a duplicate key means another writer got there first."""
    try:
        await conn.execute(statement, values)
    except IntegrityError:
        raise CheckpointConflict(f"{taken} was written by another writer at the same time") from None


class SQLWrites:
    """The save and record transactions of one store (`tx` opens them, `q` holds the statements)."""

    def __init__(self, q: Statements, tx: Transaction) -> None:
        self._q = q
        self._tx = tx

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        """Store a checkpoint (compare-and-set; see `CheckpointStore.save`)."""
        async with self._tx(write=True) as conn:
            if step == 0:
                first = (await conn.execute(self._q.read_first, {"run_id": run_id})).one()
                check_no_stored_rows(run_id, first.step is None and bool(first.stored))
                row = first if first.step is not None else None
            else:
                row = (await conn.execute(self._q.lock_run, {"run_id": run_id})).one_or_none()
            await self._save_in(conn, run_id, step, checkpoint, row)

    async def save_after_calls(
        self, run_id: str, step: int, checkpoint: SealedCheckpoint, calls: Sequence[SealedCall]
    ) -> None:
        """Append `calls` (at least one), then save `checkpoint`, in one transaction: all or nothing."""
        async with self._tx(write=True) as conn:
            first = calls[0].segment
            row, next_seq = await self._read_counted(conn, run_id, first)
            # Under the write lock only this transaction adds records, so a count moves by one per insert.
            counts = {first: next_seq}
            for record in calls:
                if record.segment not in counts:
                    counts[record.segment] = await self._count(conn, run_id, record.segment)
                await self._record_in(conn, run_id, record, row, counts[record.segment])
                counts[record.segment] += 1
            await self._save_in(conn, run_id, step, checkpoint, row)

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        """Append a call record (numbered and fenced; see `CheckpointStore.record_call`)."""
        async with self._tx(write=True) as conn:
            row, next_seq = await self._read_counted(conn, run_id, record.segment)
            await self._record_in(conn, run_id, record, row, next_seq)

    async def _read_counted(self, conn: AsyncConnection, run_id: str, segment: int) -> tuple[sa.Row[Any] | None, int]:
        """Read the run's row and the segment's record count in one statement (0 without a row)."""
        row = (await conn.execute(self._q.read_run_counted, {"run_id": run_id, "segment": segment})).one_or_none()
        return row, row.calls if row else 0

    async def _count(self, conn: AsyncConnection, run_id: str, segment: int) -> int:
        """How many records the segment holds."""
        count: int = (await conn.execute(self._q.count_calls, {"run_id": run_id, "segment": segment})).scalar_one()
        return count

    async def _save_in(
        self, conn: AsyncConnection, run_id: str, step: int, checkpoint: SealedCheckpoint, row: sa.Row[Any] | None
    ) -> None:
        """The compare-and-set and the writes of a save, given the run's row read under the lock.

        Without a row, the primary key of ``runs`` decides between two writers of step 0
        (the only step `check_save` lets through then).
        """
        check_save(run_id, step, checkpoint.flow, (row.step, row.flow, row.status) if row else None)
        values = {"run": run_id} | {f: getattr(checkpoint, f) for f in SAVE_FIELDS}
        taken = f"run {run_id!r} step {step}"
        if row is None:
            await insert(conn, self._q.insert_run, values, taken)
        else:
            await conn.execute(self._q.update_run, values)
        await insert(conn, self._q.insert_checkpoint, values, taken)

    async def _record_in(
        self, conn: AsyncConnection, run_id: str, record: SealedCall, row: sa.Row[Any] | None, next_seq: int
    ) -> None:
        """The numbering and fencing checks and the insert of a record, given the locked row and the count."""
        check_call(run_id, record, (row.step, row.status, row.segment) if row else None, next_seq)
        values = {f: getattr(record, f) for f in CALL_FIELDS}
        await insert(conn, self._q.insert_call, values, f"call record {record.segment}.{record.seq} of run {run_id!r}")
