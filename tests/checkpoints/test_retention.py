"""Retention on every store set-up: old finished runs pruned whole, in batches; nothing else touched.

The rules themselves (only ended runs, none held, each judged again) are conformance checks
(`_conformance.retention`, `_conformance.trim`); these tests prune real runs (clones of one
ticket run, so every run left reads back healthy through `read_run`) on every set-up, count
rows before and after, kill a prune (and a trim) midway on the stores another process
shares, and show a reader racing a prune sees the run whole or not at all, and that a run
saved again between the prune's judgement and the store's delete is kept on every set-up,
however its fields in clear were set. What a trim
keeps working (reads, retry, fork's refusal) is tests/checkpoints/test_trim.py.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Collection, Sequence
from pathlib import Path

import prune_kit
import pytest
from _kit.stores import MemoryRows, StoreSetup, child_env, setups
from prune_kit import CHECK

from agentflow._errors import CheckpointConflict, CheckpointNotFound
from agentflow.exec.checkpoints import (
    MemoryCheckpointStore,
    Pruned,
    RetentionPolicy,
    SealedCall,
    Trimmed,
    prune_finished,
    retention,
    trim_finished,
)
from agentflow.exec.checkpoints.records import ENDED, judged_row
from agentflow.exec.run.read import read_run

WORKER = Path(__file__).with_name("prune_kit.py")
#: A run's keys in Redis (its lease has none while nobody holds it).
RUN_PARTS = ("cp", "latest", "calls", "next")
#: Old runs are saved a day ago, recent ones now; the policy keeps an hour.
DAY, HOUR = 86_400.0, 3_600.0


async def _counts(setup: StoreSetup, run_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
    return {run_id: await setup.rows.counts(run_id) for run_id in run_ids}


async def test_prune_deletes_old_finished_runs_whole_and_leaves_the_rest(store_setup: StoreSetup) -> None:
    # Given old runs of every status, and recent finished ones
    store, rows, now = store_setup.raw, await prune_kit.template(), time.time()
    statuses = ["done"] * 4 + ["failed"] * 2 + ["cancelled"] * 2 + ["running"] * 2 + ["paused"] * 2
    old = {f"old-{i}-{status}": status for i, status in enumerate(statuses)}
    for i, (run_id, status) in enumerate(old.items()):
        await prune_kit.write_clone(store, rows, run_id, now - DAY + i, status)
    recent = [f"recent-{i}" for i in range(2)]
    await prune_kit.seed(store, rows, recent, now)
    kept = [r for r, s in old.items() if s not in ENDED] + recent
    before = await _counts(store_setup, kept)
    assert len(await store.stored_runs()) == 14
    # When the finished runs older than an hour are pruned, three runs per batch
    batches: list[Pruned] = []
    pruned = await prune_finished(store, RetentionPolicy(HOUR, batch=3), on_batch=batches.append, check=CHECK)
    # Then the eight old finished runs went, with all their rows, in three full batches and a last one
    ended = sorted(r for r, s in old.items() if s in ENDED)
    assert sorted(pruned.run_ids) == ended
    assert pruned.rows == 8 * prune_kit.ROWS_PER_RUN
    assert [len(b.run_ids) for b in batches] == [3, 3, 2, 0]
    assert sorted(await store.stored_runs()) == sorted(kept)
    for run_id in ended:
        assert await store_setup.rows.counts(run_id) == (0, 0)
        with pytest.raises(CheckpointNotFound):
            await read_run(store, prune_kit.SEALER, run_id)
    # And the running, paused and recent runs are exactly as they were
    assert await _counts(store_setup, kept) == before
    for run_id in recent:
        assert await prune_kit.whole_or_gone(store, run_id) == "whole"
    # And a pruned id starts afresh, with no old row in sight
    await prune_kit.write_clone(store, rows, ended[0], now)
    assert await store_setup.rows.counts(ended[0]) == (4, 6)
    assert await prune_kit.whole_or_gone(store, ended[0]) == "whole"


async def test_a_half_deleted_run_takes_no_step_zero(store_setup: StoreSetup) -> None:
    # Given a finished run whose checkpoints a careless pruner deleted, leaving its call log
    store, rows = store_setup.raw, await prune_kit.template()
    await prune_kit.write_clone(store, rows, "half", time.time() - DAY)
    for cp in reversed(await store.history("half")):
        await store_setup.rows.drop_checkpoint(cp)
    # When the id is started again, Then the store refuses (the old records would be read as the new run's)
    first = prune_kit.SEALER.seal_encoded_checkpoint("half", 0, rows[0][0].flow, "running", 0, time.time(), b"{}")
    with pytest.raises(CheckpointConflict, match="already has stored rows"):
        await store.save("half", 0, first)
    assert len(await store.calls("half")) == 6


class PrunedWhileRead(MemoryCheckpointStore):
    """A store whose run is pruned between a reader's read of the checkpoints and of the call log."""

    async def calls(self, run_id: str) -> Sequence[SealedCall]:
        await self.prune([run_id], time.time(), ENDED, "pruner")
        return await super().calls(run_id)


