"""A worker's metrics in-process: calls in doubt, the runs waiting for a person, refusals, the timed store."""

from __future__ import annotations

import time

import pytest
from celery import Celery
from worker_kit import KEY, Setup

from agentflow.celery import register_tasks
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.exec.checkpoints.conformance import validate
from agentflow.exec.checkpoints.forwarding import ForwardingStore
from agentflow.observe import Metrics


def watched(s: Setup) -> Metrics:
    metrics = Metrics()
    metrics.prime(s.app)
    metrics.watch(s.worker.events)
    return metrics


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_a_parked_run_counts_its_calls_in_doubt_once_and_a_refused_message_by_its_cause(s):
    metrics = watched(s)
    # When a worker parks a run on its call of send (in doubt), and a recheck finds it parked again
    step = await s.parked()
    again = await s.worker.superstep("mail", "r1", step, handoff=False, cause="recheck")
    assert again.done == "decision"
    # Then the call in doubt was counted once, under its tool
    assert value(metrics, "agentflow_calls_in_doubt_total", tool="send") == 1
    # And when a rerun message arrives that no signed decision backs, its refusal is counted under its cause
    out = await s.worker.superstep("mail", "r1", step, handoff=False, cause="rerun")
    assert out.done == "refused"
    assert value(metrics, "agentflow_control_refused_total", kind="rerun") == 1
    assert value(metrics, "agentflow_control_refused_total", kind="recheck") == 0


async def test_a_sweep_sets_the_runs_waiting_for_a_person_by_flow_and_why(s):
    metrics = watched(s)
    # Given a mail run parked on a call in doubt, and a wires run paused for an approval
    await s.parked("m1")
    paused = await s.worker.superstep("wires", "w1", await s.start("wires", "w1"), handoff=True)
    assert paused.status == "paused"
    before = time.time()
    # When a recover_all sweeps the unfinished runs
    found = await s.worker.stranded()
    assert found is not None and found.recover == []
    # Then each waiting run is counted under its flow and why, with how long it waited, and the sweep's time
    assert value(metrics, "agentflow_runs_waiting_for_decision", flow="mail", why="in_doubt") == 1
    assert value(metrics, "agentflow_runs_waiting_for_decision", flow="wires", why="approval") == 1
    assert value(metrics, "agentflow_runs_waiting_for_decision", flow="mail", why="approval") == 0
    waited = value(metrics, "agentflow_decision_wait_oldest_seconds", flow="wires", why="approval")
    assert waited is not None and 0 <= waited < 60
    assert (value(metrics, "agentflow_sweep_timestamp_seconds") or 0) >= before
    # And when the paused run is cancelled, the next sweep says nobody waits for an approval
    await s.worker.runner.cancel(s.app.flow("wires"), "w1", reason="no", operator="alice")
    await s.worker.stranded()
    assert value(metrics, "agentflow_runs_waiting_for_decision", flow="wires", why="approval") == 0
    assert value(metrics, "agentflow_decision_wait_oldest_seconds", flow="wires", why="approval") == 0


async def test_a_sweep_sets_the_unfinished_runs_and_the_oldest_ones_age_by_flow(s):
    metrics = watched(s)
    # Given a wires run paused for an approval, started now (its checkpoints carry when)
    before = time.time()
    await s.worker.superstep("wires", "w1", await s.start("wires", "w1"), handoff=True)
    # When a recover_all sweeps, Then it counts the run under its flow, with its age from its start
    await s.worker.stranded()
    assert value(metrics, "agentflow_runs_unfinished", flow="wires") == 1
    assert value(metrics, "agentflow_runs_unfinished", flow="mail") == 0
    age = value(metrics, "agentflow_unfinished_run_oldest_seconds", flow="wires")
    assert age is not None and 0 <= age <= time.time() - before + 1
    # And once the run ended, the next sweep finds none
    await s.worker.runner.cancel(s.app.flow("wires"), "w1", reason="no", operator="alice")
    await s.worker.stranded()
    assert value(metrics, "agentflow_runs_unfinished", flow="wires") == 0
    assert value(metrics, "agentflow_unfinished_run_oldest_seconds", flow="wires") == 0


