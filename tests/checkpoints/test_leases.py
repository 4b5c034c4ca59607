"""Run leases, per backend: where each store keeps them, whose clock it reads, and old databases gaining them.

The rules every store keeps (one holder, renew and release by its token, lapsing, racing
takers in one process) are the conformance checks; the race of several processes is in
test_conformance.py. Here is what differs between the stores.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from redis.crc import key_slot
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from store_kit import StoreFactory

from agentflow.exec.checkpoints.conformance import SEALER
from agentflow.exec.checkpoints.sqlalchemy import MIGRATIONS
from agentflow.exec.checkpoints.sqlite import MIGRATIONS as SQLITE_MIGRATIONS
from agentflow.exec.checkpoints.sqlite import SQLiteCheckpointStore


def _run() -> str:
    return f"lease-{uuid.uuid4().hex}"


async def _sql(url: str, statement: str) -> list[Any]:
    """Run raw SQL beside the store."""
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            result = await conn.execute(text(statement))
            return list(result.all()) if result.returns_rows else []
    finally:
        await engine.dispose()


# -- old databases gain the table ---------------------------------------------------------


async def test_a_sqlite_file_of_schema_version_1_gains_the_leases_table(tmp_path: Path) -> None:
    # Given a file an agentflow without leases made (schema version 1), holding a run
    path = tmp_path / "runs.db"
    row = SEALER.seal_checkpoint("old", 0, "f", "running", 0, 1000.0, {"step": 0})
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.executescript(SQLITE_MIGRATIONS[0])
        conn.execute("CREATE TABLE agentflow_meta (key TEXT PRIMARY KEY, value TEXT)")
        conn.execute("INSERT INTO agentflow_meta VALUES ('schema_version', '1')")
        values = (row.run_id, row.step, row.flow, row.status, row.segment, row.saved_at, row.payload, row.kid, row.sig)
        conn.execute("INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", values)
    # When this agentflow opens it and takes a lease
    async with SQLiteCheckpointStore(path) as store:
        lease = await store.take_lease("old", "A", "token-a", 60)
        # Then the take works, and the run's rows are as they were
        assert (await store.leases(["old"]))["old"] == lease
        assert await store.latest("old") == row
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT value FROM agentflow_meta").fetchone() == (str(len(SQLITE_MIGRATIONS)),)
        assert conn.execute("SELECT run_id, owner, token FROM leases").fetchall() == [("old", "A", "token-a")]


@pytest.mark.parametrize(
    "store_factory", ["sqlalchemy-sqlite", pytest.param("sqlalchemy-pg", marks=pytest.mark.postgres)], indirect=True
)
async def test_sqlalchemy_tables_of_schema_version_1_gain_the_leases_table(store_factory: StoreFactory) -> None:
    assert store_factory.spec is not None
    url, prefix = store_factory.spec["url"], store_factory.spec.get("table_prefix", "agentflow_")
    # Given tables as an agentflow without leases left them: no leases table, schema version 1
    store = await store_factory()
    row = SEALER.seal_checkpoint("old", 0, "f", "running", 0, 1000.0, {"step": 0})
    await store.save("old", 0, row)
    await store.aclose()
    await _sql(url, f"DROP TABLE {prefix}leases")
    await _sql(url, f"UPDATE {prefix}meta SET value = '1' WHERE key = 'schema_version'")
    # When a store of this agentflow uses them
    store = await store_factory()
    lease = await store.take_lease("old", "A", "token-a", 60)
    # Then the leases table is there again, the schema is current, and the run's rows are kept
    assert (await store.leases(["old"]))["old"] == lease
    assert await store.latest("old") == row
    assert await _sql(url, f"SELECT value FROM {prefix}meta WHERE key = 'schema_version'") == [(str(len(MIGRATIONS)),)]


# -- Redis: one key per run, in the run's slot, expiring with the lease -----------------------

REDIS = [pytest.param("redis", marks=pytest.mark.redis)]


@pytest.mark.parametrize("store_factory", REDIS, indirect=True)
async def test_a_redis_lease_is_one_key_in_the_runs_slot_that_expires_with_it(store_factory: StoreFactory) -> None:
    assert store_factory.spec is not None
    prefix, raw = store_factory.spec["prefix"], redis.asyncio.Redis.from_url(store_factory.spec["url"])
    store = await store_factory()
    try:
        # Given a run held for 30 s, before any checkpoint of it is saved
        run_id = _run()
        lease = await store.take_lease(run_id, "A", "token-a", 30)
        key = f"{prefix}:run:{{{run_id}}}:lease"
        # Then its lease is one hash in the slot of the run's other keys, expiring when the lease lapses
        assert await raw.hgetall(key) == {
            b"owner": b"A",
            b"token": b"token-a",
            b"expires_at": str(round(lease.expires_at * 1000)).encode(),
        }
        assert key_slot(key.encode()) == key_slot(f"{prefix}:run:{{{run_id}}}:cp".encode())
        assert 29_000 < await raw.pttl(key) <= 30_000
        # And a lease makes no run: stored_runs (which scans for checkpoint lists) does not list it
        assert run_id not in await store.stored_runs()
        # And delete removes the key with the run's others
        await store.save(run_id, 0, SEALER.seal_checkpoint(run_id, 0, "f", "running", 0, time.time(), {}))
        await store.delete(run_id)
        assert await raw.exists(key, f"{prefix}:run:{{{run_id}}}:cp") == 0
    finally:
        await raw.aclose()


# -- whose clock: the server's, not this host's ----------------------------------------------


async def _server_now(store_factory: StoreFactory) -> float:
    assert store_factory.spec is not None
    if store_factory.name == "redis":
        raw = redis.asyncio.Redis.from_url(store_factory.spec["url"])
        try:
            seconds, micros = await raw.time()
        finally:
            await raw.aclose()
        return seconds + micros / 1e6
    ((now,),) = await _sql(store_factory.spec["url"], "SELECT extract(epoch from clock_timestamp())::float8")
    return float(now)


@pytest.mark.parametrize(
    "store_factory", [*REDIS, pytest.param("sqlalchemy-pg", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_hosts_skewed_clock_does_not_move_the_servers_leases(
    store_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await store_factory()
    await store.leases([])  # connected (and set up) before the clock is skewed
    before = await _server_now(store_factory)
    # Given a worker whose clock runs an hour ahead of the server's
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    # When it takes a lease for 60 s
    run_id = _run()
    lease = await store.take_lease(run_id, "A", "token-a", 60)
    # Then the lease ends 60 s after the server's now, not the worker's
    monkeypatch.undo()
    after = await _server_now(store_factory)
    assert before + 60 - 0.01 <= lease.expires_at <= after + 60 + 0.01
    # And it is live for every worker, whatever their clocks say
    assert (await store.leases([run_id]))[run_id] == lease
