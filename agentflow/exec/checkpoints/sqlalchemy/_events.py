"""The event streams of `SQLAlchemyCheckpointStore`: one ``events`` table, its id the cursor.

The id is assigned by the database in insert order (``AUTOINCREMENT`` on SQLite, so ids
are never reused; an identity sequence on PostgreSQL). A reader reads ``id > cursor``, so
ids must also reach it in commit order: on PostgreSQL an append first takes a transaction
advisory lock on the run, held until it commits, so two writers of one run (a handoff)
commit their events one after the other; SQLite writes one transaction at a time anyway.
Each append then trims the run to its newest `EVENTS_KEPT`, in the same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import sqlalchemy as sa

from agentflow._errors import CheckpointStoreCorrupt
from agentflow.exec.checkpoints.records import EVENTS_KEPT, SealedEvent, StoredEvent
from agentflow.exec.checkpoints.sqlalchemy._leases import Transaction

#: The advisory-lock namespace of event appends (any fixed number; it keys ``pg_advisory_xact_lock``).
_LOCK_SPACE: Final = 0x61665F65


class SQLEvents:
    """The event-stream statements of one store's ``events`` table."""

    def __init__(self, t: sa.Table, *, sqlite: bool, tx: Transaction, shown: str) -> None:
        self._tx = tx
        self._shown = shown
        run_id: sa.BindParameter[str] = sa.bindparam("run_id")
        self._lock = None if sqlite else sa.select(sa.func.pg_advisory_xact_lock(_LOCK_SPACE, sa.func.hashtext(run_id)))
        self._insert = sa.insert(t).values(
            run_id=sa.bindparam("run_id"),
            payload=sa.bindparam("payload"),
            kid=sa.bindparam("kid"),
            sig=sa.bindparam("sig"),
        )
        newest_dropped = (
            sa.select(t.c.id).where(t.c.run_id == run_id).order_by(t.c.id.desc()).offset(EVENTS_KEPT).limit(1)
        ).scalar_subquery()
        self._trim = sa.delete(t).where(t.c.run_id == run_id, t.c.id <= newest_dropped)
        self._read = (
            sa.select(t.c.id, t.c.payload, t.c.kid, t.c.sig)
            .where(t.c.run_id == run_id, t.c.id > sa.bindparam("after", type_=sa.BigInteger))
            .order_by(t.c.id)
            .limit(sa.bindparam("limit", type_=sa.Integer))
        )

    async def append(self, run_id: str, events: Sequence[SealedEvent]) -> None:
        """Insert `events` in order, then drop the run's oldest beyond `EVENTS_KEPT`, in one transaction."""
        rows: list[dict[str, Any]] = [
            {"run_id": run_id, "payload": e.payload, "kid": e.kid, "sig": e.sig} for e in events
        ]
        async with self._tx(write=True) as conn:
            if self._lock is not None:
                await conn.execute(self._lock, {"run_id": run_id})
            await conn.execute(self._insert, rows)  # an executemany: rows inserted, and numbered, in list order
            await conn.execute(self._trim, {"run_id": run_id})

    async def read(self, run_id: str, after: int, limit: int) -> list[StoredEvent]:
        """The run's events whose id is above `after`, oldest first.

        Raises:
            CheckpointStoreCorrupt: a row is not as the store wrote it.
        """
        async with self._tx() as conn:
            rows = (await conn.execute(self._read, {"run_id": run_id, "after": after, "limit": max(limit, 0)})).all()
        found = []
        for number, payload, kid, sig in rows:
            if not (
                isinstance(number, int) and isinstance(payload, bytes) and isinstance(kid, str) and isinstance(sig, str)
            ):
                raise CheckpointStoreCorrupt(f"{self._shown}: event row {number!r} of run {run_id!r} is not as written")
            found.append(StoredEvent(str(number), SealedEvent(run_id, payload, kid, sig)))
        return found
