"""The run leases of `SQLAlchemyCheckpointStore`: the ``<prefix>leases`` table and its statements.

One row per run that is or was held: ``run_id`` (primary key), ``owner``, ``token``,
``expires_at`` (seconds since the epoch). A row whose ``expires_at`` is past the clock is a
lapsed lease: free, whatever it still says, until the next take overwrites it.

The clock: on PostgreSQL the server's (``extract(epoch from clock_timestamp())``, evaluated
inside each statement), so workers on hosts with skewed clocks agree; on SQLite, every
process shares the host, and ``time.time()`` is passed in as ``:now``.

- take: one upsert, the dialect's ``INSERT ... ON CONFLICT (run_id) DO UPDATE SET owner,
  token, expires_at ... WHERE <prefix>leases.expires_at <= now OR <prefix>leases.token =
  excluded.token``, then the row read back in the same transaction. PostgreSQL decides
  racing inserts of a free lease at the primary key, and locks the conflicting row before
  it evaluates the WHERE, so the read-back (a fresh snapshot under read committed) sees
  either this take's row or the live holder's, which no one can change until the commit.
  SQLite runs the transaction under its write lock (``BEGIN IMMEDIATE``).
- renew: an UPDATE of this token's live row, then the row read back.
- release: a DELETE of this token's live row (whether it was live), then one of a lapsed
  row of its own.
- leases: one SELECT of the live rows per chunk of run ids.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from agentflow._errors import CheckpointStoreCorrupt
from agentflow.exec.checkpoints._records import Lease
from agentflow.exec.checkpoints._rules import check_lease_args
from agentflow.exec.checkpoints._sql_rows import lease as lease_of

#: How many run ids one `leases` read asks for.
_CHUNK: Final = 500

#: Opens one transaction on the store's database (`SQLAlchemyCheckpointStore._tx`).
Transaction = Callable[..., AbstractAsyncContextManager[AsyncConnection]]


@dataclass(frozen=True, slots=True)
class _Statements:
    """The lease statements, with the parameters each takes.

    None is named after a column (``run``, ``held``): an UPDATE would take a parameter
    named after a column it does not set as a value for it.
    """

    take: sa.Insert  # run, owner, held, ttl (+ now on SQLite)
    read_one: sa.Select[Any]  # run: the run's row, live or not
    renew: sa.Update  # run, held, ttl (+ now)
    release_live: sa.Delete  # run, held (+ now)
    release_any: sa.Delete  # run, held
    read_live: sa.Select[Any]  # runs (a list), (+ now)


def _statements(t: sa.Table, sqlite: bool) -> _Statements:
    clock: sa.ColumnElement[float] = (
        sa.bindparam("now", type_=sa.Double)
        if sqlite
        else sa.cast(sa.extract("epoch", sa.func.clock_timestamp()), sa.Double)
    )
    run: sa.BindParameter[str] = sa.bindparam("run", type_=sa.Text)
    held: sa.BindParameter[str] = sa.bindparam("held", type_=sa.Text)
    until = clock + sa.bindparam("ttl", type_=sa.Double)
    insert = (sqlite_insert if sqlite else pg_insert)(t).values(
        run_id=run, owner=sa.bindparam("owner", type_=sa.Text), token=held, expires_at=until
    )
    take = insert.on_conflict_do_update(
        index_elements=[t.c.run_id],
        set_={"owner": insert.excluded.owner, "token": insert.excluded.token, "expires_at": insert.excluded.expires_at},
        where=(t.c.expires_at <= clock) | (t.c.token == insert.excluded.token),
    )
    mine = (t.c.run_id == run) & (t.c.token == held)
    columns = (t.c.run_id, t.c.owner, t.c.token, t.c.expires_at)
    return _Statements(
        take=take,
        read_one=sa.select(*columns).where(t.c.run_id == run),
        renew=sa.update(t).where(mine, t.c.expires_at > clock).values(expires_at=until),
        release_live=sa.delete(t).where(mine, t.c.expires_at > clock),
        release_any=sa.delete(t).where(mine),
        read_live=sa.select(*columns).where(
            t.c.run_id.in_(sa.bindparam("runs", expanding=True)), t.c.expires_at > clock
        ),
    )


class SQLLeases:
    """The leases of one store: `tx` opens its transactions, `table` is its ``leases`` table."""

    def __init__(self, table: sa.Table, *, sqlite: bool, tx: Transaction, shown: str) -> None:
        self._q = _statements(table, sqlite)
        self._sqlite = sqlite
        self._tx = tx
        self._shown = shown

    def params(self, **values: Any) -> dict[str, Any]:
        """`values`, with the host's clock as ``now`` on SQLite (PostgreSQL reads its own)."""
        return values | {"now": time.time()} if self._sqlite else values

    def _lease(self, row: sa.Row[Any]) -> Lease:
        """Rebuild a lease row, checking its types (SQLite columns take values of any type)."""
        return lease_of(row, self._shown)

    async def take(self, run_id: str, owner: str, token: str, ttl_s: float) -> Lease:
        """Take the lease unless another live token holds it; return the lease as it stands."""
        check_lease_args(owner, token, ttl_s)
        async with self._tx(write=True) as conn:
            await conn.execute(self._q.take, self.params(run=run_id, owner=owner, held=token, ttl=ttl_s))
            row = (await conn.execute(self._q.read_one, {"run": run_id})).one_or_none()
        if row is None:
            raise CheckpointStoreCorrupt(f"{self._shown}: the lease of run {run_id!r} was taken but cannot be read")
        return self._lease(row)

    async def take_many(
        self, conn: AsyncConnection, run_ids: Sequence[str], owner: str, token: str, ttl_s: float
    ) -> None:
        """Take the leases of `run_ids` for `token` in the caller's transaction (a prune's), where free or lapsed."""
        check_lease_args(owner, token, ttl_s)
        rows = [self.params(run=run_id, owner=owner, held=token, ttl=ttl_s) for run_id in run_ids]
        if rows:
            await conn.execute(self._q.take, rows)

    async def renew(self, run_id: str, token: str, ttl_s: float) -> Lease | None:
        """Push the lease's expiry if `token` holds it live; None if it does not."""
        async with self._tx(write=True) as conn:
            renewed = await conn.execute(self._q.renew, self.params(run=run_id, held=token, ttl=ttl_s))
            if not renewed.rowcount:
                return None
            row = (await conn.execute(self._q.read_one, {"run": run_id})).one()
        return self._lease(row)

    async def release(self, run_id: str, token: str) -> bool:
        """Delete `token`'s lease of the run; return whether it was live."""
        async with self._tx(write=True) as conn:
            live = await conn.execute(self._q.release_live, self.params(run=run_id, held=token))
            await conn.execute(self._q.release_any, {"run": run_id, "held": token})
        return bool(live.rowcount)

    async def read(self, run_ids: Sequence[str]) -> dict[str, Lease]:
        """The live leases among `run_ids`, in their order."""
        unique = list(dict.fromkeys(run_ids))
        found: dict[str, Lease] = {}
        for start in range(0, len(unique), _CHUNK):
            async with self._tx() as conn:
                rows = await conn.execute(self._q.read_live, self.params(runs=unique[start : start + _CHUNK]))
                found.update((lease.run_id, lease) for lease in map(self._lease, rows.all()))
        return {run_id: found[run_id] for run_id in unique if run_id in found}
