"""The holder's look-out for cancel requests (`run.cancel.CancelWatch`): when it reads the store.

The rule beside those in test_cancel_live.py: the read after a drive's last step is left out
when the previous read is younger than `FRESH_S` (no call can start before the next drive
reads again), and only then.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
from _kit.tickets import KEY
from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, Registry, RunStatus
from agentflow._events import Events
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.exec.checkpoints.records import Marker
from agentflow.exec.run import cancel as run_cancel
from agentflow.exec.run.cancel import CancelRequest, CancelWatch, post
from agentflow.exec.seal import Sealer


class ReadCounting(MemoryCheckpointStore):
    """The memory store, counting its marker reads (a cancel check is one)."""

    def __init__(self) -> None:
        super().__init__()
        self.marker_reads = 0

    async def peek_markers(self, keys: Sequence[str]) -> dict[str, Marker]:
        self.marker_reads += 1
        return dict(await super().peek_markers(keys))


def watch(store: ReadCounting, steps: int | None) -> CancelWatch:
    return CancelWatch(store, Sealer(KEY), "r-1", Events(), steps=steps)


async def test_a_quick_last_step_of_a_drive_is_not_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_cancel, "FRESH_S", 60.0)  # "quick" whatever the machine's load
    store = ReadCounting()
    # Given a one-step drive (a worker's) that read the store at its start
    look = watch(store, steps=1)
    await look.check(boundary=True)
    # When its step ended a moment later
    await look.step_ended()
    # Then that first read stands for the one before the save
    assert store.marker_reads == 1


@pytest.mark.parametrize("steps", [None, 2], ids=["until-the-end", "two-steps"])
async def test_a_step_the_drive_goes_on_after_is_always_read(steps: int | None) -> None:
    store = ReadCounting()
    look = watch(store, steps=steps)
    await look.check(boundary=True)
    # When a step ends after which the drive may run another (its first call is guarded by this read)
    await look.step_ended()
    # Then the store is read again
    assert store.marker_reads == 2


async def test_a_last_step_longer_than_fresh_s_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    store = ReadCounting()
    look = watch(store, steps=1)
    await look.check(boundary=True)
    # When the step took longer than FRESH_S (here: FRESH_S is 0)
    monkeypatch.setattr(run_cancel, "FRESH_S", 0.0)
    await look.step_ended()
    # Then its end reads the store again
    assert store.marker_reads == 2


async def test_a_request_made_during_a_quick_last_step_ends_the_run_at_the_next_drive_before_any_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(run_cancel, "FRESH_S", 60.0)  # the step counts as quick whatever the machine's load
    # Given a two-step flow whose first tool posts a cancel request for its own run (as an
    # operator would while the step runs), each step driven by a one-step drive, as on workers
    store, sealer = ReadCounting(), Sealer(KEY)
    registry = Registry()
    ran: list[str] = []

    @registry.tool(idempotent=True)
    async def first(n: int) -> int:
        ran.append("first")
        await post(store, sealer, CancelRequest("c-1", "changed my mind", "alice", time.time()))
        return n + 1

    @registry.tool(idempotent=True)
    async def second(n: int) -> int:
        ran.append("second")
        return n + 1

    class Count(BaseModel):
        n: int = 0

    flow = (
        Flow("two", state=Count)
        .node("a", Call("first", args=lambda c: {"n": c.n}, into="n"))
        .node("b", Call("second", args=lambda c: {"n": c.n}, into="n"))
        .edge("a", "b")
        .end("b")
    )
    app = FlowApp(registry, [flow])
    runner = app.runner(store, KEY)
    flows = app.flow_versions("two")
    await runner.start(flows, {}, run_id="c-1")
    # When the first step runs (quickly) and its drive ends
    after_first = await runner.advance(flows, "c-1")
    # Then its step is saved, and the run goes on (the request was made after the drive's last read)
    assert after_first.status == RunStatus.RUNNING and after_first.state.n == 1
    # And the next drive ends the run cancelled before the second tool starts
    after_second = await runner.advance(flows, "c-1")
    assert after_second.status == RunStatus.CANCELLED
    assert after_second.error == "cancelled by alice: changed my mind"
    assert ran == ["first"]
