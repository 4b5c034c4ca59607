"""Recording a run's events into its store's stream while a process holds the run (`run.events.recording`).

The rules: the events of a hold are stored in emit order, all of them by the time the hold
is let go; a superstep's events share appends (a quick superstep costs one append, not one
per event), yet an event never waits in the buffer longer than `FLUSH_AFTER_S`, so a long
tool call shows its ``tool.started`` while it runs. The save that gives a superstep's lease up
carries the events not yet stored, its own ``checkpoint.saved`` last, in the same write; a
save refused with nothing written gives them back to be appended, and the events of a save
whose outcome is unknown are never stored a second time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from _kit.poll import until
from _kit.tickets import KEY
from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, Registry
from agentflow._errors import CheckpointConflict
from agentflow._events import Events
from agentflow.exec.checkpoints import MemoryCheckpointStore, SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints.records import LeaseMove, SealedEvent
from agentflow.exec.run import events as run_events
from agentflow.exec.run.events import read_events
from agentflow.exec.seal import Sealer


class Count(BaseModel):
    n: int = 0


class CountingStore(MemoryCheckpointStore):
    """The memory store, counting its event appends, and the saves that carried events."""

    def __init__(self) -> None:
        super().__init__()
        self.appends = 0
        self.carried = 0

    async def append_events(self, run_id: str, events: Sequence[SealedEvent]) -> None:
        self.appends += 1
        await super().append_events(run_id, events)

    async def save_after_calls_moving(
        self,
        run_id: str,
        step: int,
        checkpoint: SealedCheckpoint,
        calls: Sequence[SealedCall],
        move: LeaseMove,
        events: Sequence[SealedEvent] = (),
    ) -> None:
        await super().save_after_calls_moving(run_id, step, checkpoint, calls, move, events)
        self.carried += bool(events)


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
    # Then every superstep's events went with the save that gave its lease up (one write), the
    # last one's run.finished with them (no crash can part the run's end from its save), the
    # start's in an append of its own, each event once, in the order emitted
    assert holds == 3
    assert (store.carried, store.appends) == (holds, 1)
    assert len(await store.read_events("r-1")) == holds + 1
    assert await names(store, "r-1") == emitted
    assert emitted[-2:] == ["checkpoint.saved", "run.finished"]
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


class FailingSave(MemoryCheckpointStore):
    """The memory store, whose first save carrying events fails as `how` says."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.failed = False

    async def save_after_calls_moving(
        self,
        run_id: str,
        step: int,
        checkpoint: SealedCheckpoint,
        calls: Sequence[SealedCall],
        move: LeaseMove,
        events: Sequence[SealedEvent] = (),
    ) -> None:
        if events and not self.failed:
            self.failed = True
            if self.how == "refused":
                raise CheckpointConflict(f"run {run_id!r}: another worker saved step {step} first")
            if self.how == "after":
                await super().save_after_calls_moving(run_id, step, checkpoint, calls, move, events)
            raise ConnectionError("the store went away mid-write")
        await super().save_after_calls_moving(run_id, step, checkpoint, calls, move, events)


async def drive_failing(store: FailingSave) -> tuple[list[str], list[str]]:
    """Start a 2-step run and drive its first superstep on `store`; the names emitted and those stored."""
    registry = Registry()

    @registry.tool(idempotent=True)
    async def bump(n: int) -> int:
        return n + 1

    events = Events(record=True)
    emitted: list[str] = []
    events.subscribe(lambda e: emitted.append(e.name) if e.run_id == "r-1" else None)
    app = FlowApp(registry, [chain(registry, 2, "bump")])
    runner = app.runner(store, KEY, events=events)
    flows = app.flow_versions("chain")
    out = await runner.start(flows, {"n": 0}, run_id="r-1")
    emitted.clear()
    with pytest.raises((CheckpointConflict, ConnectionError)):
        await runner.advance(flows, "r-1", expected_step=out.step, handoff=True)
    return emitted, [e.name for e in await read_events(store, Sealer(KEY), "r-1")]


async def test_the_events_a_refused_save_carried_are_stored_by_the_next_append() -> None:
    # Given a superstep whose save (carrying its events) is refused with nothing written
    store = FailingSave("refused")
    emitted, stored = await drive_failing(store)
    # Then every event it emitted is stored once, after the start's, by the append that ends the hold
    # (the refused save emitted no checkpoint.saved)
    assert store.failed and "checkpoint.saved" not in emitted and "tool.finished" in emitted
    assert stored[-len(emitted) :] == emitted and stored.count("tool.finished") == 1, stored


@pytest.mark.parametrize("when", ["before", "after"])
async def test_the_events_of_a_save_that_may_not_be_stored_are_never_stored_twice(
    when: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a superstep whose save (carrying its events) fails in a way that leaves its outcome unknown:
    # the store failed before it wrote, or after
    store = FailingSave(when)
    emitted, stored = await drive_failing(store)
    # Then its events are stored as the store left them (once, or not at all), never again
    superstep = ["node.started", "tool.started", "tool.finished", "node.finished", "checkpoint.saved"]
    assert store.failed and emitted[:4] == superstep[:4]
    assert stored.count("tool.started") == (1 if when == "after" else 0), stored
    assert stored[-5:] == superstep if when == "after" else stored[-1] == "run.started", stored
    # And the process said they may be lost
    assert any("may not have been stored" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
