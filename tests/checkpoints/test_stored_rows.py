"""A run's rows outlive its listing entry: no step 0 starts over them, and `stored_runs` still finds them.

Each store decides "this run is new" from one entry (the Redis latest hash, the SQL
``runs`` row, the latest checkpoint row) and lists runs from an index (sorted sets, the
``runs`` table, the memory store's ``_listed``). These tests delete those entries the way
someone with write access to the backend would, then try to start the run id again.
"""

from __future__ import annotations

import sqlite3
import uuid
from contextlib import closing
from typing import Any, Literal

import pytest
import sqlalchemy as sa

from agentflow._errors import CheckpointConflict
from agentflow.exec.checkpoints import CheckpointStore, SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints.conformance import SEALER

#: Which checkpoint rows go along with the listing entry.
Gone = Literal["none", "first", "all"]


def checkpoint(run_id: str, step: int, segment: int = 0, **body: Any) -> SealedCheckpoint:
    return SEALER.seal_checkpoint(run_id, step, "audit", "running", segment, 1000.0 + step, {"step": step, **body})


def call(run_id: str, segment: int, seq: int, kind: str = "started") -> SealedCall:
    return SEALER.seal_call(run_id, segment, seq, kind, {"at": f"{segment}.{seq}"})


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
    if store_factory.name in ("fakeredis", "redis") or store_factory.name.startswith("sqlalchemy"):
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
        # (Redis history insists on a list that starts at step 0, and SQL reads latest through
        # the runs row, so each is asked in the way that still works.)
        if store_factory.name in ("fakeredis", "redis"):
            assert await store.latest(run_id) == rows[1]
        else:
            assert list(await store.history(run_id)) == rows[1:]
        assert run_id in await store.stored_runs()
    else:  # no checkpoint row: stored_runs (checkpoint rows only) has nothing to find
        assert list(await store.history(run_id)) == []
        assert run_id not in await store.stored_runs()
    assert run_id not in [cp.run_id for cp in await store.list_runs()]
    # And deleting the run is the way out: then the id starts afresh
    await store.delete(run_id)
    fresh = checkpoint(run_id, 0, again=True)
    await store.save(run_id, 0, fresh)
    assert list(await store.history(run_id)) == [fresh]
    assert list(await store.calls(run_id)) == []
