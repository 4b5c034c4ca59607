"""A claim pins what it closes: records cut from before the latest checkpoint are corruption, on every store.

Each test tampers the way someone with write access to the store would: it deletes rows
behind the store's back (`_kit.stores.Rows`), then asks a worker to go on. The rule under
test: a missing record before the latest checkpoint is `CheckpointStoreCorrupt` on every
path (recover, resume, the distributed handoff `advance`, verify), and no effect runs twice.
"""

from __future__ import annotations

from typing import Any

import pytest
from _kit.faults import FaultyStore, body
from _kit.stores import StoreSetup
from _kit.tickets import FANOUT, KEY, ORDER, TICKETS, Crash, Order, make_tickets, order_args, show_args

from agentflow import Call, Executor, Flow, FlowRunner
from agentflow.exec.checkpoints import CheckpointStoreCorrupt, RecoveryNeedsDecision
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer


async def buy_node(order: Order, handle: Any) -> dict[str, object]:
    """One node, two calls in order: charge_card, then email_tickets (neither idempotent)."""
    paid = await handle.call("charge_card", show=order.show, seats=order.seats)
    sent = await handle.call("email_tickets", show=order.show)
    return {"paid": paid, "sent": sent}


#: hold -> buy (charge, then mail, in one node) -> receipt.
BUY = (
    Flow("buy", state=Order)
    .node("hold", Call("hold_seats", args=order_args, into="held"))
    .node("buy", buy_node)
    .node("receipt", Call("slow_lookup", args=show_args, into="looked"))
    .edge("hold", "buy")
    .edge("buy", "receipt")
    .end("receipt")
)


class World:
    """One test's tools and workers over one store set-up."""

    def __init__(self, setup: StoreSetup) -> None:
        self.setup = setup
        self.tickets = make_tickets()

    def worker(self) -> tuple[FlowRunner, FaultyStore]:
        store = FaultyStore(self.setup.open())
        return FlowRunner(Executor(self.tickets.registry), checkpoints=store, checkpoint_key=KEY), store

    async def drop_calls_after(self, run_id: str, *, segment: int, seq: int) -> int:
        """Delete every record of `segment` from `seq` on, and every record of later segments."""
        doomed = [r for r in await self.setup.calls(run_id) if (r.segment, r.seq) >= (segment, seq)]
        for rec in reversed(doomed):
            await self.setup.rows.drop_call(rec)
        return len(doomed)

    def charged(self) -> int:
        return self.tickets.counts()["charge_card"]


@pytest.fixture
def world(store_setup: StoreSetup) -> World:
    return World(store_setup)


async def _cut_then_claimed(world: World) -> tuple[int, int]:
    """A run cut inside `buy` (charge done, mail in doubt), then claimed by a recovery that died too.

    Returns:
        The step of the last checkpoint before the cut, and the number of segment 0's records
        that were written before it.
    """
    first, store = world.worker()
    store.crash("started", when="after", tool="email_tickets")
    with pytest.raises(Crash):
        await first.run(BUY, ORDER, run_id="order-7")
    before_cut = (await world.setup.history("order-7"))[-1]
    kept = body(before_cut)["log"][1]
    second, store2 = world.worker()
    store2.crash("save", when="after", step=before_cut.step + 1)  # dies right after its claim
    with pytest.raises(Crash):
        await second.recover(BUY, "order-7", rerun_in_doubt=True)
    return before_cut.step, kept


async def test_a_cut_tail_before_a_recovery_claim_is_corrupt_and_charges_once(world):
    # Given a run cut inside a superstep (charge_card finished, email_tickets in doubt),
    # claimed by a recovery that died right after its claim
    step, kept = await _cut_then_claimed(world)
    assert world.charged() == 1
    # When the records of the cut superstep (segment 0 after the last checkpoint) are deleted
    assert await world.drop_calls_after("order-7", segment=0, seq=kept) >= 3
    # Then recovery refuses: the claim pinned how many records segment 0 had
    third, _ = world.worker()
    with pytest.raises(CheckpointStoreCorrupt, match="segment 0 has .* records, checkpoint .* saw"):
        await third.recover(BUY, "order-7", rerun_in_doubt=True)
    # and so does a distributed worker's handoff, and verify
    with pytest.raises(CheckpointStoreCorrupt, match="segment 0"):
        await third.advance(BUY, "order-7", expected_step=step + 1, handoff=True, rerun_in_doubt=True)
    report = await read_run(world.setup.raw, Sealer(KEY), "order-7")
    assert any("segment 0" in p for p in report.problems), report.problems
    # and the card was charged once
    assert world.charged() == 1


