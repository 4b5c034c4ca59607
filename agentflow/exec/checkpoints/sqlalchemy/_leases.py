"""The run leases of `SQLAlchemyCheckpointStore`: the ``<prefix>leases`` table, a prune's batched take, the clock.

One row per run that is or was held: ``run_id`` (primary key), ``owner``, ``token``,
``expires_at`` (seconds since the epoch). A row whose ``expires_at`` is past the clock is a
lapsed lease: free, whatever it still says, until the next take overwrites it.

The clock (`clock`, `with_now`): on PostgreSQL the server's (``extract(epoch from
clock_timestamp())``, evaluated inside each statement), so workers on hosts with skewed
clocks agree; on SQLite, every process shares the host, and ``time.time()`` is passed in
as ``:now``. The markers (`sqlalchemy._markers`) are judged on the same clock.

A worker's take, renewal and release run on each dialect's path for hot operations
(`sqlalchemy._pg`: the ``<prefix>take_lease`` function and single statements;
`sqlalchemy._plain`: one ``BEGIN IMMEDIATE`` transaction with this upsert). What stays
here is the take a prune makes of many runs inside its own transaction, with the
dialect's upsert (`upsert`): ``INSERT ... ON CONFLICT (run_id) DO UPDATE SET owner,
token, expires_at ... WHERE <prefix>leases.expires_at <= now OR <prefix>leases.token =
excluded.token``, which takes a free or lapsed lease and leaves a live one alone. A
marker's put is the same upsert on the markers table.
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

from agentflow.exec.checkpoints.rules import check_lease_args

#: Opens one transaction on the store's database (`SQLAlchemyCheckpointStore._tx`).
Transaction = Callable[..., AbstractAsyncContextManager[AsyncConnection]]


def clock(sqlite: bool) -> sa.ColumnElement[float]:
    """The store's clock in seconds since the epoch: PostgreSQL's, read inside the statement; on SQLite, ``:now``.

    A statement on SQLite that uses it takes ``now`` among its parameters (`with_now`).
    """
    if sqlite:
        return sa.bindparam("now", type_=sa.Double)
    return sa.cast(sa.extract("epoch", sa.func.clock_timestamp()), sa.Double)


def with_now(values: dict[str, Any], *, sqlite: bool) -> dict[str, Any]:
    """`values`, with the host's ``time.time()`` as ``now`` on SQLite (PostgreSQL reads its own: `clock`).

    Called inside the transaction, once a write holds SQLite's write lock, so no other
    writer commits between the clock read and the statements judged by it.
    """
    return values | {"now": time.time()} if sqlite else values


def upsert(t: sa.Table, *, key: str, value: str, sqlite: bool) -> sa.Insert:
    """The upsert that sets the row of a key where it is free, lapsed or already this token's.

    `t` holds one row per key: the columns `key` (primary key), `value`, ``token`` and
    ``expires_at``; the leases (``run_id``, ``owner``) and the markers (``key``, ``value``,
    `sqlalchemy._markers`) are such tables. A live row of another token is left as it is.

    Parameters: ``id`` (the key), ``what`` (the value), ``held`` (the token), ``ttl``
    (seconds), and ``now`` on SQLite. None is named after a column: an INSERT or UPDATE takes
    a parameter named after a column as a value for that column.
    """
    now = clock(sqlite)
    insert = (sqlite_insert if sqlite else pg_insert)(t).values(
        {
            key: sa.bindparam("id", type_=sa.Text),
            value: sa.bindparam("what", type_=sa.Text),
            "token": sa.bindparam("held", type_=sa.Text),
            "expires_at": now + sa.bindparam("ttl", type_=sa.Double),
        }
    )
    taken = {name: insert.excluded[name] for name in (value, "token", "expires_at")}
    return insert.on_conflict_do_update(
        index_elements=[t.c[key]],
        set_=taken,
        where=(t.c.expires_at <= now) | (t.c.token == insert.excluded.token),
    )


class SQLLeases:
    """The leases table's part of a prune: `take_many` in the prune's transaction."""

    def __init__(self, table: sa.Table, *, sqlite: bool) -> None:
        self._take = upsert(table, key="run_id", value="owner", sqlite=sqlite)
        self._sqlite = sqlite

    def params(self, **values: Any) -> dict[str, Any]:
        """`values`, with the host's clock as ``now`` on SQLite (`with_now`)."""
        return with_now(values, sqlite=self._sqlite)

    async def take_many(
        self, conn: AsyncConnection, run_ids: Sequence[str], owner: str, token: str, ttl_s: float
    ) -> None:
        """Take the leases of `run_ids` for `token` in the caller's transaction (a prune's), where free or lapsed."""
        check_lease_args(owner, token, ttl_s)
        rows = [self.params(id=run_id, what=owner, held=token, ttl=ttl_s) for run_id in run_ids]
        if rows:
            await conn.execute(self._take, rows)
