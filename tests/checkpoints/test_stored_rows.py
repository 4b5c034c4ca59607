"""A run's rows outlive its listing entry: no step 0 starts over them, `stored_runs` finds them, `relist` mends it.

Each store decides "this run is new" from one entry (the Redis latest hash, the SQL
``runs`` row, the latest checkpoint row) and lists runs from an index (sorted sets, the
``runs`` table, the memory store's ``_listed``). These tests delete those entries (or roll
them back to an older step) the way someone with write access to the backend would, then
try to start the run id again, or relist the run and carry on with it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from contextlib import closing
from typing import Any, Literal

import pytest
import sqlalchemy as sa
from _kit.poll import until

from agentflow._errors import CheckpointConflict, CheckpointStoreCorrupt
from agentflow.exec.checkpoints import CheckpointStore, SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints.conformance import SEALER

#: Which checkpoint rows go along with the listing entry.
Gone = Literal["none", "first", "all"]


def checkpoint(run_id: str, step: int, segment: int = 0, status: str = "running", **body: Any) -> SealedCheckpoint:
    return SEALER.seal_checkpoint(run_id, step, "audit", status, segment, 1000.0 + step, {"step": step, **body})


def call(run_id: str, segment: int, seq: int, kind: str = "started") -> SealedCall:
    return SEALER.seal_call(run_id, segment, seq, kind, {"at": f"{segment}.{seq}"})


def redis_store(name: str) -> bool:
    return name in ("fakeredis", "redis")


def sql_store(name: str) -> bool:
    """The SQLAlchemy set-ups, whose compare-and-set and fencing read the ``runs`` row."""
    return name.startswith("sqlalchemy")


async def _sql(store: Any, statement: sa.Executable) -> None:
    entry = await store._db.engine()
    async with entry.engine.begin() as conn:
        await conn.execute(statement)


async def tamper(name: str, store: Any, run_id: str, flow: str, gone: Gone) -> None:
    """Delete the run's listing entry (and `gone` checkpoint rows) directly in the backend; call rows stay."""
    if name == "memory":
        del store._listed[run_id]
        rows = store._checkpoints[run_id]
        del rows[: {"none": 0, "first": 1, "all": len(rows)}[gone]]
    elif name == "sqlite":
        with closing(sqlite3.connect(store.path)) as conn, conn:
            conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
            if gone != "none":
                only_first = " AND step = 0" if gone == "first" else ""
                conn.execute(f"DELETE FROM checkpoints WHERE run_id = ?{only_first}", (run_id,))
    elif name in ("fakeredis", "redis"):
        prefix = store._prefix
        client = store._clients._factory()
        try:
            await client.delete(f"{prefix}:run:{{{run_id}}}:latest")
            for index in (f"{prefix}:runs", f"{prefix}:runs:{flow}", f"{prefix}:unfinished:{flow}"):
                await client.zrem(index, run_id)
            cp_key = f"{prefix}:run:{{{run_id}}}:cp"
            if gone == "first":
                await client.lpop(cp_key)
            elif gone == "all":
                await client.delete(cp_key)
        finally:
            await client.aclose()
    else:
        t = store._t
        await _sql(store, sa.delete(t.runs).where(t.runs.c.run_id == run_id))
        if gone != "none":
            rows = sa.delete(t.checkpoints).where(t.checkpoints.c.run_id == run_id)
            await _sql(store, rows.where(t.checkpoints.c.step == 0) if gone == "first" else rows)


async def roll_back(name: str, store: Any, run_id: str, to: SealedCheckpoint) -> None:
    """Point the run's listing entry at the older checkpoint `to`, as a restored backup of the index would."""
    if name == "memory":
        return  # its index holds ids only: there is no step to roll back
    entry = {"flow": to.flow, "status": to.status, "step": to.step, "segment": to.segment, "saved_at": to.saved_at}
    if name == "sqlite":
        with closing(sqlite3.connect(store.path)) as conn, conn:
            sql = "UPDATE runs SET flow = ?, status = ?, step = ?, saved_at = ? WHERE run_id = ?"
            assert conn.execute(sql, (to.flow, to.status, to.step, to.saved_at, run_id)).rowcount == 1
    elif redis_store(name):
        prefix = store._prefix
        client = store._clients._factory()
        try:
            await client.hset(f"{prefix}:run:{{{run_id}}}:latest", mapping={**entry, "saved_at": repr(to.saved_at)})
            for index in (f"{prefix}:runs", f"{prefix}:runs:{to.flow}"):
                await client.zadd(index, {run_id: to.saved_at})
        finally:
            await client.aclose()
    else:
        runs = store._t.runs
        await _sql(store, sa.update(runs).where(runs.c.run_id == run_id).values(entry))


