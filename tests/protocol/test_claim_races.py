"""The two races the first probes of interleavings found, closed on every store.

1. A claim racing a late ``started``: the worker that held a run stalls inside a slow
   idempotent call past its lease; a recovery reads the log; before its claim lands the
   old holder wakes and logs ``started`` for its next call, in its own segment, which the
   store still accepts. The claim must not trust that read: once it has fenced the old
   segment it counts again, and runs nothing when the read missed a record.
2. A rewound record counter (Redis): the per-segment counter is unsigned and one ``HSET``
   sets it back. Records are append-only (a position that holds a record is never
   written again), and a handoff never trusts a counter that disagrees with the records.

3. (found by the simulation) An operator's "did not happen", decided while the call's
   stalled worker had not had its effect yet; the worker then has it and logs its ``done``
   in its old segment. The call's own ``done`` is the last word: nothing runs it again.

The simulation finds all three by itself (tests/sim, `test_regression_seeds.py`); these are
the same scenarios written out by hand.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _kit.faults import FaultyStore
from _kit.stores import RedisRows, StoreSetup, setups
from _kit.tickets import KEY, ORDER, Crash, Order, make_tickets, show_args

from agentflow import Call, DidNotHappen, Executor, Flow, FlowRunner
from agentflow.errors import RecoveryNeedsDecision
from agentflow.exec.checkpoints import CheckpointConflict, SealedCall, SealedCheckpoint
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer


async def look_then_charge(order: Order, handle: Any) -> dict[str, object]:
    """One node, two calls: a slow idempotent lookup, then charge_card (not idempotent)."""
    looked = await handle.call("slow_lookup", show=order.show)
    paid = await handle.call("charge_card", show=order.show, seats=order.seats)
    return {"looked": looked, "paid": paid}


LOOK_THEN_PAY = Flow("look-then-pay", state=Order).node("buy", look_then_charge).end("buy")
PAY = (
    Flow("pay", state=Order)
    .node("look", Call("slow_lookup", args=show_args, into="looked"))
    .node("pay", Call("charge_card", args=lambda o: {"show": o.show, "seats": o.seats}, into="paid"))
    .edge("look", "pay")
    .end("pay")
)


class Hooked(FaultyStore):
    """A store that waits on a hook just before its first claim checkpoint, or just after a ``started`` is stored."""

    def __init__(self, inner: Any, before_claim: Any = None, after_started: Any = None) -> None:
        super().__init__(inner)
        self._before_claim = before_claim
        self._after_started = after_started

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        if checkpoint.segment == step and step > 0 and self._before_claim is not None:
            hook, self._before_claim = self._before_claim, None
            await hook()
        await super().save(run_id, step, checkpoint)

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        await super().record_call(run_id, record)
        if record.kind == "started" and self._after_started is not None:
            await self._after_started(record)


class StallAfterChargeStarted:
    """A worker's `after_started` hook: it stays between charge_card's started record and the charge until let go."""

    def __init__(self) -> None:
        self.logged, self.go_on = asyncio.Event(), asyncio.Event()

    async def __call__(self, record: SealedCall) -> None:
        if b"charge_card" in record.payload:
            self.logged.set()
            await self.go_on.wait()


@pytest.mark.parametrize("store_setup", setups("memory", "sqlite", "fakeredis", "redis", "sql-postgres"), indirect=True)
async def test_a_claim_refuses_to_act_on_a_read_a_late_started_made_stale(store_setup: StoreSetup) -> None:
    tickets = make_tickets()
    executor = Executor(tickets.registry)
    stall = StallAfterChargeStarted()  # A stays between its started and the charge until the test is done with B
    first = FlowRunner(executor, checkpoints=Hooked(store_setup.open(), after_started=stall), checkpoint_key=KEY)
    # Given worker A inside the slow lookup, its lease gone (lapsed in a stall, or deleted)
    release, entered = tickets.gate("slow_lookup")
    a = asyncio.create_task(first.run(LOOK_THEN_PAY, ORDER, run_id="order-7"))
    await entered.wait()
    reader = store_setup.open()
    (lease,) = (await reader.leases(["order-7"])).values()
    assert await reader.release_lease("order-7", lease.token)

    # When B recovers, and A wakes between B's read and B's claim and starts charge_card
    async def a_wakes_and_starts_the_charge() -> None:
        release.set()
        await stall.logged.wait()

    second = FlowRunner(
        executor, checkpoints=Hooked(store_setup.open(), before_claim=a_wakes_and_starts_the_charge), checkpoint_key=KEY
    )
    with pytest.raises(CheckpointConflict, match="more record"):
        await second.recover(LOOK_THEN_PAY, "order-7")
    stall.go_on.set()  # A charges (its started was stored first) and is fenced: its save conflicts
    with pytest.raises(CheckpointConflict):
        await a

    # Then the card was charged once, and the next recovery replays A's charge instead of running it
    assert tickets.counts()["charge_card"] == 1
    result = await FlowRunner(executor, checkpoints=store_setup.open(), checkpoint_key=KEY).recover(
        LOOK_THEN_PAY, "order-7"
    )
    assert result.status == "done"
    assert tickets.counts()["charge_card"] == 1


@pytest.mark.parametrize("store_setup", setups("fakeredis", "redis"), indirect=True)
async def test_a_late_started_hidden_by_a_rewound_counter_still_stops_a_claim(store_setup: StoreSetup) -> None:
    # Found by the simulation (tests/sim/test_regression_seeds.py says how, and why its seed is retired): race 1 and
    # race 2 at once. A late started lands between B's read and B's claim, and someone sets A's record
    # counter back at once, so the count B makes after its claim puts the record in B's own segment.
    tickets = make_tickets()
    executor = Executor(tickets.registry)
    stall = StallAfterChargeStarted()
    first = FlowRunner(executor, checkpoints=Hooked(store_setup.open(), after_started=stall), checkpoint_key=KEY)
    # Given worker A inside the slow lookup, its lease gone
    release, entered = tickets.gate("slow_lookup")
    a = asyncio.create_task(first.run(LOOK_THEN_PAY, ORDER, run_id="order-9"))
    await entered.wait()
    reader = store_setup.open()
    (lease,) = (await reader.leases(["order-9"])).values()
    assert await reader.release_lease("order-9", lease.token)
    assert isinstance(store_setup.rows, RedisRows)
    rows = store_setup.rows

    # When B recovers, and A wakes between B's read and B's claim, ends the lookup and starts
    # charge_card, and its segment's counter is set back to what B read, hiding both records
    async def a_starts_the_charge_and_the_counter_is_set_back() -> None:
        row, counts = await reader.head("order-9")
        release.set()
        await stall.logged.wait()
        await rows.rewind_count("order-9", row.segment, counts[row.segment])

    second = FlowRunner(
        executor,
        checkpoints=Hooked(store_setup.open(), before_claim=a_starts_the_charge_and_the_counter_is_set_back),
        checkpoint_key=KEY,
    )
    # Then B's claim stands but runs nothing: the log as a whole took a record while B read it
    with pytest.raises(CheckpointConflict, match="the log took 2 record"):
        await second.recover(LOOK_THEN_PAY, "order-9")
    stall.go_on.set()
    with pytest.raises(CheckpointConflict):
        await a
    # And the card was charged once, and the next recovery finds that charge in doubt (A's done could
    # not go where the rewound counter pointed: a record is never overwritten) and asks, never reruns
    assert tickets.counts()["charge_card"] == 1
    with pytest.raises(RecoveryNeedsDecision, match="charge_card"):
        await FlowRunner(executor, checkpoints=store_setup.open(), checkpoint_key=KEY).recover(LOOK_THEN_PAY, "order-9")
    assert tickets.counts()["charge_card"] == 1


@pytest.mark.parametrize("store_setup", setups("fakeredis", "redis"), indirect=True)
async def test_a_rewound_record_counter_never_lets_a_handoff_overwrite_a_record(store_setup: StoreSetup) -> None:
    tickets = make_tickets()
    executor = Executor(tickets.registry)
    first = FlowRunner(executor, checkpoints=store_setup.open(), checkpoint_key=KEY)
    # Given a worker that died inside charge_card, after the charge (step 1 saved: lookup done)
    tickets.crash_in.add("charge_card")
    with pytest.raises(Crash):
        await first.run(PAY, ORDER, run_id="order-8")
    store = store_setup.open()
    row, counts = await store.head("order-8")
    segment = row.segment
    assert counts[segment] >= 1
    # When someone sets the segment's counter back to before the started record (no delete)
    assert isinstance(store_setup.rows, RedisRows)
    await store_setup.rows.rewind_count("order-8", segment, counts[segment] - 1)
    calls = [c for c in await store.calls("order-8") if c.segment == segment]
    # Then a handoff finds the charge in doubt instead of running it again ...
    second = FlowRunner(executor, checkpoints=store_setup.open(), checkpoint_key=KEY)
    with pytest.raises(Exception, match="charge_card"):
        await second.advance(PAY, "order-8", expected_step=row.step, handoff=True)
    assert tickets.counts()["charge_card"] == 1
    assert [c.payload for c in await store.calls("order-8") if c.segment == segment] == [c.payload for c in calls]
    # ... because the head does not look untouched (the records outnumber the counter) ...
    _, rewound = await store.head("order-8")
    assert rewound[segment] == counts[segment]
    # ... and a record at a taken position is refused, whatever the counter says
    with pytest.raises(CheckpointConflict):
        await store.record_call("order-8", calls[-1])


@pytest.mark.parametrize("store_setup", setups("memory", "sqlite", "fakeredis", "redis", "sql-postgres"), indirect=True)
async def test_a_late_done_outweighs_a_did_not_happen_decided_before_it(store_setup: StoreSetup) -> None:
    # Found by the simulation (tests/sim/test_regression_seeds.py): an operator's word on a call in
    # doubt is taken while the call's stalled worker has not had its effect yet; then it has it.
    tickets = make_tickets()
    executor = Executor(tickets.registry)
    stall = StallAfterChargeStarted()
    # Given worker A stalled between charge_card's started record and the charge, its lease gone
    first = FlowRunner(executor, checkpoints=Hooked(store_setup.open(), after_started=stall), checkpoint_key=KEY)
    a = asyncio.create_task(first.run(PAY, ORDER, run_id="order-9"))
    await stall.logged.wait()
    operator = FlowRunner(executor, checkpoints=store_setup.open(), checkpoint_key=KEY)
    (lease,) = (await operator.checkpoints.leases(["order-9"])).values()  # type: ignore[union-attr]
    assert await operator.checkpoints.release_lease("order-9", lease.token)  # type: ignore[union-attr]
    # When the operator, finding no charge at the bank, says it did not happen ...
    report = await read_run(operator.checkpoints, Sealer(KEY), "order-9")  # type: ignore[arg-type]
    (doubtful,) = report.in_doubt
    await operator.decide_in_doubt(PAY, "order-9", calls={doubtful.call_id: DidNotHappen("no charge at the bank")})
    # ... and A wakes, charges and logs its done (fenced for new calls, not for the end of this one)
    stall.go_on.set()
    with pytest.raises(CheckpointConflict):
        await a
    assert tickets.counts()["charge_card"] == 1
    # Then the next worker replays the charge's own result instead of failing it, and nothing charges again
    result = await FlowRunner(executor, checkpoints=store_setup.open(), checkpoint_key=KEY).recover(PAY, "order-9")
    assert (result.status, result.state.paid) == ("done", f"charged {ORDER.seats * 40} for {ORDER.show}")
    assert tickets.counts()["charge_card"] == 1


@pytest.mark.parametrize(
    "store_setup", setups("sqlite", "fakeredis", "redis", "sql-sqlite", "sql-postgres"), indirect=True
)
async def test_records_are_append_only_on_every_shared_store(store_setup: StoreSetup) -> None:
    # Given a run with two records in its segment 0 (hold_seats started and done)
    tickets = make_tickets()
    tickets.crash_in.add("charge_card")
    with pytest.raises(Crash):
        await FlowRunner(Executor(tickets.registry), checkpoints=store_setup.open(), checkpoint_key=KEY).run(
            PAY, ORDER, run_id="order-10"
        )
    store = store_setup.open()
    first, second = [r for r in await store.calls("order-10") if r.segment == 0][:2]
    # When the store's own count of the segment drops below its records, behind its back
    # (Redis: the counter set back, one HSET; SQL: the first record deleted)
    if isinstance(store_setup.rows, RedisRows):
        await store_setup.rows.rewind_count("order-10", 0, 1)
    else:
        await store_setup.rows.drop_call(first)
    # Then a write at the position that holds the second record is refused, and that record is kept as it was
    with pytest.raises(CheckpointConflict):
        await store.record_call("order-10", second)
    kept = [r for r in await store.calls("order-10") if (r.segment, r.seq) == (0, 1)]
    assert kept == [second]
