"""Trimming on every store set-up: a finished run keeps its newest checkpoint, and everything still works.

The store rules (only ended flow runs, none held, each judged again, atomic) are conformance
checks (`_conformance.trim`); these tests trim real runs of the ticket flow and hold every
reader to them: `read_run` (what ``runs show``, ``verify`` and the viewer read) says where
the history starts instead of reporting checkpoints missing, a retry of a trimmed failed
run replays its finished calls and runs none twice, a fork from a trimmed step is refused
naming the retention, and a history cut anywhere else is still reported. A run retried
between the trim's judgement and the store's trim keeps every checkpoint, on every set-up.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import prune_kit
import pytest
from _kit.stores import ALL_SETUPS, StoreSetup, setups
from _kit.tickets import KEY, ORDER, TOOLS, Order, Tickets, make_tickets, order_args, show_args
from prune_kit import CHECK

from agentflow import Call, Executor, Flow, FlowRunner
from agentflow._errors import CheckpointNotFound
from agentflow.exec.checkpoints import (
    CheckpointStore,
    MemoryCheckpointStore,
    RetentionPolicy,
    RetentionStore,
    Trimmed,
    TrimStore,
    trim_finished,
)
from agentflow.exec.checkpoints.forwarding import ForwardingStore
from agentflow.exec.checkpoints.retention import trimmable
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer

DAY, HOUR = 86_400.0, 3_600.0
#: Trim every finished run last saved before now.
NOW = RetentionPolicy(None, trim_after_s=0.0)


@pytest.mark.parametrize("store_setup", setups(*ALL_SETUPS), indirect=True)
def test_every_shipped_store_trims(store_setup: StoreSetup) -> None:
    # The conformance checks hold a store without TrimStore only to its refusal: every shipped one has it
    assert isinstance(store_setup.raw, TrimStore) and isinstance(store_setup.raw, RetentionStore)


async def test_trimmed_runs_read_back_healthy_from_their_kept_step(store_setup: StoreSetup) -> None:
    # Given old runs of every status (clones of a four-checkpoint ticket run) and recent finished ones
    store, rows, now = store_setup.raw, await prune_kit.template(), time.time()
    old = {f"old-{s}": s for s in ("done", "failed", "cancelled", "running", "paused")}
    for i, (run_id, status) in enumerate(old.items()):
        await prune_kit.write_clone(store, rows, run_id, now - DAY + i, status)
    await prune_kit.seed(store, rows, ["recent"], now)
    # When the finished runs older than an hour are trimmed, two per batch
    batches: list[Trimmed] = []
    trimmed = await trim_finished(
        store,
        RetentionPolicy(None, batch=2, trim_after_s=HOUR),
        on_batch=batches.append,
        check=CHECK,
    )
    # Then the three old finished runs were trimmed, three checkpoints each, and nothing else
    assert sorted(trimmed.run_ids) == ["old-cancelled", "old-done", "old-failed"]
    assert trimmed.rows == 9 and [len(b.run_ids) for b in batches] == [2, 1, 0]
    for run_id, status in old.items():
        report = await read_run(store, prune_kit.SEALER, run_id)
        # And each reads back healthy: no problem, its calls all there, the history from the kept step on
        assert not report.problems and report.status == status and report.records == 6
        kept = 3 if status in ("done", "failed", "cancelled") else 0
        assert report.kept_from == kept and report.checkpoints[0].step == kept
        assert [c.state for c in report.calls] == ["done"] * 3
    assert [c.step for c in (await read_run(store, prune_kit.SEALER, "recent")).checkpoints] == [0, 1, 2, 3]
    # And the trimmed runs are still listed, and none is listed for trimming again
    assert {cp.run_id for cp in await store.list_runs(None, 100)} == {*old, "recent"}
    assert await trimmable(store, now, ["done", "failed", "cancelled"], 100) == []


def _flaky_send(tickets: Tickets, broken: list[bool]) -> Flow[Order]:
    """The ticket flow whose send step fails while `broken` says so (before its effect: nothing was mailed)."""

    @tickets.registry.tool
    def mail_or_fail(show: str) -> str:
        if broken[0]:
            raise RuntimeError("the mail server is down")
        tickets.effect("email_tickets")
        return f"mailed {show}"

    return (
        Flow("tickets", state=Order)
        .node("hold", Call("hold_seats", args=order_args, into="held"))
        .node("pay", Call("charge_card", args=order_args, into="paid"))
        .node("send", Call("mail_or_fail", args=show_args, into="sent"))
        .edge("hold", "pay")
        .edge("pay", "send")
        .end("send")
    )


async def test_a_trimmed_failed_run_is_retried_and_runs_no_call_twice(store_setup: StoreSetup) -> None:
    # Given a run that failed in send, after the seats were held and the card charged
    tickets, broken = make_tickets(), [True]
    flow = _flaky_send(tickets, broken)
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store_setup.open(), checkpoint_key=KEY)
    failed = await runner.run(flow, ORDER, run_id="order-9")
    assert failed.status == "failed" and "mail server is down" in str(failed.error)
    step = failed.step
    # When retention trims it to its newest checkpoint
    trimmed = await trim_finished(store_setup.raw, NOW, now=time.time() + 1, check=CHECK)
    assert trimmed.run_ids == ("order-9",) and [cp.step for cp in await store_setup.history("order-9")] == [step]
    # And a fork from a trimmed step is refused, naming the retention
    with pytest.raises(CheckpointNotFound, match=f"retention trimmed its checkpoints before step {step}"):
        await runner.fork(flow, "order-9", at_step=1)
    # And, the mail server back, an operator retries it
    broken[0] = False
    again = FlowRunner(Executor(tickets.registry), checkpoints=store_setup.open(), checkpoint_key=KEY)
    result = await again.retry(flow, "order-9", operator="hal")
    # Then it finishes: hold and pay replayed from the call log (one effect each), the mail sent once
    assert result.status == "done" and result.state.sent == "mailed Hamlet"
    assert tickets.counts("order-9") == dict.fromkeys(TOOLS, 1)
    assert tickets.ledger.repeated() == {}
    # And it reads back healthy from the kept step, its retry shown, and it may be trimmed again
    report = await read_run(store_setup.raw, Sealer(KEY), "order-9")
    assert not report.problems and report.kept_from == step and report.checkpoints[0].step == step
    assert [c.state for c in report.calls] == ["done", "done", "done"]
    assert (await trim_finished(store_setup.raw, NOW, now=time.time() + 1, check=CHECK)).run_ids == ("order-9",)
    assert len(await store_setup.history("order-9")) == 1


@pytest.mark.parametrize("store_setup", setups(*ALL_SETUPS), indirect=True)
async def test_a_run_retried_after_it_was_judged_is_not_trimmed_whatever_its_fields_in_clear_say(
    store_setup: StoreSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two runs that failed a day ago
    store, rows, now = store_setup.raw, await prune_kit.template(), time.time()
    await prune_kit.seed(store, rows, ["retried", "left"], now - DAY, "failed")

    # And, once the trim has judged their signed newest checkpoints and before the store trims them, a retry of one
    # saves its claim (a new step, running), and someone without the key sets what the store keeps in clear of that
    # run back to "failed, a day ago"
    async def retry_then_forge() -> None:
        await prune_kit.retry_claim(store, "retried")
        await store_setup.rows.set_clear("retried", "failed", now - DAY)

    fired = prune_kit.between_judgement_and_store(monkeypatch, "trim", retry_then_forge)
    # When the finished runs older than an hour are trimmed
    trimmed = await trim_finished(store, RetentionPolicy(None, trim_after_s=HOUR), check=CHECK)
    # Then the retried run keeps every checkpoint, the claim its newest: the store compared it with the row judged
    assert fired and trimmed.run_ids == ("left",)
    assert [cp.step for cp in await store_setup.history("retried")] == [0, 1, 2, 3, 4]
    assert await store_setup.rows.counts("retried") == (5, 6)
    assert [cp.step for cp in await store_setup.history("left")] == [3]


async def _cut(store: MemoryCheckpointStore, run_id: str, keep: Sequence[int]) -> None:
    """Delete checkpoints behind the store's back, keeping the steps `keep` (a memory store's own rows)."""
    store._checkpoints[run_id] = [cp for cp in store._checkpoints[run_id] if cp.step in keep]


async def test_a_history_cut_anywhere_but_at_an_end_is_still_reported_missing() -> None:
    # Given three finished clones, and a paused one
    store, rows, now = MemoryCheckpointStore(), await prune_kit.template(), time.time()
    await prune_kit.seed(store, rows, ["gap", "late", "loop"], now - DAY)
    await prune_kit.write_clone(store, rows, "paused", now - DAY, "paused")
    # When checkpoints are deleted as no trim deletes them: a gap, a prefix of a paused run, a loop's prefix
    await _cut(store, "gap", [0, 1, 3])
    await _cut(store, "paused", [2, 3])
    await _cut(store, "late", [2, 3])  # starts at a running checkpoint, not the ended one a trim keeps
    loop = store._checkpoints["loop"]
    last = loop[-1]
    store._checkpoints["loop"] = [
        prune_kit.SEALER.seal_encoded_checkpoint("loop", last.step, "loop:tickets", "done", 0, last.saved_at, b"{}")
    ]
    # Then each is reported with the missing checkpoint, as before trimming existed
    for run_id, missing in (("gap", 2), ("paused", 0), ("late", 0), ("loop", 0)):
        report = await read_run(store, prune_kit.SEALER, run_id)
        assert report.kept_from == 0
        assert any(f"checkpoint {missing} of run {run_id!r} is missing" in p for p in report.problems), report.problems


async def test_a_store_without_trim_is_refused_clearly_and_keeps_every_checkpoint() -> None:
    inner = MemoryCheckpointStore()
    await prune_kit.seed(inner, await prune_kit.template(), ["r1"], time.time() - DAY)
    store: CheckpointStore = ForwardingStore(inner)  # forwards no trim
    with pytest.raises(NotImplementedError, match="ForwardingStore cannot trim runs: it has no trimmable and trim"):
        await trim_finished(store, NOW, check=CHECK)
    assert len(await inner.history("r1")) == 4


async def test_trim_finished_pages_on_past_held_runs_and_stops() -> None:
    # Given nine old finished runs, three of them held by a live worker, all saved at the same instant
    store, rows, at = MemoryCheckpointStore(), await prune_kit.template(), time.time() - DAY
    run_ids = [f"r{i}" for i in range(9)]
    await prune_kit.seed(store, rows, run_ids, at)
    for run_id in run_ids[:3]:
        await store.take_lease(run_id, "a worker", f"token-{run_id}", 60.0)
    # When they are trimmed two per batch, Then the six free ones are, and the loop ends (no endless relisting)
    trimmed = await trim_finished(store, RetentionPolicy(None, batch=2, trim_after_s=HOUR), check=CHECK)
    assert sorted(trimmed.run_ids) == run_ids[3:]
    # And a bounded pass trims at most its batches
    await prune_kit.seed(store, rows, ["s1", "s2", "s3"], at + 1)
    bounded = await trim_finished(store, RetentionPolicy(None, batch=1, trim_after_s=HOUR), max_batches=2, check=CHECK)
    assert bounded.run_ids == ("s1", "s2")


def test_a_policy_prunes_trims_or_both_and_says_what_is_wrong() -> None:
    both = RetentionPolicy.days(30, trim_after_days=1)
    assert (both.keep_s, both.trim_after_s) == (30 * DAY, DAY)
    assert both.trim_cut_off(now=DAY) == 0.0 and both.cut_off(now=30 * DAY) == 0.0
    trim_only = RetentionPolicy.days(None, trim_after_days=7)
    assert trim_only.keep_s is None
    with pytest.raises(ValueError, match="prunes no run"):
        trim_only.cut_off()
    with pytest.raises(ValueError, match="trims no run"):
        RetentionPolicy.days(30).trim_cut_off()
    with pytest.raises(ValueError, match="needs keep_s .*, trim_after_s .*, or both"):
        RetentionPolicy(None)
    with pytest.raises(ValueError, match="must be shorter than keep_s"):
        RetentionPolicy.days(1, trim_after_days=1)
    with pytest.raises(ValueError, match="trim_after_s must be a number of seconds"):
        RetentionPolicy(None, trim_after_s=-1.0)


@pytest.mark.redis
@pytest.mark.slow
async def test_trim_on_redis_cluster_touches_only_each_runs_slot(redis_cluster: list[int]) -> None:
    import redis.asyncio

    from agentflow.exec.checkpoints import RedisCheckpointStore

    # Given finished runs spread over the three nodes of a Redis Cluster
    cluster = redis.asyncio.RedisCluster(host="127.0.0.1", port=redis_cluster[0])
    rows, now = await prune_kit.template(), time.time()
    run_ids = [f"c{i}" for i in range(30)]
    async with RedisCheckpointStore(lambda: cluster, prefix="tr") as store:
        await prune_kit.seed(store, rows, run_ids, now - DAY)
        # When they are trimmed, 12 per batch (each run's script on its node)
        trimmed = await trim_finished(store, RetentionPolicy(None, batch=12, trim_after_s=HOUR), check=CHECK)
        # Then every run was trimmed, reads back healthy from its kept step, and is still listed
        assert len(trimmed.run_ids) == 30 and trimmed.rows == 30 * 3
        for run_id in run_ids:
            assert await prune_kit.whole_or_trimmed(store, run_id) == "trimmed"
        assert sorted(cp.run_id for cp in await store.list_runs(None, 100)) == sorted(run_ids)
        assert await cluster.zcard("tr:runs") == 30
