"""SQLAlchemyCheckpointStore on PostgreSQL: a server whose commits a crash can lose is refused, or warned about.

With ``synchronous_commit = off`` a commit returns before its WAL is on disk, so a crash of
the server can lose a call's ``started`` record after the tool had its effect. The store
reads the setting when it sets up its tables (docs/stores/sql.md, Failover and durability).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest
from _kit.stores import run_sql

from agentflow._errors import CheckpointError, CheckpointNotFound
from agentflow.exec.checkpoints import SQLAlchemyCheckpointStore

pytestmark = pytest.mark.postgres

#: Connections whose commits do not wait for the disk (asyncpg's per-connection server settings).
UNSYNCED = {"connect_args": {"server_settings": {"synchronous_commit": "off"}}}


@pytest.fixture
def prefix(postgres_url: str) -> Iterator[str]:
    made = f"d{uuid.uuid4().hex[:10]}_"
    yield made
    for table in ("events", "leases", "calls", "runs", "checkpoints", "meta"):
        _drop(postgres_url, f"{made}{table}")


def _drop(url: str, table: str) -> None:
    import asyncio

    asyncio.run(run_sql(url, f"DROP TABLE IF EXISTS {table} CASCADE"))


async def test_synchronous_commit_off_is_refused_unless_allowed_saying_what_to_set(
    postgres_url: str, prefix: str
) -> None:
    store = SQLAlchemyCheckpointStore(postgres_url, table_prefix=prefix, engine_options=UNSYNCED, allow_volatile=False)
    try:
        with pytest.raises(CheckpointError, match=r"synchronous_commit = off.*Set synchronous_commit = on"):
            await store.latest("r")
    finally:
        await store.aclose()


async def test_synchronous_commit_off_is_warned_about_when_allowed(
    postgres_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = SQLAlchemyCheckpointStore(postgres_url, table_prefix=prefix, engine_options=UNSYNCED)
    try:
        with caplog.at_level(logging.WARNING, "agentflow.exec.checkpoints.sqlalchemy"):
            with pytest.raises(CheckpointNotFound):
                await store.latest("r")
        assert any("synchronous_commit = off" in r.getMessage() for r in caplog.records)
    finally:
        await store.aclose()


async def test_the_default_synchronous_commit_is_taken_without_a_word(
    postgres_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = SQLAlchemyCheckpointStore(postgres_url, table_prefix=prefix, allow_volatile=False)
    try:
        with caplog.at_level(logging.WARNING, "agentflow.exec.checkpoints.sqlalchemy"):
            with pytest.raises(CheckpointNotFound):
                await store.latest("r")
        assert not caplog.records
    finally:
        await store.aclose()
