"""Durable runs: checkpoints per superstep, the call log, crash recovery, in-doubt calls, keys.

Every test runs on each storage code path (`_kit.stores.ENGINE_SETUPS`): memory, SQLite,
Redis, and SQLAlchemy on PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _kit.faults import body
from _kit.tickets import BATCH, KEY, KEY_B, OPAQUE, ORDER, TICKETS, Crash, make_tickets, switched_flow, tickets_flow
from _kit.workers import Workers, faulty

from agentflow import Executor, FlowRunner
from agentflow.exec.checkpoints import (
    CheckpointConflict,
    CheckpointNotFound,
    CheckpointStoreCorrupt,
    MemoryCheckpointStore,
    RecoveryNeedsDecision,
    SQLiteCheckpointStore,
)
from agentflow.exec.seal import key_id
from agentflow.flow import FlowError, RunResult


async def crashed_tickets(workers: Workers, run_id: str, *, before_save: int | None = None) -> None:
    """Run TICKETS until the worker dies (before saving `before_save`, or where ``crash_in`` says)."""
    first = workers.runner()
    if before_save is not None:
        faulty(first).crash("save", step=before_save)
    with pytest.raises(Crash):
        await first.run(TICKETS, ORDER, run_id=run_id)


# -- checkpoints and the call log --------------------------------------------------------


async def test_step_zero_is_saved_at_start_and_one_checkpoint_follows_each_superstep(workers):
    # Given the three-superstep tickets flow on a durable runner
    runner = workers.runner()

    # When it runs to the end
    result = await runner.run(TICKETS, ORDER, run_id="order-1")

    # Then step 0 was saved before any tool ran, and one checkpoint followed each superstep
    assert result.status == "done"
    history = await workers.history("order-1")
    assert [c.step for c in history] == [0, 1, 2, 3]
    assert [c.status for c in history] == ["running", "running", "running", "done"]
    assert [body(c)["superstep"] for c in history] == [0, 1, 2, 3]
    saves_and_tools = [t for t in workers.tickets.trace if t.startswith(("save:", "tool:"))]
    assert saves_and_tools == [
        "save:0:running",
        "tool:hold_seats",
        "save:1:running",
        "tool:charge_card",
        "save:2:running",
        "tool:email_tickets",
        "save:3:done",
    ]
    assert result.step == 3
    saved = [e.data for e in workers.named("checkpoint.saved")]
    assert [(d["kind"], d["flow"], d["step"], d["status"]) for d in saved] == [
        ("flow", "tickets", 0, "running"),
        ("flow", "tickets", 1, "running"),
        ("flow", "tickets", 2, "running"),
        ("flow", "tickets", 3, "done"),
    ]


async def test_every_call_logs_started_before_the_tool_runs_then_done(workers):
    # Given the tickets flow on a durable runner
    runner = workers.runner()

    # When it runs to the end
    await runner.run(TICKETS, ORDER, run_id="order-1")

    # Then each call has a numbered `started` then `done` record, and `started` came before the tool ran
    records = await workers.calls("order-1")
    assert [r.kind for r in records] == ["started", "done"] * 3
    assert [(r.segment, r.seq) for r in records] == [(0, n) for n in range(6)]
    for started, done in zip(records[::2], records[1::2], strict=True):
        assert body(started)["call_id"] == body(done)["call_id"]
    assert [body(r)["tool"] for r in records[::2]] == ["hold_seats", "charge_card", "email_tickets"]
    assert body(records[1])["result"] == "held 2 for Hamlet"
    log = [t for t in workers.tickets.trace if t.startswith(("record:", "tool:"))]
    assert log[:3] == ["record:started:hold", "tool:hold_seats", "record:done:hold"]
    assert log[3:6] == ["record:started:pay", "tool:charge_card", "record:done:pay"]


# -- recovery ----------------------------------------------------------------------------


async def test_recover_after_a_crash_replays_finished_calls_without_running_them(workers):
    # Given a run whose worker died after the pay superstep, before saving its checkpoint
    await crashed_tickets(workers, "order-1", before_save=2)
    assert workers.ran() == {"hold_seats": 1, "charge_card": 1}

    # When a new worker recovers it
    result = await workers.runner().recover(TICKETS, "order-1")

    # Then it completes, charge_card replays from the log (ran once in all), email runs once
    assert result.status == "done"
    assert result.state.paid == "charged 80 for Hamlet"
    assert result.state.sent == "mailed Hamlet"
    assert workers.ran() == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}
    replayed = workers.named("tool.replayed")
    assert [e.data["tool"] for e in replayed] == ["charge_card"]
    # and the recovering worker claimed step 2 with a new segment for its records
    history = await workers.history("order-1")
    assert [(c.step, c.segment) for c in history] == [(0, 0), (1, 0), (2, 2), (3, 2), (4, 2)]
    assert {r.segment for r in (await workers.calls("order-1"))[4:]} == {2}


async def test_result_of_a_recovery_lists_the_replayed_calls(workers):
    # Given a run whose worker died after the pay superstep
    await crashed_tickets(workers, "order-1", before_save=2)

    # When a new worker recovers it and it goes on past the recovered superstep
    result = await workers.runner().recover(TICKETS, "order-1")

    # Then the result says which calls were replayed (RunResult.replayed: "after a recovery or resume")
    assert [cid.split("/")[1] for cid in result.replayed] == ["pay"]


async def test_started_call_of_an_idempotent_tool_runs_again_on_recover(workers):
    # Given a run whose worker died inside hold_seats (idempotent): started, no result
    workers.tickets.crash_in.add("hold_seats")
    await crashed_tickets(workers, "order-1")
    assert [r.kind for r in await workers.calls("order-1")] == ["started"]

    # When a new worker recovers it (no decision given)
    result = await workers.runner().recover(TICKETS, "order-1")

    # Then hold_seats ran again and the run finished
    assert result.status == "done"
    assert workers.ran() == {"hold_seats": 2, "charge_card": 1, "email_tickets": 1}
    (recovered,) = workers.named("run.recovered")
    assert [cid.split("/")[1] for cid in recovered.data["rerun"]] == ["hold"]


async def test_started_call_of_a_non_idempotent_tool_needs_a_decision_before_anything_runs(workers):
    # Given a run whose worker died inside email_tickets (not idempotent)
    workers.tickets.crash_in.add("email_tickets")
    await crashed_tickets(workers, "order-1")
    before, steps = workers.ran(), len(await workers.history("order-1"))

    # When a new worker recovers it without a decision
    with pytest.raises(RecoveryNeedsDecision) as caught:
        await workers.runner().recover(TICKETS, "order-1")

    # Then it names the call, and nothing ran and nothing was claimed
    assert len(caught.value.calls) == 1
    tool, why = caught.value.calls[0]
    assert tool == "email_tickets"
    assert isinstance(why, str) and why
    rebuilt = type(caught.value)(*caught.value.args)  # what a JSON result backend carries
    assert rebuilt.calls == caught.value.calls
    assert workers.ran() == before
    assert len(await workers.history("order-1")) == steps

    # When it is recovered with rerun_in_doubt=True
    result = await workers.runner().recover(TICKETS, "order-1", rerun_in_doubt=True)

    # Then the call runs again and the run finishes
    assert result.status == "done"
    assert workers.ran()["email_tickets"] == before["email_tickets"] + 1
    assert workers.ran()["charge_card"] == 1


async def test_unrecordable_result_is_logged_and_counts_as_in_doubt(workers):
    # Given a run whose call returned a value JSON cannot carry, then the worker died
    first = workers.runner()
    faulty(first).crash("save", step=1)
    with pytest.raises(Crash):
        await first.run(OPAQUE, ORDER, run_id="opaque-1")
    assert [r.kind for r in await workers.calls("opaque-1")] == ["started", "unrecordable"]
    before = workers.ran()

    # When a new worker recovers it without a decision
    with pytest.raises(RecoveryNeedsDecision) as caught:
        await workers.runner().recover(OPAQUE, "opaque-1")

    # Then the call is in doubt (ran, result not stored) and nothing ran
    assert [tool for tool, _ in caught.value.calls] == ["make_opaque"]
    assert "could not be stored" in caught.value.calls[0][1]
    assert workers.ran() == before


async def test_recover_of_a_finished_run_is_a_conflict(workers):
    # Given a run that finished
    await workers.runner().run(TICKETS, ORDER, run_id="order-1")
    before = workers.ran()

    # When a worker tries to recover it
    # Then it is refused and nothing runs
    with pytest.raises(CheckpointConflict):
        await workers.runner().recover(TICKETS, "order-1")
    assert workers.ran() == before


async def test_recover_of_an_unknown_run_is_not_found(workers):
    # Given an empty store
    # When a worker recovers a run id nobody saved
    # Then CheckpointNotFound
    with pytest.raises(CheckpointNotFound):
        await workers.runner().recover(TICKETS, "nobody-saved-this")
    assert not workers.ran()


async def test_recover_all_recovers_every_unfinished_run_and_skips_finished_ones(workers):
    # Given a crashed run, a finished run and a run with a call in doubt
    await crashed_tickets(workers, "crashed", before_save=2)
    await workers.runner().run(TICKETS, ORDER, run_id="finished")
    workers.tickets.crash_in.add("email_tickets")
    await crashed_tickets(workers, "in-doubt")
    before = workers.ran()

    # When a worker starting up recovers all of the flow's runs
    out = await workers.runner().recover_all(TICKETS)

    # Then each unfinished run maps to its result or its error, the finished one is left alone
    assert set(out) == {"crashed", "in-doubt"}
    assert isinstance(out["crashed"], RunResult) and out["crashed"].status == "done"
    assert isinstance(out["in-doubt"], RecoveryNeedsDecision)
    assert workers.ran() - before == {"email_tickets": 1}


async def test_call_whose_arguments_changed_runs_again_and_is_reported_unreplayed(workers):
    # Given a run whose worker died after charging 2 seats, before its checkpoint
    switched = switched_flow(workers.tickets)
    first = workers.runner()
    faulty(first).crash("save", step=1)
    with pytest.raises(Crash):
        await first.run(switched, ORDER, run_id="switch-1")
    (old_id,) = {body(r)["call_id"] for r in await workers.calls("switch-1")}

    # When the node's arguments change (3 seats) and a new worker recovers it
    workers.tickets.extra_seats = 1
    result = await workers.runner().recover(switched, "switch-1")

    # Then the charge ran again (not replayed) and checkpoint.saved reports it as unreplayed
    assert result.status == "done"
    assert result.state.paid == "charged 120 for Hamlet"
    assert workers.ran()["charge_card"] == 2
    reported = [cid for e in workers.named("checkpoint.saved") for cid in e.data["unreplayed"]]
    assert len(reported) == 1
    assert reported[0] != old_id and reported[0].startswith("0/pay/0/")
    (recovered,) = workers.named("run.recovered")
    assert recovered.data["replayed"] == []


async def test_run_recovered_event_carries_kind_step_replayed_and_rerun(workers):
    # Given a run whose worker died inside slow_lookup (idempotent) after hold_seats finished, in one node
    workers.tickets.crash_in.add("slow_lookup")
    first = workers.runner()
    with pytest.raises(Crash):
        await first.run(BATCH, ORDER, run_id="batch-1")

    # When a new worker recovers it
    result = await workers.runner().recover(BATCH, "batch-1")

    # Then run.recovered says: a flow, the claimed step, hold_seats replayed, slow_lookup rerun
    assert result.status == "done"
    (event,) = workers.named("run.recovered")
    assert event.run_id == "batch-1"
    assert event.data["kind"] == "flow"
    assert event.data["step"] == 1
    assert [cid.rsplit("/", 1)[0] for cid in event.data["replayed"]] == ["0/batch/0"]
    assert [cid.rsplit("/", 1)[0] for cid in event.data["rerun"]] == ["0/batch/1"]
    assert workers.ran() == {"hold_seats": 1, "slow_lookup": 2, "charge_card": 1, "email_tickets": 1}


async def test_second_crash_in_the_same_superstep_replays_what_both_workers_finished(workers):
    # Given a run whose worker died inside slow_lookup, and whose first recoverer reran it
    # and then died inside charge_card, all in the same superstep
    workers.tickets.crash_in.add("slow_lookup")
    with pytest.raises(Crash):
        await workers.runner().run(BATCH, ORDER, run_id="batch-1")
    workers.tickets.crash_in.add("charge_card")
    with pytest.raises(Crash):
        await workers.runner().recover(BATCH, "batch-1")
    assert workers.ran() == {"hold_seats": 1, "slow_lookup": 2, "charge_card": 1}

    # When a third worker recovers it
    # Then charge_card (started in the second segment) is in doubt
    with pytest.raises(RecoveryNeedsDecision) as caught:
        await workers.runner().recover(BATCH, "batch-1")
    assert [tool for tool, _ in caught.value.calls] == ["charge_card"]

    # And once allowed, hold_seats (segment 0) and slow_lookup (segment 1) replay; only charge_card reruns
    result = await workers.runner().recover(BATCH, "batch-1", rerun_in_doubt=True)
    assert result.status == "done"
    assert workers.ran() == {"hold_seats": 1, "slow_lookup": 2, "charge_card": 2, "email_tickets": 1}
    last = workers.named("run.recovered")[-1].data
    assert [cid.rsplit("/", 1)[0] for cid in last["replayed"]] == ["0/batch/0", "0/batch/1"]
    assert [cid.rsplit("/", 1)[0] for cid in last["rerun"]] == ["0/batch/2"]


async def test_recover_of_another_flows_run_is_a_conflict(workers):
    # Given a crashed run of the tickets flow
    await crashed_tickets(workers, "order-1", before_save=2)
    before = workers.ran()

    # When a worker recovers it as a run of another flow
    # Then CheckpointConflict ("it is another flow's"), and nothing ran
    try:
        with pytest.raises(CheckpointConflict):
            await workers.runner().recover(switched_flow(workers.tickets), "order-1")
    finally:
        assert workers.ran() == before


async def test_recover_with_a_flow_whose_graph_changed_is_a_flow_error(workers):
    # Given a crashed run of the tickets flow
    await crashed_tickets(workers, "order-1", before_save=2)
    before = workers.ran()

    # When a worker recovers it with a flow of the same name but another graph
    changed = tickets_flow(with_receipt=True)
    assert changed.name == TICKETS.name and changed.digest != TICKETS.digest

    # Then FlowError, and nothing ran
    with pytest.raises(FlowError):
        await workers.runner().recover(changed, "order-1")
    assert workers.ran() == before


async def test_idempotency_key_is_the_same_on_the_first_run_and_after_recovery(workers):
    # Given a run whose worker died inside charge_card after it read its idempotency key
    workers.tickets.crash_in.add("charge_card")
    await crashed_tickets(workers, "order-1")

    # When a new worker reruns the call in doubt
    await workers.runner().recover(TICKETS, "order-1", rerun_in_doubt=True)

    # Then charge_card saw the same key both times; another run's call has another key
    await workers.runner().run(TICKETS, ORDER, run_id="order-2")
    keys = workers.ledger.keys("charge_card")
    assert len(keys) == 3
    assert keys[0] == keys[1]
    assert keys[2] != keys[0]


# -- keys --------------------------------------------------------------------------------


async def test_sqlite_store_without_a_key_is_refused_at_construction(tmp_path: Path) -> None:
    # Given an SQLite store, shared with other processes
    store = SQLiteCheckpointStore(tmp_path / "runs.db")
    try:
        # When a runner is built on it without checkpoint_key
        # Then ValueError, at construction
        with pytest.raises(ValueError, match="checkpoint_key"):
            FlowRunner(Executor(make_tickets().registry), checkpoints=store)
    finally:
        await store.aclose()


def test_memory_store_without_a_key_is_accepted():
    # Given the in-process memory store
    # When a runner is built on it without a key
    runner = FlowRunner(Executor(make_tickets().registry), checkpoints=MemoryCheckpointStore())

    # Then it signs with the store's own key
    assert runner.sealer is not None


@pytest.mark.parametrize("size", [0, 16, 31])
async def test_key_shorter_than_32_bytes_is_refused_at_construction(workers, size):
    # Given a key shorter than 32 bytes
    short = b"k" * size

    # When a runner is built with it (also as part of a rotation list)
    # Then ValueError at construction
    with pytest.raises(ValueError):
        workers.runner(key=short)
    with pytest.raises(ValueError):
        workers.runner(key=[KEY, short])


async def test_key_rotation_recovers_old_rows_and_signs_new_ones_with_the_first_key(workers):
    # Given a run started under key A whose worker died after the pay superstep
    await crashed_tickets(workers, "order-1", before_save=2)

    # When a worker with keys [B, A] recovers it, and dies before saving its last checkpoint
    rotated = workers.runner(key=[KEY_B, KEY])
    faulty(rotated).crash("save", step=4)
    with pytest.raises(Crash):
        await rotated.recover(TICKETS, "order-1")

    # Then the old rows stay signed with A and every new row is signed with B
    a, b = key_id(KEY), key_id(KEY_B)
    history = await workers.history("order-1")
    assert [c.kid for c in history] == [a, a, b, b]
    calls = await workers.calls("order-1")
    assert {r.kid for r in calls if r.segment == 0} == {a}
    assert {r.kid for r in calls if r.segment == 2} == {b}
    before = workers.ran()

    # When a worker holding only B recovers it
    # Then the rows signed with A are refused and nothing runs
    with pytest.raises(CheckpointStoreCorrupt):
        await workers.runner(key=KEY_B).recover(TICKETS, "order-1")
    assert workers.ran() == before

    # And a worker with [B, A] finishes it, replaying everything
    result = await workers.runner(key=[KEY_B, KEY]).recover(TICKETS, "order-1")
    assert result.status == "done"
    assert workers.ran() == before == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}
