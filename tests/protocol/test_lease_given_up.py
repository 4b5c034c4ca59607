"""The save that ends a drive gives the run's lease up with it (`run.lease.Tenure`), where the store can.

- On a store that moves leases with its writes (`LeaseMoving`), a worker's superstep (a
  one-step drive) gives the lease up in the save that ends its step: no release follows,
  and the lease is free once the step is stored. A drive of several steps keeps the lease
  until its last save.
- A holder whose lease was taken over meanwhile is refused at that save (`RunHeld`),
  and nothing of its step is stored: the new holder's lease and its run are untouched.
- A store without the part (a wrapper that forwards only the port) is released on its own
  after the drive, as before.
- A renewal due after the lease was given up neither renews it nor reports it lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest
from _kit.tickets import KEY
from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, Registry, RunStatus
from agentflow.errors import CheckpointConflict
from agentflow.exec.checkpoints import MemoryCheckpointStore, SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints.forwarding import PARTS, ForwardingStore
from agentflow.exec.checkpoints.protocol import LeaseMoving
from agentflow.exec.checkpoints.records import LeaseMove, SealedEvent
from agentflow.exec.run.lease import Ownership, holding


class Watched(MemoryCheckpointStore):
    """The memory store, noting its lease releases and the lease moves its saves make."""

    def __init__(self) -> None:
        super().__init__()
        self.released: list[str] = []
        self.moves: list[tuple[int, LeaseMove]] = []

    async def release_lease(self, run_id: str, token: str) -> bool:
        self.released.append(run_id)
        return await super().release_lease(run_id, token)

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
        self.moves.append((step, move))


class Count(BaseModel):
    n: int = 0


def three_steps(on_step: Any = None) -> tuple[FlowApp, Flow[Count]]:
    registry = Registry()

    @registry.tool(idempotent=True)
    async def bump(n: int) -> int:
        if on_step is not None:
            await on_step(n)
        return n + 1

    flow = (
        Flow("three", state=Count)
        .node("a", Call("bump", args=lambda c: {"n": c.n}, into="n"))
        .node("b", Call("bump", args=lambda c: {"n": c.n}, into="n"))
        .node("c", Call("bump", args=lambda c: {"n": c.n}, into="n"))
        .edge("a", "b")
        .edge("b", "c")
        .end("c")
    )
    return FlowApp(registry, [flow]), flow


async def test_a_workers_superstep_gives_the_lease_up_with_the_save_that_ends_it() -> None:
    store = Watched()
    assert isinstance(store, LeaseMoving)
    app, _ = three_steps()
    runner = app.runner(store, KEY)
    flows = app.flow_versions("three")
    await runner.start(flows, {}, run_id="r-1")
    store.released.clear()
    # When a worker runs one superstep
    out = await runner.advance(flows, "r-1")
    # Then the save that ended its step gave the lease up (in the same write; the claim before it
    # did not), and no release followed
    assert out.status == RunStatus.RUNNING and out.state.n == 1
    assert [(step, move.to) for step, move in store.moves] == [(out.step, None)]
    assert store.released == []
    assert await store.leases(["r-1"]) == {}


async def test_a_drive_of_several_steps_keeps_the_lease_until_its_last_save() -> None:
    store = Watched()
    app, _ = three_steps()
    runner = app.runner(store, KEY)
    flows = app.flow_versions("three")
    # When a run is driven to its end in one drive (three steps, three saves after step 0)
    out = await runner.run(flows, {}, run_id="r-1")
    # Then only the last save, the one that ended the run, moved the lease (giving it up)
    assert out.status == RunStatus.DONE and out.state.n == 3
    assert [(step, move.to) for step, move in store.moves] == [(3, None)]
    assert store.released == [] and await store.leases(["r-1"]) == {}


async def test_a_holder_whose_lease_was_taken_over_stores_nothing_of_its_step() -> None:
    store = Watched()
    rival = Ownership("rival@host:2", lease_s=30.0)
    taken: list[Any] = []

    async def taken_over(n: int) -> None:
        if n == 0 and not taken:  # inside the worker's step: its lease lapses, and a rival takes the run
            lease = (await store.leases(["r-1"]))["r-1"]
            await store.release_lease("r-1", lease.token)
            holder = holding(store, "r-1", rival)
            taken.append((holder, await holder.__aenter__()))

    app, _ = three_steps(taken_over)
    runner = app.runner(store, KEY)
    flows = app.flow_versions("three")
    await runner.start(flows, {}, run_id="r-1")
    # When the worker's step ends and it saves
    with pytest.raises(CheckpointConflict) as refused:
        await runner.advance(flows, "r-1")
    # Then the save is refused naming the rival, nothing of the step is stored, and the rival holds on
    assert "rival@host:2" in str(refused.value)
    assert [(row.step, row.segment) for row in await store.history("r-1")] == [(0, 0), (1, 1)]  # its claim, no step
    assert store.moves == []
    holder, tenure = taken[0]
    assert (await store.leases(["r-1"]))["r-1"].token == tenure.lease.token
    await holder.__aexit__(None, None, None)


async def test_a_store_without_lease_moves_is_released_after_the_drive() -> None:
    inner = Watched()
    store = ForwardingStore(inner, parts=[part for part in PARTS if part is not LeaseMoving])  # moves no lease
    assert not isinstance(store, LeaseMoving)
    app, _ = three_steps()
    runner = app.runner(store, KEY)
    flows = app.flow_versions("three")
    await runner.start(flows, {}, run_id="r-1")
    inner.released.clear()
    out = await runner.advance(flows, "r-1")
    # Then the step was saved the plain way, and the lease released afterwards
    assert out.status == RunStatus.RUNNING and inner.moves == []
    assert inner.released == ["r-1"] and await inner.leases(["r-1"]) == {}


async def test_a_renewal_due_after_the_lease_was_given_up_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="agentflow.lease")
    store = Watched()
    renewals: list[str] = []
    original = store.renew_lease

    async def counted(run_id: str, token: str, ttl_s: float) -> Any:
        renewals.append(run_id)
        return await original(run_id, token, ttl_s)

    store.renew_lease = counted  # type: ignore[method-assign]
    # Given a lease given up by a save while its holder's block goes on (its renewal timer still set)
    async with holding(store, "r-1", Ownership("me@host:1", lease_s=0.05)) as tenure:
        tenure.given_up = True
        await store.release_lease("r-1", tenure.lease.token)
        store.released.clear()
        # When renewals fall due (every third of the lease: a wait of a whole lease passes three; what
        # is checked is that nothing happens, so there is nothing to poll for)
        await asyncio.sleep(tenure.ttl_s)
    # Then none was made, none reported the lease lost, and leaving the block released nothing
    assert renewals == [] and store.released == []
    assert not [r for r in caplog.records if "lost its lease" in r.getMessage()]