async def _old_run(store: CheckpointStore) -> tuple[str, list[SealedCheckpoint], list[SealedCall]]:
    """A run at step 1 with records in segments 0 and 1."""
    run_id = f"old-{uuid.uuid4().hex}"
    rows = [checkpoint(run_id, 0), checkpoint(run_id, 1, segment=1)]
    records = [call(run_id, 0, 0), call(run_id, 0, 1, "done"), call(run_id, 1, 0)]
    await store.save(run_id, 0, rows[0])
    await store.record_call(run_id, records[0])
    await store.save_after_calls(run_id, 1, rows[1], [records[1]])
    await store.record_call(run_id, records[2])
    return run_id, rows, records


async def test_a_run_whose_listing_entry_was_deleted_keeps_its_rows_and_takes_no_step_zero(
    store_factory: Any, store: CheckpointStore
) -> None:
    # Given a run with checkpoints and call records
    run_id, rows, records = await _old_run(store)
    assert run_id in await store.stored_runs()
    # When its listing entry (the latest hash and index entries on Redis, the runs row in SQL) is deleted
    await tamper(store_factory.name, store, run_id, "audit", "none")
    # Then the listings no longer show it, but stored_runs still does
    assert run_id not in [cp.run_id for cp in await store.list_runs()]
    assert run_id not in await store.list_unfinished("audit")
    assert run_id in await store.stored_runs()
    # And step 0 of the same run id is refused, by save and by save_after_calls alike
    with pytest.raises(CheckpointConflict) as refused:
        await store.save(run_id, 0, checkpoint(run_id, 0, again=True))
    if redis_store(store_factory.name) or sql_store(store_factory.name):
        assert "already has stored rows" in str(refused.value)  # the entry it reads is gone
    with pytest.raises(CheckpointConflict):
        await store.save_after_calls(run_id, 0, checkpoint(run_id, 0, again=True), [])
    # And every old row is still there, unchanged
    assert list(await store.history(run_id)) == rows
    assert list(await store.calls(run_id)) == records


@pytest.mark.parametrize("gone", ["first", "all"])
async def test_leftover_rows_without_a_listing_entry_refuse_a_step_zero(
    store_factory: Any, store: CheckpointStore, gone: Gone
) -> None:
    # Given a run whose listing entry and some (or all) of its checkpoint rows were deleted by hand
    run_id, rows, records = await _old_run(store)
    await tamper(store_factory.name, store, run_id, "audit", gone)
    # When the run id is started again, Then it is refused: call rows (at least) are still stored
    with pytest.raises(CheckpointConflict):
        await store.save(run_id, 0, checkpoint(run_id, 0, again=True))
    # And nothing left behind was touched: the call log, the remaining checkpoint
    assert list(await store.calls(run_id)) == records
    if gone == "first":
        # (latest reads the rows on every store; Redis history insists on a list that starts at step 0)
        assert await store.latest(run_id) == rows[1]
        if not redis_store(store_factory.name):
            assert list(await store.history(run_id)) == rows[1:]
        assert run_id in await store.stored_runs()
    else:  # no checkpoint row: stored_runs (checkpoint rows only) has nothing to find
        assert list(await store.history(run_id)) == []
        assert run_id not in await store.stored_runs()
    assert run_id not in [cp.run_id for cp in await store.list_runs()]
    # And relist lists again only what has a sound newest row: none without checkpoint rows, and
    # on Redis none from a list that no longer holds step + 1 rows (its saves would refuse it too)
    if gone == "all":
        assert await store.relist(run_id) is None
    elif redis_store(store_factory.name):
        with pytest.raises(CheckpointStoreCorrupt, match="holds 1 checkpoint rows but the newest is step 1"):
            await store.relist(run_id)
    else:
        assert await store.relist(run_id) == rows[1]
        assert [cp.run_id for cp in await store.list_runs()] == [run_id]
    # And deleting the run is the way out: then the id starts afresh
    await store.delete(run_id)
    fresh = checkpoint(run_id, 0, again=True)
    await store.save(run_id, 0, fresh)
    assert list(await store.history(run_id)) == [fresh]
    assert list(await store.calls(run_id)) == []