def test_a_worker_times_its_store_when_hooked_before_its_first_task():
    # Given a worker whose store is hooked before it made one
    store = MemoryCheckpointStore()
    tasks = register_tasks(Celery("t"), Setup().app, store_factory=lambda: store, checkpoint_key=KEY)
    metrics = Metrics()
    tasks.worker.hook_store(metrics.store_hook)
    # Then the worker's store is one forwarding store over the store the factory made, with the hook
    made = tasks.worker.store
    assert isinstance(made, ForwardingStore) and made.inner is store and made.hooks == (metrics.store_hook,)
    # and once the store exists, hooking it again is refused
    with pytest.raises(RuntimeError, match="hook it before"):
        tasks.worker.hook_store(metrics.store_hook)


async def test_the_timed_store_keeps_every_rule_of_the_store_it_wraps():
    # Given memory stores with the metrics' store hook
    metrics = Metrics()
    # When the stores' conformance suite runs on them
    report = await validate(lambda: ForwardingStore(MemoryCheckpointStore(), [metrics.store_hook]))
    # Then every rule holds through the wrapper, and the operations were timed by name
    assert {name: why for name, why in report.items() if why} == {}
    assert (value(metrics, "agentflow_store_seconds_count", op="save") or 0) > 0
    assert (value(metrics, "agentflow_store_seconds_count", op="take_lease") or 0) > 0
    assert value(metrics, "agentflow_store_seconds_count", op="append_events") is None  # event streams go untimed


def test_a_timed_store_keeps_event_streams_exactly_when_the_store_it_wraps_does():
    from types import SimpleNamespace

    from agentflow.exec.run.events import stream_of

    hook = Metrics().store_hook
    # Given a timed store over a store with event streams, and one over a store without (asked in both orders)
    with_events = ForwardingStore(MemoryCheckpointStore(), [hook])
    without = ForwardingStore(SimpleNamespace(in_process=True), [hook])  # no event streams
    # Then each answers for what it wraps, whatever was asked before: the answer is not kept per class
    assert [stream_of(without), stream_of(with_events), stream_of(without)] == [None, with_events, None]
    # and a store's own class answers the same every time, no store at all being none
    memory = MemoryCheckpointStore()
    assert stream_of(memory) is memory and stream_of(memory) is memory and stream_of(None) is None


def test_a_timed_store_has_each_optional_part_exactly_when_the_store_it_wraps_does(redis_url):
    from redis.asyncio import Redis

    from agentflow.exec.checkpoints.protocol import (
        BookkeepingReading,
        DurabilityConfirming,
        EventCompacting,
        HeadReading,
        LeaseMoving,
        RetentionStore,
        has_part,
    )
    from agentflow.exec.checkpoints.redis import RedisCheckpointStore

    hook = Metrics().store_hook
    # Given timed stores over the memory store (moves leases, nothing else optional) and over Redis (every part)
    over_memory = ForwardingStore(MemoryCheckpointStore(), [hook])
    over_redis = ForwardingStore(RedisCheckpointStore(lambda: Redis.from_url(redis_url), prefix="t-parts"), [hook])
    parts = (HeadReading, LeaseMoving, DurabilityConfirming, EventCompacting, BookkeepingReading)
    # Then each answers for what it wraps, asked again and in either order (the answer is kept per store)
    for _ in range(2):
        assert [has_part(over_memory, part) for part in parts] == [False, True, False, False, False]
        assert [has_part(over_redis, part) for part in parts] == [True, True, True, True, True]
    # but retention is never forwarded: a prune opens the store itself
    assert not has_part(over_redis, RetentionStore)


async def test_a_worker_timed_and_traced_wraps_its_store_once_with_both_hooks():
    from agentflow.exec.checkpoints.conformance import SEALER
    from agentflow.observe import Tracing, trace_worker

    # Given a worker traced, then timed, before its first task
    store = MemoryCheckpointStore()
    tasks = register_tasks(Celery("t"), Setup().app, store_factory=lambda: store, checkpoint_key=KEY)
    tracing = trace_worker(tasks.worker, Tracing())
    metrics = Metrics()
    tasks.worker.hook_store(metrics.store_hook)
    # Then its store is one forwarding store over the one the factory made, tracing outermost
    made = tasks.worker.store
    assert isinstance(made, ForwardingStore) and made.inner is store
    assert made.hooks == (tracing.store_hook, metrics.store_hook)
    # and an operation through it is timed once
    await made.save("r-1", 0, SEALER.seal_checkpoint("r-1", 0, "audit", "running", 0, 1000.0, {}))
    assert value(metrics, "agentflow_store_seconds_count", op="save") == 1
