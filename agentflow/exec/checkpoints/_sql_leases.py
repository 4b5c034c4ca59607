"""The run leases of `SQLAlchemyCheckpointStore`: the ``<prefix>leases`` table, and a prune's batched take.

One row per run that is or was held: ``run_id`` (primary key), ``owner``, ``token``,
``expires_at`` (seconds since the epoch). A row whose ``expires_at`` is past the clock is a
lapsed lease: free, whatever it still says, until the next take overwrites it.

The clock: on PostgreSQL the server's (``extract(epoch from clock_timestamp())``, evaluated
inside each statement), so workers on hosts with skewed clocks agree; on SQLite, every
process shares the host, and ``time.time()`` is passed in as ``:now``.

A worker's take, renewal and release run on each dialect's fast path (`_sql_pg`: the
``<prefix>take_lease`` function and single statements; `_sql_sqlite`: one ``BEGIN
IMMEDIATE`` job). What stays here is the take a prune makes of many runs inside its own
transaction: the dialect's upsert, ``INSERT ... ON CONFLICT (run_id) DO UPDATE SET owner,
token, expires_at ... WHERE <prefix>leases.expires_at <= now OR <prefix>leases.token =
excluded.token``, which takes a free or lapsed lease and leaves a live one alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from agentflow.exec.checkpoints._rules import check_lease_args

#: Opens one transaction on the store's database (`SQLAlchemyCheckpointStore._tx`).
Transaction = Callable[..., AbstractAsyncContextManager[AsyncConnection]]


def _take(t: sa.Table, sqlite: bool) -> sa.Insert:
    """The upsert that takes a free or lapsed lease (parameters: run, owner, held, ttl, and now on SQLite)."""
    clock: sa.ColumnElement[float] = (
        sa.bindparam("now", type_=sa.Double)
        if sqlite
        else sa.cast(sa.extract("epoch", sa.func.clock_timestamp()), sa.Double)
    )
    # None is named after a column: an UPDATE takes a parameter named after a column it does not set.
    insert = (sqlite_insert if sqlite else pg_insert)(t).values(
        run_id=sa.bindparam("run", type_=sa.Text),
        owner=sa.bindparam("owner", type_=sa.Text),
        token=sa.bindparam("held", type_=sa.Text),
        expires_at=clock + sa.bindparam("ttl", type_=sa.Double),
    )
    return insert.on_conflict_do_update(
        index_elements=[t.c.run_id],
        set_={"owner": insert.excluded.owner, "token": insert.excluded.token, "expires_at": insert.excluded.expires_at},
        where=(t.c.expires_at <= clock) | (t.c.token == insert.excluded.token),
    )


class SQLLeases:
    """The leases table's part of a prune: `take_many` in the prune's transaction."""

    def __init__(self, table: sa.Table, *, sqlite: bool) -> None:
        self._take = _take(table, sqlite)
        self._sqlite = sqlite

    def params(self, **values: Any) -> dict[str, Any]:
        """`values`, with the host's clock as ``now`` on SQLite (PostgreSQL reads its own)."""
        return values | {"now": time.time()} if self._sqlite else values

    async def take_many(
        self, conn: AsyncConnection, run_ids: Sequence[str], owner: str, token: str, ttl_s: float
    ) -> None:
        """Take the leases of `run_ids` for `token` in the caller's transaction (a prune's), where free or lapsed."""
        check_lease_args(owner, token, ttl_s)
        rows = [self.params(run=run_id, owner=owner, held=token, ttl=ttl_s) for run_id in run_ids]
        if rows:
            await conn.execute(self._take, rows)
