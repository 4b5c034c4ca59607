"""Recording a run's events into its store's stream while a process holds the run (`run.events.recording`).

The rules: the events of a hold are stored in emit order, all of them by the time the hold
is let go; a superstep's events share appends (a quick superstep costs one append, not one
per event), yet an event never waits in the buffer longer than `FLUSH_AFTER_S`, so a long
tool call shows its ``tool.started`` while it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from _kit.poll import until
from _kit.tickets import KEY
from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, Registry
from agentflow._events import Events
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.exec.checkpoints.records import SealedEvent
from agentflow.exec.run import events as run_events
from agentflow.exec.run.events import read_events
from agentflow.exec.seal import Sealer


class Count(BaseModel):
    n: int = 0


class CountingStore(MemoryCheckpointStore):
    """The memory store, counting its event appends."""

    def __init__(self) -> None:
        super().__init__()
        self.appends = 0

    async def append_events(self, run_id: str, events: Sequence[SealedEvent]) -> None:
        self.appends += 1
        await super().append_events(run_id, events)


def chain(registry: Registry, steps: int, tool: str) -> Flow[Count]:
    flow = Flow("chain", state=Count)
    for i in range(steps):
        flow = flow.node(f"s{i}", Call(tool, args=lambda c: {"n": c.n}, into="n"))
        if i:
            flow = flow.edge(f"s{i - 1}", f"s{i}")
    return flow.end(f"s{steps - 1}")


async def names(store: MemoryCheckpointStore, run_id: str) -> list[str]:
    return [e.name for e in await read_events(store, Sealer(KEY), run_id)]


async def test_each_superstep_stores_its_events_in_one_append_in_emit_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given events buffered for as long as a hold lasts (so the count below cannot depend on the machine's speed)
    monkeypatch.setattr(run_events, "FLUSH_AFTER_S", 60.0)
    registry = Registry()

    @registry.tool(idempotent=True)
    async def bump(n: int) -> int:
        return n + 1

    store, events = CountingStore(), Events(record=True)
    emitted: list[str] = []
    events.subscribe(lambda e: emitted.append(e.name) if e.run_id == "r-1" else None)
    app = FlowApp(registry, [chain(registry, 3, "bump")])
    runner = app.runner(store, KEY, events=events)
    flows = app.flow_versions("chain")
    # When a run is started and driven one superstep per hold, as a worker drives it
    await runner.start(flows, {"n": 0}, run_id="r-1")
    holds = 0
    while not (await store.latest("r-1")).ended:
        await runner.advance(flows, "r-1")
        holds += 1
    # Then the start and every superstep each stored their events in one append,
    # each event once, in the order emitted
    assert holds == 3
    assert store.appends == 1 + holds
    assert await names(store, "r-1") == emitted
    assert {"tool.started", "tool.finished", "run.finished"} <= set(emitted)


async def test_a_long_calls_started_event_is_stored_while_the_call_runs() -> None:
    registry = Registry()
    release = asyncio.Event()

    @registry.tool(idempotent=True)
    async def slow(n: int) -> int:
        await release.wait()
        return n + 1

    store = CountingStore()
    app = FlowApp(registry, [chain(registry, 1, "slow")])
    runner = app.runner(store, KEY, events=Events(record=True))
    # Given a run whose only call waits until the test lets it go
    driving = asyncio.create_task(runner.run(app.flow_versions("chain"), {"n": 0}, run_id="r-2"))
    try:
        # Then its tool.started is in the stored stream while the call still runs
        await until(lambda: _has(store, "r-2", "tool.started"), "tool.started stored during the call", timeout_s=10)
        assert not driving.done()
    finally:
        release.set()
    # and once the run is over, its last events are stored too
    assert (await driving).status == "done"
    assert (await names(store, "r-2"))[-1] == "run.finished"


async def _has(store: MemoryCheckpointStore, run_id: str, name: str) -> bool:
    return name in await names(store, run_id)
