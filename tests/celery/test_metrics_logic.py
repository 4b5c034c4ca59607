"""A worker's metrics in-process: calls in doubt, the runs waiting for a person, refusals, the timed store."""

from __future__ import annotations

import time

import pytest
from celery import Celery
from prometheus_client import CollectorRegistry, Histogram
from worker_kit import KEY, Setup

from agentflow.celery import register_tasks
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.exec.checkpoints.conformance import validate
from agentflow.observe import Metrics, TimedStore


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


def test_a_worker_times_its_store_when_wrapped_before_its_first_task():
    # Given a worker whose store is wrapped before it made one
    store = MemoryCheckpointStore()
    tasks = register_tasks(Celery("t"), Setup().app, store_factory=lambda: store, checkpoint_key=KEY)
    histogram = Histogram("t_store_seconds", "t", ("op",), registry=CollectorRegistry())
    tasks.worker.wrap_store(lambda inner: TimedStore(inner, histogram))
    # Then the worker's store is the timed one, over the store the factory made
    assert isinstance(tasks.worker.store, TimedStore) and tasks.worker.store.inner is store
    # and once the store exists, wrapping it again is refused
    with pytest.raises(RuntimeError, match="wrap it before"):
        tasks.worker.wrap_store(lambda inner: inner)


async def test_the_timed_store_keeps_every_rule_of_the_store_it_wraps():
    # Given memory stores wrapped in TimedStore
    registry = CollectorRegistry()
    histogram = Histogram("t_store_seconds", "t", ("op",), registry=registry)
    # When the stores' conformance suite runs on them
    report = await validate(lambda: TimedStore(MemoryCheckpointStore(), histogram))
    # Then every rule holds through the wrapper, and the operations were timed by name
    assert {name: why for name, why in report.items() if why} == {}
    assert (registry.get_sample_value("t_store_seconds_count", {"op": "save"}) or 0) > 0
    assert (registry.get_sample_value("t_store_seconds_count", {"op": "take_lease"}) or 0) > 0


def test_a_timed_store_keeps_event_streams_exactly_when_the_store_it_wraps_does():
    from types import SimpleNamespace

    from agentflow.exec.run.events import stream_of

    histogram = Histogram("t_events_seconds", "t", ("op",), registry=CollectorRegistry())
    # Given a timed store over a store with event streams, and one over a store without (asked in both orders)
    with_events = TimedStore(MemoryCheckpointStore(), histogram)
    without = TimedStore(SimpleNamespace(in_process=True), histogram)  # a store with no event streams
    # Then each answers for what it wraps, whatever was asked before: the answer is not kept per class
    assert [stream_of(without), stream_of(with_events), stream_of(without)] == [None, with_events, None]
    # and a store's own class answers the same every time, no store at all being none
    memory = MemoryCheckpointStore()
    assert stream_of(memory) is memory and stream_of(memory) is memory and stream_of(None) is None


def test_a_timed_store_has_each_optional_part_exactly_when_the_store_it_wraps_does(redis_url):
    from redis.asyncio import Redis

    from agentflow.exec.checkpoints.protocol import HeadReading, LeaseMoving, has_part
    from agentflow.exec.checkpoints.redis import RedisCheckpointStore

    histogram = Histogram("t_parts_seconds", "t", ("op",), registry=CollectorRegistry())
    # Given timed stores over the memory store (moves leases, reads no head with a take) and over Redis (both)
    over_memory = TimedStore(MemoryCheckpointStore(), histogram)
    over_redis = TimedStore(RedisCheckpointStore(lambda: Redis.from_url(redis_url), prefix="t-parts"), histogram)
    # Then each answers for what it wraps, asked again and in either order (the answer is kept per store)
    for _ in range(2):
        assert [has_part(over_memory, HeadReading), has_part(over_memory, LeaseMoving)] == [False, True]
        assert [has_part(over_redis, HeadReading), has_part(over_redis, LeaseMoving)] == [True, True]
