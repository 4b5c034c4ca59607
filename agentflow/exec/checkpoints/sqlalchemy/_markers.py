"""The markers of `SQLAlchemyCheckpointStore` (`MarkerStore`): the ``<prefix>markers`` table, apart from the leases.

One row per key that is or was set (schema version 5)::

    <prefix>markers (key TEXT PRIMARY KEY, value TEXT, token TEXT, expires_at DOUBLE)

A row whose ``expires_at`` is past the clock is a lapsed marker: free, whatever it still
says, until a put overwrites it or its token takes it. The table is the markers' alone: no
lease is read or written here, and a run's `delete` or prune leaves the markers named after it.

Expiry is judged on the leases' clock (`sqlalchemy._leases.clock`): PostgreSQL's
``clock_timestamp()`` inside each statement; on SQLite the host's ``time.time()``, read
once the transaction has begun (a write's ``BEGIN IMMEDIATE`` holds the write lock by then).

Each call is one transaction of plain statements:

- put: the leases' upsert (`sqlalchemy._leases.upsert`), which writes where the key is free,
  lapsed or already this token's (value and expiry both replaced), then the row read back.
  The upsert keeps the row locked until the commit (PostgreSQL locks the row it conflicts
  with whether it updates it or not; SQLite holds its write lock), so the read-back sees
  what the upsert left: this token's marker, or the live one of another token, unchanged.
  Of racing puts on a free key the first insert wins; the others meet its live row.
- peek: one SELECT of the live rows among the keys, made by the store's path for hot
  operations (`peek_rows`: on SQLite a chunk of keys per SELECT in one read transaction,
  `sqlalchemy._plain`; one asyncpg statement on PostgreSQL), as the leases' reads are: a
  worker peeks at a run's cancel request every superstep.
- take: a DELETE of the key's row where it is this token's and live, whose count says
  whether it was, then a DELETE of it lapsed.

Rows read back are checked for type (a SQLite column takes any value, and a row changed
by hand can hold anything): a mismatch is `CheckpointStoreCorrupt` naming the key and column.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import sqlalchemy as sa

from agentflow._errors import CheckpointStoreCorrupt
from agentflow.exec.checkpoints.records import Marker
from agentflow.exec.checkpoints.sqlalchemy._leases import Transaction, clock, upsert, with_now
from agentflow.exec.checkpoints.sqlalchemy._rows import as_kind


class SQLMarkers:
    """The statements on one store's markers table, each call run in a transaction of its own."""

    def __init__(
        self,
        t: sa.Table,
        *,
        sqlite: bool,
        tx: Transaction,
        shown: str,
        peek_rows: Callable[[Sequence[str]], Awaitable[Sequence[Sequence[Any]]]],
    ) -> None:
        self._sqlite = sqlite
        self._peek_rows = peek_rows
        self._tx = tx
        self._shown = shown
        now = clock(sqlite)
        key: sa.BindParameter[str] = sa.bindparam("id", type_=sa.Text)
        held: sa.BindParameter[str] = sa.bindparam("held", type_=sa.Text)
        row = sa.select(t.c.key, t.c.value, t.c.token, t.c.expires_at)
        self._put = upsert(t, key="key", value="value", sqlite=sqlite)
        self._read = row.where(t.c.key == key)
        self._take_live = sa.delete(t).where(t.c.key == key, t.c.token == held, t.c.expires_at > now)
        self._take_any = sa.delete(t).where(t.c.key == key, t.c.token == held)

    def _marker(self, row: Sequence[Any]) -> Marker:
        """Rebuild a marker from a row of (key, value, token, expires_at), each column's type checked."""
        key, value, token, expires_at = row
        try:
            return Marker(
                key,
                as_kind(str, value, "value"),
                as_kind(str, token, "token"),
                as_kind(float, expires_at, "expires_at"),
            )
        except TypeError as exc:
            raise CheckpointStoreCorrupt(f"{self._shown}: the marker row {key!r} is unreadable: {exc}") from None

    async def put(self, key: str, value: str, token: str, ttl_s: float) -> Marker:
        """Set the marker unless another token's is live there; the marker as it stands afterwards."""
        async with self._tx(write=True) as conn:
            await conn.execute(
                self._put, with_now({"id": key, "what": value, "held": token, "ttl": ttl_s}, sqlite=self._sqlite)
            )
            row = (await conn.execute(self._read, {"id": key})).one_or_none()
        if row is None:
            raise CheckpointStoreCorrupt(f"{self._shown}: the marker {key!r} was written but cannot be read back")
        return self._marker(row)

    async def peek(self, keys: Sequence[str]) -> dict[str, Marker]:
        """The live markers among `keys`, in the order of `keys`."""
        unique = list(dict.fromkeys(keys))
        if not unique:
            return {}
        found = {marker.key: marker for marker in map(self._marker, await self._peek_rows(unique))}
        return {key: found[key] for key in unique if key in found}

    async def take(self, key: str, token: str) -> bool:
        """Delete the marker if `token` set it, live or lapsed; whether it was live."""
        async with self._tx(write=True) as conn:
            live = (
                await conn.execute(self._take_live, with_now({"id": key, "held": token}, sqlite=self._sqlite))
            ).rowcount
            await conn.execute(self._take_any, {"id": key, "held": token})
        return live > 0