async def test_a_cut_tail_before_a_resume_claim_is_corrupt_on_every_path(world):
    # Given a fanned-out superstep: pay charged the card, wire waits for approval (paused)
    runner, _ = world.worker()
    paused = await runner.run(FANOUT, ORDER, run_id="fan-1")
    assert paused.status == "paused" and world.charged() == 1
    # and a resume that stored its decision with its claim, for a worker to spend
    decided = await runner.resume(FANOUT, "fan-1", approve=True, max_supersteps=0)
    paused_row = (await world.setup.history("fan-1"))[-2]
    # When segment 0's records of that superstep (pay's started and done, wire's pending) are deleted
    first_of_superstep = min(r.seq for r in await world.setup.calls("fan-1") if body(r).get("superstep") == 1)
    assert await world.drop_calls_after("fan-1", segment=0, seq=first_of_superstep) == 3
    assert body(paused_row)["log"] == [0, first_of_superstep + 3]
    # Then the worker's handoff, a recovery and verify all refuse: the claim pinned segment 0
    worker, _ = world.worker()
    with pytest.raises(CheckpointStoreCorrupt, match="segment 0"):
        await worker.advance(FANOUT, "fan-1", expected_step=decided.step, handoff=True)
    with pytest.raises(CheckpointStoreCorrupt, match="segment 0"):
        await worker.recover(FANOUT, "fan-1", rerun_in_doubt=True)
    report = await read_run(world.setup.raw, Sealer(KEY), "fan-1")
    assert report.problems
    # and pay never ran a second time
    assert world.charged() == 1
    assert world.tickets.counts()["wire_money"] == 0


async def test_two_checkpoints_rolled_back_with_later_records_kept_is_corrupt(world):
    # Given a finished run of three supersteps
    runner, _ = world.worker()
    store_raw = world.setup.raw
    cut, store = world.worker()
    store.crash("started", when="after", tool="email_tickets")
    with pytest.raises(Crash):
        await cut.run(TICKETS, ORDER, run_id="order-9")
    rows = await world.setup.history("order-9")
    assert [r.step for r in rows] == [0, 1, 2]
    # When the last two checkpoints are deleted and every record is kept
    for row in reversed(rows[1:]):
        await world.setup.rows.drop_checkpoint(row)
    # Then recovery refuses (records of later supersteps prove the rollback), and verify agrees
    with pytest.raises(CheckpointStoreCorrupt, match="checkpoints are missing"):
        await runner.recover(TICKETS, "order-9", rerun_in_doubt=True)
    report = await read_run(store_raw, Sealer(KEY), "order-9")
    assert any("checkpoints are missing" in p for p in report.problems), report.problems
    assert world.charged() == 1
    assert world.tickets.counts()["hold_seats"] == 1


async def test_a_done_deleted_after_the_latest_checkpoint_leaves_its_call_in_doubt(world):
    # Given a run cut inside `buy` after charge_card finished
    first, store = world.worker()
    store.crash("started", when="after", tool="email_tickets")
    with pytest.raises(Crash):
        await first.run(BUY, ORDER, run_id="order-8")
    records = await world.setup.calls("order-8")
    charge_done = next(r for r in records if r.kind == "done" and "charged" in str(body(r).get("result")))
    # When the tail from charge_card's `done` on is deleted (nothing pins what follows the latest checkpoint)
    await world.drop_calls_after("order-8", segment=charge_done.segment, seq=charge_done.seq)
    # Then the charge is in doubt, never "not started": recovery asks for a decision and runs nothing
    second, store2 = world.worker()
    with pytest.raises(RecoveryNeedsDecision) as caught:
        await second.recover(BUY, "order-8")
    assert [tool for tool, _ in caught.value.calls] == ["charge_card"]
    assert store2.writes == []
    assert world.charged() == 1