async def test_relist_puts_back_a_run_whose_listing_entry_was_deleted(
    store_factory: Any, store: CheckpointStore
) -> None:
    # Given a run at step 1 (claimed by segment 1) whose listing entry was deleted
    run_id, rows, records = await _old_run(store)
    await tamper(store_factory.name, store, run_id, "audit", "none")
    # Then latest still reads its newest row on every store, but it is not listed
    assert await store.latest(run_id) == rows[1]
    assert run_id not in await store.list_unfinished("audit")
    if redis_store(store_factory.name) or sql_store(store_factory.name):
        # (and where the compare-and-set reads the entry, the run takes no save)
        with pytest.raises(CheckpointConflict, match="no step 0"):
            await store.save(run_id, 2, checkpoint(run_id, 2, segment=1))
    # When it is relisted
    assert await store.relist(run_id) == rows[1]
    # Then it is listed again at its newest row, and its head counts its log
    assert await store.latest(run_id) == rows[1]
    assert list(await store.list_unfinished("audit")) == [run_id]
    assert list(await store.list_runs("audit")) == [rows[1]]
    assert [cp.run_id for cp in await store.list_runs()] == [run_id]
    latest, counts = await store.head(run_id)
    assert (latest, dict(counts)) == (rows[1], {0: 2, 1: 1})
    # And a second relist changes nothing
    assert await store.relist(run_id) == rows[1]
    assert list(await store.list_runs("audit")) == [rows[1]]
    # And the run carries on: a record in the latest segment is accepted
    await store.record_call(run_id, call(run_id, 1, 1, "done"))
    # But a started record of the older segment is still fenced off
    with pytest.raises(CheckpointConflict, match="fenced off"):
        await store.record_call(run_id, call(run_id, 0, 2))
    # And the next step saves (compare-and-set on step 1), and is what the listings show
    following = checkpoint(run_id, 2, segment=1, status="paused")
    await store.save(run_id, 2, following)
    assert await store.latest(run_id) == following
    assert list(await store.list_runs("audit")) == [following]
    assert list(await store.list_unfinished("audit")) == [run_id]
    assert list(await store.history(run_id)) == [*rows, following]
    assert list(await store.calls(run_id)) == [*records, call(run_id, 1, 1, "done")]


async def test_relist_moves_a_rolled_back_listing_entry_to_the_newest_row(
    store_factory: Any, store: CheckpointStore
) -> None:
    # Given a run at step 1 (segment 1) whose listing entry was rolled back to step 0 (segment 0)
    run_id, rows, records = await _old_run(store)
    await roll_back(store_factory.name, store, run_id, rows[0])
    if redis_store(store_factory.name) or sql_store(store_factory.name):
        # Then the run is stuck: the compare-and-set reads the entry, after which step 2 is not next
        with pytest.raises(CheckpointConflict, match="step 2 is not next"):
            await store.save(run_id, 2, checkpoint(run_id, 2, segment=1))
    # When it is relisted
    assert await store.relist(run_id) == rows[1]
    # Then the listings show its newest row, and the run carries on from there
    assert list(await store.list_runs("audit")) == [rows[1]]
    assert list(await store.list_unfinished("audit")) == [run_id]
    with pytest.raises(CheckpointConflict, match="fenced off"):
        await store.record_call(run_id, call(run_id, 0, 2))
    await store.record_call(run_id, call(run_id, 1, 1, "done"))
    following = checkpoint(run_id, 2, segment=1, status="done")
    await store.save(run_id, 2, following)
    assert list(await store.list_runs("audit")) == [following]
    assert list(await store.list_unfinished("audit")) == []
    assert list(await store.history(run_id)) == [*rows, following]


