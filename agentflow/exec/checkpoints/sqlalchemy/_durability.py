"""When a commit to PostgreSQL counts as stored: the ``synchronous_commit`` check of `SQLAlchemyCheckpointStore`.

A commit is durable on the server's disk only with ``synchronous_commit`` on (the
default); with ``off`` it returns before its WAL is flushed, and a crash of the server
loses the last commits, among them a call's ``started`` record, so the call would run
again. On a primary with standbys, a failover keeps what ``synchronous_standby_names``
and ``synchronous_commit = on`` (or ``remote_apply``) made wait for a standby
(docs/stores/sql.md). The store reads the setting once, when it sets up its tables:
``off`` is a warning, or a refusal when the store was made with ``allow_volatile=False``
(the workers' settings, unless ``AGENTFLOW_STORE_ALLOW_VOLATILE`` is set). SQLite
commits are fsynced (``synchronous=FULL``) and are not checked here.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agentflow._errors import StoreRefused

_log = logging.getLogger("agentflow.exec.checkpoints.sqlalchemy")


async def check_commit(conn: AsyncConnection, shown: str, *, allow_volatile: bool) -> None:
    """Refuse (or warn about) ``synchronous_commit = off`` on PostgreSQL (see the module notes).

    Raises:
        StoreRefused: the setting is off and `allow_volatile` is False.
    """
    setting = str((await conn.execute(sa.text("SHOW synchronous_commit"))).scalar_one())
    if setting != "off":
        return
    why = (
        f"PostgreSQL at {shown} has synchronous_commit = off: a commit returns before it is on disk, so a crash "
        "of the server loses the last ones, and with a call's started record the call would run again"
    )
    if not allow_volatile:
        raise StoreRefused(
            f"{why}. Set synchronous_commit = on (for the database, the role, or in the URL's options), or say it "
            "is on purpose with AGENTFLOW_STORE_ALLOW_VOLATILE=1 (allow_volatile=True)"
        )
    _log.warning("%s (see docs/stores/sql.md, Failover and durability)", why)