async def test_a_run_pruned_while_it_is_read_reads_as_gone() -> None:
    # Given a finished run, and a prune that lands between the reader's two reads
    store = PrunedWhileRead()
    await prune_kit.write_clone(store, await prune_kit.template(), "raced", time.time() - DAY)
    # When it is read, Then it is gone (not a corrupt run: checkpoints without their log)
    with pytest.raises(CheckpointNotFound, match="deleted while it was read"):
        await read_run(store, prune_kit.SEALER, "raced")


async def test_prune_stops_after_max_batches() -> None:
    store, now = MemoryCheckpointStore(), time.time()
    await prune_kit.seed(store, await prune_kit.template(), [f"r{i}" for i in range(5)], now - DAY)
    # When at most two batches of two may run, Then four runs go and one is left for the next time
    pruned = await prune_finished(store, RetentionPolicy(HOUR, batch=2), max_batches=2, check=CHECK)
    assert len(pruned.run_ids) == 4 and len(await store.stored_runs()) == 1


@pytest.mark.parametrize("store_setup", setups(), indirect=True)
async def test_a_run_retried_after_it_was_judged_is_not_pruned_whatever_its_fields_in_clear_say(
    store_setup: StoreSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two runs that failed a day ago
    store, rows, now = store_setup.raw, await prune_kit.template(), time.time()
    await prune_kit.seed(store, rows, ["retried", "left"], now - DAY, "failed")

    # And, once the prune has judged their signed newest checkpoints and before the store deletes them, a retry of
    # one saves its claim (a new step, running), and someone without the key sets what the store keeps in clear of
    # that run back to "failed, a day ago"
    async def retry_then_forge() -> None:
        await prune_kit.retry_claim(store, "retried")
        await store_setup.rows.set_clear("retried", "failed", now - DAY)

    fired = prune_kit.between_judgement_and_store(monkeypatch, "prune", retry_then_forge)
    # When the finished runs older than an hour are pruned
    pruned = await prune_finished(store, RetentionPolicy(HOUR), check=CHECK)
    # Then the retried run is kept whole, its claim the newest row: the store compared that row with the one judged
    assert fired and pruned.run_ids == ("left",)
    assert await store_setup.rows.counts("retried") == (5, 6)
    assert [cp.step for cp in await store.history("retried")] == [0, 1, 2, 3, 4]
    assert await store_setup.rows.counts("left") == (0, 0)
    # And a prune run again leaves it too: its newest row says running, or (its status rewritten) no longer checks
    again = await prune_finished(store, RetentionPolicy(HOUR), check=CHECK)
    assert not again.run_ids and set(dict(again.refused)) <= {"retried"}
    assert await store_setup.rows.counts("retried") == (5, 6)


@pytest.mark.parametrize("store_setup", setups(), indirect=True)
async def test_a_retry_moved_aside_without_a_delete_keeps_its_run_and_is_reported(store_setup: StoreSetup) -> None:
    # Given a run that failed a day ago and was retried since: the retry claimed it (step 4, segment 4), logged
    # charge_card as started and died, so the call is in doubt
    store, rows, now = store_setup.raw, await prune_kit.template(), time.time()
    await prune_kit.seed(store, rows, ["retried", "left"], now - DAY, "failed")
    started = await prune_kit.retry_in_doubt(store, "retried")
    # And someone without the key moved the retry's checkpoint aside with no DEL or DELETE (SQL: its step set back
    # by 1000 and the runs row pointed at step 3; Redis: RPOP, HSET of the latest hash, ZADD of the index), so the
    # signed "failed, a day ago" row looks like the newest again
    await store_setup.rows.hide_after("retried", 3)
    assert [cp.step for cp in await store.history("retried")][-1] == 3
    # When the finished runs older than an hour are trimmed, then pruned
    policy = RetentionPolicy(HOUR, trim_after_s=HOUR / 2)
    trimmed = await trim_finished(store, policy, check=CHECK)
    pruned = await prune_finished(store, policy, check=CHECK)
    # Then the run is left untrimmed, its in-doubt started record stored, and both say why
    assert "retried" not in trimmed.run_ids and "retried" not in pruned.run_ids and "left" in pruned.run_ids
    assert [cp.step for cp in await store.history("retried") if cp.step >= 0] == [0, 1, 2, 3]
    assert (await store.calls("retried"))[-1] == started
    for report in (trimmed, pruned):
        why = dict(report.refused)["retried"]
        assert "segment 4" in why and "removed or rewritten" in why, why


class BeforeJudged(MemoryCheckpointStore):
    """A store whose prune and trim were written before the port passed them the rows judged."""

    async def prune(  # type: ignore[override]
        self, run_ids: Sequence[str], before: float, statuses: Collection[str], owner: str
    ) -> Pruned:
        return await super().prune(run_ids, before, statuses, owner)

    async def trim(  # type: ignore[override]
        self, run_ids: Sequence[str], before: float, statuses: Collection[str]
    ) -> Trimmed:
        return await super().trim(run_ids, before, statuses)


async def test_a_store_that_cannot_be_told_the_judged_rows_is_pruned_generically_and_refused_a_trim() -> None:
    # Given two failed runs judged a day after they ended, on a store whose prune and trim take no judged rows
    store, now = BeforeJudged(), time.time()
    await prune_kit.seed(store, await prune_kit.template(), ["retried", "left"], now - DAY, "failed")
    judged = {run_id: judged_row(await store.latest(run_id)) for run_id in ("retried", "left")}
    # And one of them retried since, its fields in clear set back to "failed, a day ago"
    await prune_kit.retry_claim(store, "retried")
    await MemoryRows(store).set_clear("retried", "failed", now - DAY)
    # When the runs are trimmed with the rows judged, Then the store is refused: it could not compare them
    with pytest.raises(NotImplementedError, match="takes no judged rows"):
        await retention.trim(store, ["retried", "left"], now - HOUR, ENDED, judged)
    # When they are pruned with the rows judged, Then the generic prune compares them: the retried run stays
    pruned = await retention.prune(store, ["retried", "left"], now - HOUR, ENDED, "pruner", judged)
    assert pruned.run_ids == ("left",) and len(await store.history("retried")) == 5
    # And judged rows that name no row are refused
    with pytest.raises(ValueError, match="as \\(step, sig\\)"):
        await retention.prune(MemoryCheckpointStore(), ["retried"], now, ENDED, "pruner", {"retried": (1, "")})


def test_a_policy_keeps_unfinished_runs_and_says_what_is_wrong() -> None:
    assert RetentionPolicy.days(30).keep_s == 30 * DAY
    assert RetentionPolicy.days(1).cut_off(now=DAY) == 0.0
    with pytest.raises(ValueError, match="never running or paused"):
        RetentionPolicy(DAY, frozenset({"done", "running"}))
    with pytest.raises(ValueError, match="keep_s"):
        RetentionPolicy(-1.0)
    with pytest.raises(ValueError, match="batch"):
        RetentionPolicy(DAY, batch=0)


#: Runs a killed prune works on, and how many it deletes per batch (PostgreSQL commits cost more: fewer runs).
KILLED = {"sqlite": (600, 1), "redis": (600, 1), "sql-postgres": (200, 2)}
#: The same for a trim (each run is read back whole or trimmed: fewer of them keep the test short).
TRIM_KILLED = {"sqlite": (300, 1), "redis": (300, 1), "sql-postgres": (100, 1)}


async def _kill_after_first_batch(spec: str, before: float, batch: int, mode: str) -> None:
    """Start ``prune_kit.py`` (prune or trim) in another process and SIGKILL it once its first batch is done."""
    worker = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), spec, repr(before), str(batch), mode,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=child_env(),
    )  # fmt: skip
    assert worker.stdout is not None and worker.stderr is not None
    try:
        assert (await asyncio.wait_for(worker.stdout.readline(), 60)).strip() == b"ready"
        first = await asyncio.wait_for(worker.stdout.readline(), 60)
        worker.kill()
    finally:
        if worker.returncode is None:
            worker.kill()
        await worker.wait()
    assert first.startswith(b"batch "), (first, await worker.stderr.read())