async def test_relist_of_an_ended_run_lists_it_but_not_as_unfinished(
    store_factory: Any, store: CheckpointStore
) -> None:
    # Given a run that ended, whose listing entry was deleted
    run_id = f"ended-{uuid.uuid4().hex}"
    rows = [checkpoint(run_id, 0), checkpoint(run_id, 1, status="done")]
    for row in rows:
        await store.save(run_id, row.step, row)
    await tamper(store_factory.name, store, run_id, "audit", "none")
    # When it is relisted, Then list_runs shows it, list_unfinished does not, and it takes no save
    assert await store.relist(run_id) == rows[1]
    assert list(await store.list_runs("audit")) == [rows[1]]
    assert list(await store.list_unfinished("audit")) == []
    with pytest.raises(CheckpointConflict, match="ended"):
        await store.save(run_id, 2, checkpoint(run_id, 2))


# -- what relist writes, per backend ------------------------------------------------------------

REDIS = ["fakeredis", pytest.param("redis", marks=pytest.mark.redis)]
SQL = ["sqlalchemy-sqlite", pytest.param("sqlalchemy-pg", marks=pytest.mark.postgres)]
WEEK = 7 * 24 * 3600  # the Redis store's default ttl_s


@pytest.mark.parametrize("store_factory", REDIS, indirect=True)
async def test_relist_on_redis_writes_what_a_save_writes_with_its_expiry_rule(store: Any) -> None:
    # Given a running run and a paused one, as their saves left them
    running, paused = f"running-{uuid.uuid4().hex}", f"paused-{uuid.uuid4().hex}"
    for row in (checkpoint(running, 0), checkpoint(paused, 0), checkpoint(paused, 1, status="paused")):
        await store.save(row.run_id, row.step, row)
    prefix, raw = store._prefix, store._clients._factory()
    keys = {run_id: [f"{prefix}:run:{{{run_id}}}:{part}" for part in ("cp", "latest")] for run_id in (running, paused)}
    every, of_flow, unfinished = (f"{prefix}:{name}" for name in ("runs", "runs:audit", "unfinished:audit"))
    try:
        saved = {run_id: await raw.hgetall(keys[run_id][1]) for run_id in keys}
        scores = {index: await raw.zrange(index, 0, -1, withscores=True) for index in (every, of_flow)}
        # When their latest hashes and index entries are deleted and the runs relisted
        for run_id in keys:
            await tamper("redis", store, run_id, "audit", "none")
            assert await store.relist(run_id) == await store.latest(run_id)
        # Then the hashes and the runs indexes hold what the saves wrote
        assert {run_id: await raw.hgetall(keys[run_id][1]) for run_id in keys} == saved
        assert {index: await raw.zrange(index, 0, -1, withscores=True) for index in (every, of_flow)} == scores
        # And the expiry rule of a save holds: the running run's keys expire in ttl_s (so scored
        # in the unfinished index), the paused run's never do
        ttls = [await raw.ttl(key) for key in keys[running]]
        assert all(WEEK - 100 < ttl <= WEEK for ttl in ttls), ttls
        assert [await raw.ttl(key) for key in keys[paused]] == [-1, -1]
        expires = dict(await raw.zrange(unfinished, 0, -1, withscores=True))
        assert abs(expires[running.encode()] - (time.time() + WEEK)) < 100
        assert expires[paused.encode()] == float("inf")
        # And a relist of the healthy run writes nothing, not even the expiry
        await raw.persist(keys[running][0])
        assert (await store.relist(running)).step == 0
        assert await raw.ttl(keys[running][0]) == -1
    finally:
        await raw.aclose()


