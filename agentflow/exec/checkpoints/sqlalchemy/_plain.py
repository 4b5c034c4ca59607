"""The hot operations of `SQLAlchemyCheckpointStore` on SQLite, as plain SQLAlchemy transactions.

A save, a call record (or records then a save), a lease take, renewal or release, the live
leases, ``latest``, ``head`` and a peek at markers each open one transaction on a pooled
connection (`Connector.begin`) and run SQLAlchemy Core statements in it, as the store's
other operations do. Nothing here borrows the driver's connection: this is the portable
path, there for code that must run on SQLite and PostgreSQL alike. It is slower than
`SQLiteCheckpointStore` (every statement is a round trip to aiosqlite's thread), which is
the store to use for speed on one host. PostgreSQL takes its own one-round-trip path
(`sqlalchemy._pg`); the two answer the same calls.

A write is one ``BEGIN IMMEDIATE`` transaction (`Connector.begin` with ``write=True``):
the write lock first, then the run's ``runs`` row, `rules` applied in Python on what it
read, then the writes. Under the lock no other writer commits, so what the transaction
read stays true until it commits; a step 0 refuses to start over stored rows, two
writers of one step 0 meet at the primary key, and a duplicate key is `CheckpointConflict`.
A lease move (`LeaseMoving`) is judged first, in the same transaction: a refused move
writes nothing. Lease expiry is judged on the host's clock (`sqlalchemy._leases.clock`),
read once the write lock is held. Every commit waits for the disk as the connection's
``synchronous`` level says, lease commits included.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from agentflow._errors import CheckpointConflict
from agentflow.exec.checkpoints.records import LeaseMove, SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints.rules import (
    check_call,
    check_lease_args,
    check_lease_move,
    check_move_args,
    check_no_stored_rows,
    check_save,
)
from agentflow.exec.checkpoints.sqlalchemy._leases import Transaction, clock, upsert
from agentflow.exec.checkpoints.sqlalchemy._rows import lease as lease_of
from agentflow.exec.checkpoints.sqlalchemy._statements import CALL_FIELDS, SAVE_FIELDS, Statements, Tables

#: How many run ids or marker keys one read asks for (SQLite allows 32,766 parameters).
_CHUNK: Final = 500


async def _insert(conn: AsyncConnection, statement: sa.Insert, values: Mapping[str, Any], taken: str) -> None:
    """Insert a row; a duplicate key means another writer got there first."""
    try:
        await conn.execute(statement, values)
    except IntegrityError:
        raise CheckpointConflict(f"{taken} was written by another writer at the same time") from None


class PlainPath:
    """The hot operations of one store on SQLite, each one transaction of SQLAlchemy statements."""

    def __init__(self, t: Tables, q: Statements, tx: Transaction, shown: str) -> None:
        self._q = q
        self._tx = tx
        self._shown = shown
        runs, cps, calls, leases, markers = t.runs, t.checkpoints, t.calls, t.leases, t.markers
        run_id: sa.BindParameter[str] = sa.bindparam("run_id")
        key: sa.BindParameter[str] = sa.bindparam("id", type_=sa.Text)
        held: sa.BindParameter[str] = sa.bindparam("held", type_=sa.Text)
        now = clock(sqlite=True)
        self._run = sa.select(runs.c.step, runs.c.flow, runs.c.status, runs.c.segment).where(runs.c.run_id == run_id)
        self._stored = sa.select(
            sa.or_(sa.exists().where(cps.c.run_id == run_id), sa.exists().where(calls.c.run_id == run_id))
        )
        self._count = sa.select(sa.func.count()).where(
            calls.c.run_id == run_id, calls.c.segment == sa.bindparam("segment")
        )
        self._insert_call = sa.insert(calls).values({name: sa.bindparam(name) for name in CALL_FIELDS})
        self._insert_checkpoint = sa.insert(cps).values(
            {"run_id": sa.bindparam("run")} | {name: sa.bindparam(name) for name in SAVE_FIELDS}
        )
        self._latest = sa.select(cps).where(cps.c.run_id == run_id).order_by(cps.c.step.desc()).limit(1)
        self._counts = (
            sa.select(calls.c.segment, sa.func.count()).where(calls.c.run_id == run_id).group_by(calls.c.segment)
        )
        lease_row = sa.select(leases.c.run_id, leases.c.owner, leases.c.token, leases.c.expires_at)
        mine = (leases.c.run_id == key) & (leases.c.token == held)
        self._take = upsert(leases, key="run_id", value="owner", sqlite=True)
        self._lease = lease_row.where(leases.c.run_id == key)
        self._drop_lease = sa.delete(leases).where(leases.c.run_id == key)
        self._renew = (
            sa.update(leases)
            .where(mine, leases.c.expires_at > now)
            .values(expires_at=now + sa.bindparam("ttl", type_=sa.Double))
        )
        self._release_live = sa.delete(leases).where(mine, leases.c.expires_at > now)
        self._release_any = sa.delete(leases).where(mine)
        among: sa.BindParameter[list[str]] = sa.bindparam("ids", expanding=True)
        self._live_leases = lease_row.where(leases.c.run_id.in_(among), leases.c.expires_at > now)
        self._live_markers = sa.select(markers.c.key, markers.c.value, markers.c.token, markers.c.expires_at).where(
            markers.c.key.in_(among), markers.c.expires_at > now
        )

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
        async with self._tx(write=True) as conn:
            now = time.time()  # under the write lock: no other writer commits before this transaction does
            if move is not None:  # the lease's rule first: a refused move writes nothing
                found = (await conn.execute(self._lease, {"id": run_id})).one_or_none()
                held = None if found is None else lease_of(found, self._shown)
                check_lease_move(run_id, move, held if held is not None and held.expires_at > now else None)
            await self._write_rows(conn, run_id, step, checkpoint, calls)
            if move is not None:
                await conn.execute(self._drop_lease, {"id": run_id})
                if move.to is not None:
                    values = {"id": run_id, "what": move.owner, "held": move.to, "ttl": move.ttl_s, "now": now}
                    await conn.execute(self._take, values)

    async def _write_rows(
        self,
        conn: AsyncConnection,
        run_id: str,
        step: int | None,
        checkpoint: SealedCheckpoint | None,
        calls: Sequence[SealedCall],
    ) -> None:
        """The rules and the writes of `write`, in its transaction (which holds the write lock)."""
        row = (await conn.execute(self._run, {"run_id": run_id})).one_or_none()
        if not calls and step == 0 and row is None:  # a new run: none of its rows may be stored yet
            check_no_stored_rows(run_id, bool((await conn.execute(self._stored, {"run_id": run_id})).scalar_one()))
        counts: dict[int, int] = {}  # under the write lock only this transaction adds records
        for record in calls:
            segment = record.segment
            if segment not in counts:
                counts[segment] = (await conn.execute(self._count, {"run_id": run_id, "segment": segment})).scalar_one()
            check_call(run_id, record, None if row is None else (row.step, row.status, row.segment), counts[segment])
            taken = f"call record {record.segment}.{record.seq} of run {run_id!r}"
            await _insert(conn, self._insert_call, {name: getattr(record, name) for name in CALL_FIELDS}, taken)
            counts[segment] += 1
        if step is None or checkpoint is None:
            return
        check_save(run_id, step, checkpoint.flow, None if row is None else (row.step, row.flow, row.status))
        saved = {"run": run_id} | {name: getattr(checkpoint, name) for name in SAVE_FIELDS}
        taken = f"run {run_id!r} step {step}"
        if row is None:  # only a step 0 gets here: the primary key picks one of two writers
            await _insert(conn, self._q.insert_run, saved, taken)
        else:
            await conn.execute(self._q.update_run, saved)
        await _insert(conn, self._insert_checkpoint, saved, taken)

    # -- reads -------------------------------------------------------------------------

    async def latest(self, run_id: str) -> Mapping[str, Any] | None:
        """The run's newest checkpoint row, or None."""
        async with self._tx() as conn:
            row = (await conn.execute(self._latest, {"run_id": run_id})).one_or_none()
        return None if row is None else row._asdict()

    async def head(self, run_id: str) -> tuple[Mapping[str, Any] | None, dict[int, int]]:
        """The run's newest checkpoint row (or None) and its records per segment, read in one snapshot."""
        async with self._tx() as conn:
            row = (await conn.execute(self._latest, {"run_id": run_id})).one_or_none()
            counts = (await conn.execute(self._counts, {"run_id": run_id})).all()
        return (None if row is None else row._asdict()), {int(segment): int(n) for segment, n in counts}

    # -- leases and markers ------------------------------------------------------------

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Mapping[str, Any] | None:
        """Take the run's lease unless another live token holds it; the lease row as it stands."""
        check_lease_args(owner, token, ttl_s)
        async with self._tx(write=True) as conn:
            values = {"id": run_id, "what": owner, "held": token, "ttl": ttl_s, "now": time.time()}
            await conn.execute(self._take, values)
            row = (await conn.execute(self._lease, {"id": run_id})).one_or_none()
        return None if row is None else row._asdict()

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> Mapping[str, Any] | None:
        """Push the expiry of `token`'s live lease; the row, or None if it holds none."""
        async with self._tx(write=True) as conn:
            renewed = await conn.execute(self._renew, {"id": run_id, "held": token, "ttl": ttl_s, "now": time.time()})
            if not renewed.rowcount:
                return None
            row = (await conn.execute(self._lease, {"id": run_id})).one()
        return row._asdict()

    async def release_lease(self, run_id: str, token: str) -> bool:
        """Delete `token`'s lease of the run, live or lapsed; whether it was live."""
        async with self._tx(write=True) as conn:
            live = await conn.execute(self._release_live, {"id": run_id, "held": token, "now": time.time()})
            await conn.execute(self._release_any, {"id": run_id, "held": token})
        return bool(live.rowcount)

    async def leases(self, run_ids: Sequence[str]) -> Sequence[Mapping[str, Any]]:
        """The live lease rows among `run_ids` (each id once)."""
        return [row._asdict() for row in await self._live(self._live_leases, run_ids)]

    async def peek_markers(self, keys: Sequence[str]) -> Sequence[Sequence[Any]]:
        """The live marker rows (key, value, token, expires_at) among `keys` (each key once)."""
        return await self._live(self._live_markers, keys)

    async def _live(self, query: sa.Select[Any], ids: Sequence[str]) -> list[sa.Row[Any]]:
        """The rows `query` finds among `ids`, a chunk of ids per statement, all in one read transaction."""
        unique = list(dict.fromkeys(ids))
        if not unique:
            return []
        found: list[sa.Row[Any]] = []
        async with self._tx() as conn:
            now = time.time()
            for start in range(0, len(unique), _CHUNK):
                found += (await conn.execute(query, {"ids": unique[start : start + _CHUNK], "now": now})).all()
        return found