@pytest.mark.slow
@pytest.mark.parametrize("store_setup", setups("sqlite", "redis", "sql-postgres"), indirect=True)
async def test_a_prune_killed_midway_leaves_every_run_whole_or_gone(store_setup: StoreSetup) -> None:
    assert store_setup.spec is not None
    # Given many finished runs
    store, now = store_setup.raw, time.time()
    count, batch = KILLED[store_setup.name]
    run_ids = [f"k{i:04d}" for i in range(count)]
    await prune_kit.seed(store, await prune_kit.template(), run_ids, now - DAY)
    # When a prune in another process is SIGKILLed once its first batch is done
    await _kill_after_first_batch(store_setup.spec, now - HOUR, batch, "prune")
    # Then it was cut off midway, and every run is whole or gone: none half-pruned
    found = [await prune_kit.whole_or_gone(store, run_id) for run_id in run_ids]
    assert 0 < found.count("gone") < count, "the prune was not cut off midway"
    assert sorted(await store.stored_runs()) == [r for r, f in zip(run_ids, found, strict=True) if f == "whole"]
    # And no lease a pruner took is left to block the runs; a prune run again finishes the job
    assert not await store.leases(run_ids)
    await prune_finished(store, RetentionPolicy(HOUR, batch=200), check=CHECK)
    assert not await store.stored_runs()