async def _until_waiting(entry: Any, task: asyncio.Future[Any]) -> None:
    """Return once `task` waits on another transaction's lock.

    PostgreSQL shows the wait (an ungranted lock in ``pg_locks``). SQLite shows no lock
    waits from outside, so there the engine's statements are watched instead: the task
    waits once it has asked for the write lock (the store's ``BEGIN IMMEDIATE``, or a first
    write statement; the other transaction holds the lock) and has not finished.
    """
    deadline = time.monotonic() + 10.0
    if entry.engine.dialect.name != "postgresql":
        writes: list[str] = []

        def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            said = statement.lstrip().upper()
            if said.startswith(("BEGIN IMMEDIATE", "INSERT", "UPDATE", "DELETE")):
                writes.append(statement)

        sa.event.listen(entry.engine.sync_engine, "before_cursor_execute", seen)

        def asked() -> bool:
            assert not task.done(), "the task finished without waiting for the write lock"
            return bool(writes)

        try:
            await until(asked, "the task asking for the write lock", every=0.01)
        finally:
            sa.event.remove(entry.engine.sync_engine, "before_cursor_execute", seen)
        return
    async with entry.engine.connect() as probe:
        while time.monotonic() < deadline and not task.done():
            found = await probe.execute(sa.text("SELECT count(*) FROM pg_locks WHERE NOT granted"))
            if found.scalar():
                return
            await asyncio.sleep(0.01)
    raise AssertionError("the task finished or never waited on the other transaction's lock")


@pytest.mark.parametrize("store_factory", SQL, indirect=True)
async def test_relist_on_sql_waits_for_a_runs_row_written_meanwhile_and_sets_it_right(store: Any) -> None:
    # Given a paused run whose runs row was deleted
    run_id, rows, _ = await _old_run(store)
    paused = checkpoint(run_id, 2, segment=1, status="paused")
    await store.save(run_id, 2, paused)
    await tamper("sqlalchemy", store, run_id, "audit", "none")
    # And another writer that inserts a stale runs row (step 0, running) and holds it uncommitted
    runs = store._t.runs
    stale = {"run_id": run_id, "flow": "audit", "status": "running", "step": 0, "segment": 0, "saved_at": 1.0}
    entry = await store._db.engine()
    async with entry.engine.connect() as conn:
        transaction = await conn.begin()
        await conn.execute(sa.insert(runs).values(stale))
        # When the run is relisted meanwhile (it waits: for the primary key on PostgreSQL, the
        # write lock on SQLite), and the other writer then commits
        relisting = asyncio.ensure_future(store.relist(run_id))
        await _until_waiting(entry, relisting)
        assert not relisting.done()
        await transaction.commit()
    # Then the relist returns the newest row and the runs row is set to it (on PostgreSQL its
    # insert lost to the other one's, so it read the row again and updated it)
    assert await relisting == paused
    assert list(await store.list_runs("audit")) == [paused]
    assert list(await store.list_unfinished("audit")) == [run_id]
    await store.save(run_id, 3, checkpoint(run_id, 3, segment=1))


@pytest.mark.postgres
@pytest.mark.parametrize("store_factory", ["sqlalchemy-pg"], indirect=True)
async def test_a_delete_waiting_on_a_relist_removes_the_runs_row_it_inserted(store: Any) -> None:
    # Given a run without its runs row, and a transaction doing what relist does: the newest
    # checkpoint row read FOR SHARE, then the runs row inserted, not yet committed
    run_id, rows, _ = await _old_run(store)
    await tamper("sqlalchemy", store, run_id, "audit", "none")
    t = store._t
    entry = await store._db.engine()
    async with entry.engine.connect() as conn:
        transaction = await conn.begin()
        await conn.execute(store._q.newest_shared, {"run_id": run_id})
        # When the run is deleted meanwhile (its checkpoint DELETE waits for that lock)
        deleting = asyncio.ensure_future(store.delete(run_id))
        await _until_waiting(entry, deleting)
        assert not deleting.done()
        values = {"run_id": run_id, "flow": "audit", "status": "running", "step": 1, "segment": 1, "saved_at": 1.0}
        await conn.execute(sa.insert(t.runs).values(values))
        await transaction.commit()
    await deleting
    # Then nothing of the run is left, not even the runs row inserted after the delete began
    assert await store.relist(run_id) is None
    assert run_id not in [cp.run_id for cp in await store.list_runs()]
    assert run_id not in await store.list_unfinished("audit")
    await store.save(run_id, 0, checkpoint(run_id, 0, again=True))
