"""The workers' retention, in-process: the beat task's body (prune, then trim) on a memory store, its beat entry."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest
from celery import Celery

from agentflow import FlowApp, Registry
from agentflow.celery import WorkerSettings, register_tasks
from agentflow.celery._retention import PRUNE_LOCK
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.exec.run.markers import Markers
from agentflow.exec.seal import Sealer

#: The workers' key: retention judges each run by its newest checkpoint, signed with it.
KEY = b"k" * 32
SEALER = Sealer(KEY)

DAY = 86_400.0


async def _runs(store: MemoryCheckpointStore, count: int, status: str, at: float, tag: str = "") -> list[str]:
    run_ids = [f"{status}{tag}-{i}" for i in range(count)]
    for run_id in run_ids:
        await store.save(run_id, 0, SEALER.seal_checkpoint(run_id, 0, "mail", "running", 0, at - 1, {}))
        await store.save(run_id, 1, SEALER.seal_checkpoint(run_id, 1, "mail", status, 0, at, {}))
    return run_ids


def _tasks(store: MemoryCheckpointStore, settings: WorkerSettings) -> Any:
    return register_tasks(Celery("retention-logic"), FlowApp(Registry(), []), store_factory=lambda: store,
                          checkpoint_key=KEY, settings=settings)  # fmt: skip


async def test_a_prune_tick_deletes_old_finished_runs_in_bounded_batches() -> None:
    # Given 1,100 runs that ended two days ago, a paused one as old, and one that ended now
    store, now = MemoryCheckpointStore(), time.time()
    old = await _runs(store, 1100, "done", now - 2 * DAY)
    kept = await _runs(store, 1, "paused", now - 2 * DAY) + await _runs(store, 1, "failed", now)
    tasks = register_tasks(
        Celery("retention-logic"),
        FlowApp(Registry(), []),
        store_factory=lambda: store,
        checkpoint_key=KEY,
        settings=WorkerSettings(retention_days=1, retention_batches=2),
    )
    try:
        # When beat's prune task runs three times (two batches of 500 at most per tick)
        ticks = [await asyncio.to_thread(tasks.prune_finished) for _ in range(3)]
    finally:
        await asyncio.to_thread(tasks.bridge.close)
    # Then 1,000 went on the first tick, the last 100 on the second, none on the third
    assert ticks == [{"pruned": 1000, "rows": 2000}, {"pruned": 100, "rows": 200}, {"pruned": 0, "rows": 0}]
    assert sorted(await store.stored_runs()) == sorted(kept)
    assert not [run_id for run_id in old if await store.history(run_id)]


async def test_one_prune_tick_at_a_time() -> None:
    # Given a tick of another worker in progress (it holds the prune lock)
    store = MemoryCheckpointStore()
    await _runs(store, 3, "done", time.time() - 2 * DAY)
    await Markers(store, Sealer(KEY)).put(*PRUNE_LOCK, {"owner": "beat-tick@w2:7"}, WorkerSettings().recover_lock_s)
    tasks = register_tasks(
        Celery("retention-logic"),
        FlowApp(Registry(), []),
        store_factory=lambda: store,
        checkpoint_key=KEY,
        settings=WorkerSettings(retention_days=1),
    )
    try:
        # When this worker's tick comes, Then it leaves the work to that one
        result = await asyncio.to_thread(tasks.prune_finished)
    finally:
        await asyncio.to_thread(tasks.bridge.close)
    assert result == {"skipped": "another worker is pruning (beat-tick@w2:7)"}
    assert len(await store.stored_runs()) == 3


def test_beat_sends_the_prune_task_only_when_retention_is_set() -> None:
    def schedule(settings: WorkerSettings) -> dict[str, object]:
        app = Celery("retention-beat")
        tasks = register_tasks(app, FlowApp(Registry(), []), store_factory=MemoryCheckpointStore,
                               checkpoint_key=KEY, settings=settings)  # fmt: skip
        assert tasks.prune_finished.name == "agentflow.prune_finished"
        return dict(app.conf.beat_schedule or {})

    assert "agentflow-prune-finished" not in schedule(WorkerSettings())
    entry = schedule(WorkerSettings(retention_days=30, retention_interval_s=600))["agentflow-prune-finished"]
    assert entry == {
        "task": "agentflow.prune_finished",
        "schedule": 600,
        "options": {"expires": 595, "queue": "agentflow"},
    }
    # And a task sent while no retention is set says so and deletes nothing
    tasks = register_tasks(Celery("retention-off"), FlowApp(Registry(), []), store_factory=MemoryCheckpointStore,
                           checkpoint_key=KEY)  # fmt: skip
    try:
        assert tasks.prune_finished() == {"skipped": "no retention is set (retention_days, retention_trim_days)"}
    finally:
        tasks.bridge.close()
    # And trimming alone schedules the task too
    assert "agentflow-prune-finished" in schedule(WorkerSettings(retention_trim_days=1))


async def test_a_tick_prunes_then_trims_the_runs_past_each_age() -> None:
    # Given runs that ended 40 days ago, runs that ended 2 days ago, and runs that ended now (two checkpoints each)
    store, now = MemoryCheckpointStore(), time.time()
    month = await _runs(store, 3, "done", now - 40 * DAY, "-old")
    days = await _runs(store, 600, "failed", now - 2 * DAY, "-days")
    fresh = await _runs(store, 2, "done", now, "-now")
    tasks = _tasks(store, WorkerSettings(retention_days=30, retention_trim_days=1, retention_batches=1))
    try:
        # When beat's task runs twice (one batch of 500 of each per tick)
        ticks = [await asyncio.to_thread(tasks.prune_finished) for _ in range(2)]
    finally:
        await asyncio.to_thread(tasks.bridge.close)
    # Then the month-old runs went whole on the first tick, and the days-old ones were trimmed over two ticks
    assert ticks == [
        {"pruned": 3, "rows": 6, "trimmed": 500, "trimmed_rows": 500},
        {"pruned": 0, "rows": 0, "trimmed": 100, "trimmed_rows": 100},
    ]
    assert not [run_id for run_id in month if await store.history(run_id)]
    # And each trimmed run kept its newest checkpoint, the fresh ones kept both
    assert {len(await store.history(run_id)) for run_id in days} == {1}
    assert {len(await store.history(run_id)) for run_id in fresh} == {2}


def test_trimming_must_come_before_pruning() -> None:
    with pytest.raises(ValueError, match="trim_after_s .* must be shorter than keep_s"):
        WorkerSettings(retention_days=1, retention_trim_days=2)
    with pytest.raises(ValueError, match="retention_trim_days must be positive"):
        WorkerSettings(retention_trim_days=0)
    policy = WorkerSettings(retention_trim_days=7).retention()
    assert policy is not None and policy.keep_s is None and policy.trim_after_s == 7 * DAY


async def test_a_prune_tick_never_deletes_a_run_on_its_clear_fields_alone() -> None:
    # Given a paused run whose unsigned listing someone set to "done", two days old (two writes, no key)
    store, now = MemoryCheckpointStore(), time.time()
    (paused,) = await _runs(store, 1, "paused", now - 2 * DAY)
    forged = SEALER.seal_checkpoint(paused, 1, "mail", "paused", 0, now - 2 * DAY, {})
    store._checkpoints[paused][-1] = dataclasses.replace(forged, status="done")  # the signature no longer matches
    # When the retention beat ticks
    result = await asyncio.to_thread(_tasks(store, WorkerSettings(retention_days=1.0)).prune_finished)
    # Then the run is left, not deleted, and the tick says nothing was pruned
    assert result["pruned"] == 0
    assert [c.step for c in await store.history(paused)] == [0, 1]