@pytest.mark.slow
@pytest.mark.parametrize("store_setup", setups("sqlite", "redis", "sql-postgres"), indirect=True)
async def test_a_trim_killed_midway_leaves_every_run_whole_or_trimmed(store_setup: StoreSetup) -> None:
    assert store_setup.spec is not None
    # Given many finished runs of four checkpoints each
    store, now = store_setup.raw, time.time()
    count, batch = TRIM_KILLED[store_setup.name]
    run_ids = [f"t{i:04d}" for i in range(count)]
    await prune_kit.seed(store, await prune_kit.template(), run_ids, now - DAY)
    # When a trim in another process is SIGKILLed once its first batch is done
    await _kill_after_first_batch(store_setup.spec, now - HOUR, batch, "trim")
    # Then it was cut off midway, and every run reads back healthy: untouched, or its newest checkpoint and log
    found = [await prune_kit.whole_or_trimmed(store, run_id) for run_id in run_ids]
    assert 0 < found.count("trimmed") < count, "the trim was not cut off midway"
    assert sorted(await store.stored_runs()) == run_ids
    # And a trim run again finishes the job, leaving every run listed and readable
    policy = RetentionPolicy(None, batch=200, trim_after_s=HOUR)
    await trim_finished(store, policy, check=CHECK)
    assert {len(await store.history(run_id)) for run_id in run_ids} == {1}
    assert await prune_kit.whole_or_trimmed(store, run_ids[-1]) == "trimmed"
    assert {cp.run_id for cp in await store.list_runs(None, 10_000)} >= set(run_ids)


@pytest.mark.redis
@pytest.mark.slow
async def test_prune_on_redis_cluster_leaves_no_key_and_no_index_entry(redis_cluster: list[int]) -> None:
    import redis.asyncio

    from agentflow.exec.checkpoints import RedisCheckpointStore

    # Given finished runs spread over the three nodes of a Redis Cluster, and a running one
    cluster = redis.asyncio.RedisCluster(host="127.0.0.1", port=redis_cluster[0])
    rows, now = await prune_kit.template(), time.time()
    async with RedisCheckpointStore(lambda: cluster, prefix="pr") as store:
        await prune_kit.seed(store, rows, [f"c{i}" for i in range(40)], now - DAY)
        await prune_kit.write_clone(store, rows, "moving", now - DAY, "running")
        # When they are pruned, 15 per batch (each run's script on its node, the indexes after it)
        pruned = await prune_finished(store, RetentionPolicy(HOUR, batch=15), check=CHECK)
        # Then every finished run's keys and index entries are gone; the running one is whole and listed
        assert len(pruned.run_ids) == 40 and pruned.rows == 40 * prune_kit.ROWS_PER_RUN
        assert await store.stored_runs() == ["moving"]
        flow = rows[0][0].flow
        for index in ("pr:runs", f"pr:runs:{flow}", f"pr:unfinished:{flow}"):
            assert await cluster.zrange(index, 0, -1) == [b"moving"], index
        keys = {key.decode() async for key in cluster.scan_iter(match="pr:*", count=1000)}
        assert {key for key in keys if ":run:{" in key} == {f"pr:run:{{moving}}:{part}" for part in RUN_PARTS}
