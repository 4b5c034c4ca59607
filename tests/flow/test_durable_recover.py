"""Durable runs: checkpoints per superstep, the call log, crash recovery, in-doubt calls, keys."""

from __future__ import annotations

from pathlib import Path

import durable_kit as kit
import pytest
from durable_kit import ORDER, TICKETS, Crash, body

from agentflow import Executor, FlowRunner
from agentflow.exec._durable_seal import key_id
from agentflow.exec.checkpoints import (
    CheckpointConflict,
    CheckpointNotFound,
    CheckpointStoreCorrupt,
    MemoryCheckpointStore,
    RecoveryNeedsDecision,
)
from agentflow.flow import FlowError, RunResult


@pytest.fixture(params=kit.STORE_KINDS)
async def env(request, tmp_path):
    async with kit.open_env(request.param, tmp_path) as opened:
        yield opened


async def crashed_tickets(env: kit.Env, run_id: str, *, before_save: int | None = None) -> None:
    """Run TICKETS until the worker dies (before saving `before_save`, or where CRASH_IN says)."""
    first = env.runner()
    if before_save is not None:
        first.checkpoints.crash("save", step=before_save)
    with pytest.raises(Crash):
        await first.run(TICKETS, ORDER, run_id=run_id)


# -- checkpoints and the call log --------------------------------------------------------


async def test_step_zero_is_saved_at_start_and_one_checkpoint_follows_each_superstep(env):
    # Given the three-superstep tickets flow on a durable runner
    runner = env.runner()

    # When it runs to the end
    result = await runner.run(TICKETS, ORDER, run_id="order-1")

    # Then step 0 was saved before any tool ran, and one checkpoint followed each superstep
    assert result.status == "done"
    history = await env.history("order-1")
    assert [c.step for c in history] == [0, 1, 2, 3]
    assert [c.status for c in history] == ["running", "running", "running", "done"]
    assert [body(c)["superstep"] for c in history] == [0, 1, 2, 3]
    saves_and_tools = [t for t in kit.TRACE if t.startswith(("save:", "tool:"))]
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
    saved = [e.data for e in env.named("checkpoint.saved")]
    assert [(d["kind"], d["flow"], d["step"], d["status"]) for d in saved] == [
        ("flow", "tickets", 0, "running"),
        ("flow", "tickets", 1, "running"),
        ("flow", "tickets", 2, "running"),
        ("flow", "tickets", 3, "done"),
    ]


async def test_every_call_logs_started_before_the_tool_runs_then_done(env):
    # Given the tickets flow on a durable runner
    runner = env.runner()

    # When it runs to the end
    await runner.run(TICKETS, ORDER, run_id="order-1")

    # Then each call has a numbered `started` then `done` record, and `started` came before the tool ran
    records = await env.calls("order-1")
    assert [r.kind for r in records] == ["started", "done"] * 3
    assert [(r.segment, r.seq) for r in records] == [(0, n) for n in range(6)]
    for started, done in zip(records[::2], records[1::2], strict=True):
        assert body(started)["call_id"] == body(done)["call_id"]
    assert [body(r)["tool"] for r in records[::2]] == ["hold_seats", "charge_card", "email_tickets"]
    assert body(records[1])["result"] == "held 2 for Hamlet"
    log = [t for t in kit.TRACE if t.startswith(("record:", "tool:"))]
    assert log[:3] == ["record:started:hold", "tool:hold_seats", "record:done:hold"]
    assert log[3:6] == ["record:started:pay", "tool:charge_card", "record:done:pay"]


# -- recovery ----------------------------------------------------------------------------


async def test_recover_after_a_crash_replays_finished_calls_without_running_them(env):
    # Given a run whose worker died after the pay superstep, before saving its checkpoint
    await crashed_tickets(env, "order-1", before_save=2)
    assert kit.LEDGER == {"hold_seats": 1, "charge_card": 1}

    # When a new worker recovers it
    result = await env.runner().recover(TICKETS, "order-1")

    # Then it completes, charge_card replays from the log (ran once in all), email runs once
    assert result.status == "done"
    assert result.state.paid == "charged 80 for Hamlet"
    assert result.state.sent == "mailed Hamlet"
    assert kit.LEDGER == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}
    replayed = env.named("tool.replayed")
    assert [e.data["tool"] for e in replayed] == ["charge_card"]
    # and the recovering worker claimed step 2 with a new segment for its records
    history = await env.history("order-1")
    assert [(c.step, c.segment) for c in history] == [(0, 0), (1, 0), (2, 2), (3, 2), (4, 2)]
    assert {r.segment for r in (await env.calls("order-1"))[4:]} == {2}


async def test_result_of_a_recovery_lists_the_replayed_calls(env):
    # Given a run whose worker died after the pay superstep
    await crashed_tickets(env, "order-1", before_save=2)

    # When a new worker recovers it and it goes on past the recovered superstep
    result = await env.runner().recover(TICKETS, "order-1")

    # Then the result says which calls were replayed (RunResult.replayed: "after a recovery or resume")
    assert [cid.split("/")[1] for cid in result.replayed] == ["pay"]


async def test_started_call_of_an_idempotent_tool_runs_again_on_recover(env):
    # Given a run whose worker died inside hold_seats (idempotent): started, no result
    kit.CRASH_IN.add("hold_seats")
    await crashed_tickets(env, "order-1")
    assert [r.kind for r in await env.calls("order-1")] == ["started"]

    # When a new worker recovers it (no decision given)
    result = await env.runner().recover(TICKETS, "order-1")

    # Then hold_seats ran again and the run finished
    assert result.status == "done"
    assert kit.LEDGER == {"hold_seats": 2, "charge_card": 1, "email_tickets": 1}
    (recovered,) = env.named("run.recovered")
    assert [cid.split("/")[1] for cid in recovered.data["rerun"]] == ["hold"]


async def test_started_call_of_a_non_idempotent_tool_needs_a_decision_before_anything_runs(env):
    # Given a run whose worker died inside email_tickets (not idempotent)
    kit.CRASH_IN.add("email_tickets")
    await crashed_tickets(env, "order-1")
    before, steps = kit.snapshot(), len(await env.history("order-1"))

    # When a new worker recovers it without a decision
    with pytest.raises(RecoveryNeedsDecision) as caught:
        await env.runner().recover(TICKETS, "order-1")

    # Then it names the call, and nothing ran and nothing was claimed
    assert len(caught.value.calls) == 1
    tool, why = caught.value.calls[0]
    assert tool == "email_tickets"
    assert isinstance(why, str) and why
    rebuilt = type(caught.value)(*caught.value.args)  # what a JSON result backend carries
    assert rebuilt.calls == caught.value.calls
    assert kit.LEDGER == before
    assert len(await env.history("order-1")) == steps

    # When it is recovered with rerun_in_doubt=True
    result = await env.runner().recover(TICKETS, "order-1", rerun_in_doubt=True)

    # Then the call runs again and the run finishes
    assert result.status == "done"
    assert kit.LEDGER["email_tickets"] == before["email_tickets"] + 1
    assert kit.LEDGER["charge_card"] == 1


async def test_unrecordable_result_is_logged_and_counts_as_in_doubt(env):
    # Given a run whose call returned a value JSON cannot carry, then the worker died
    first = env.runner()
    first.checkpoints.crash("save", step=1)
    with pytest.raises(Crash):
        await first.run(kit.OPAQUE, ORDER, run_id="opaque-1")
    assert [r.kind for r in await env.calls("opaque-1")] == ["started", "unrecordable"]
    before = kit.snapshot()

    # When a new worker recovers it without a decision
    with pytest.raises(RecoveryNeedsDecision) as caught:
        await env.runner().recover(kit.OPAQUE, "opaque-1")

    # Then the call is in doubt (ran, result not stored) and nothing ran
    assert [tool for tool, _ in caught.value.calls] == ["make_opaque"]
    assert "could not be stored" in caught.value.calls[0][1]
    assert kit.LEDGER == before


async def test_recover_of_a_finished_run_is_a_conflict(env):
    # Given a run that finished
    await env.runner().run(TICKETS, ORDER, run_id="order-1")
    before = kit.snapshot()

    # When a worker tries to recover it
    # Then it is refused and nothing runs
    with pytest.raises(CheckpointConflict):
        await env.runner().recover(TICKETS, "order-1")
    assert kit.LEDGER == before


async def test_recover_of_an_unknown_run_is_not_found(env):
    # Given an empty store
    # When a worker recovers a run id nobody saved
    # Then CheckpointNotFound
    with pytest.raises(CheckpointNotFound):
        await env.runner().recover(TICKETS, "nobody-saved-this")
    assert not kit.LEDGER


async def test_recover_all_recovers_every_unfinished_run_and_skips_finished_ones(env):
    # Given a crashed run, a finished run and a run with a call in doubt
    await crashed_tickets(env, "crashed", before_save=2)
    await env.runner().run(TICKETS, ORDER, run_id="finished")
    kit.CRASH_IN.add("email_tickets")
    await crashed_tickets(env, "in-doubt")
    before = kit.snapshot()

    # When a worker starting up recovers all of the flow's runs
    out = await env.runner().recover_all(TICKETS)

    # Then each unfinished run maps to its result or its error, the finished one is left alone
    assert set(out) == {"crashed", "in-doubt"}
    assert isinstance(out["crashed"], RunResult) and out["crashed"].status == "done"
    assert isinstance(out["in-doubt"], RecoveryNeedsDecision)
    assert kit.LEDGER - before == {"email_tickets": 1}


async def test_call_whose_arguments_changed_runs_again_and_is_reported_unreplayed(env):
    # Given a run whose worker died after charging 2 seats, before its checkpoint
    first = env.runner()
    first.checkpoints.crash("save", step=1)
    with pytest.raises(Crash):
        await first.run(kit.SWITCHED, ORDER, run_id="switch-1")
    (old_id,) = {body(r)["call_id"] for r in await env.calls("switch-1")}

    # When the node's arguments change (3 seats) and a new worker recovers it
    kit.SWITCH["extra_seats"] = 1
    result = await env.runner().recover(kit.SWITCHED, "switch-1")

    # Then the charge ran again (not replayed) and checkpoint.saved reports it as unreplayed
    assert result.status == "done"
    assert result.state.paid == "charged 120 for Hamlet"
    assert kit.LEDGER["charge_card"] == 2
    reported = [cid for e in env.named("checkpoint.saved") for cid in e.data["unreplayed"]]
    assert len(reported) == 1
    assert reported[0] != old_id and reported[0].startswith("0/pay/0/")
    (recovered,) = env.named("run.recovered")
    assert recovered.data["replayed"] == []


async def test_run_recovered_event_carries_kind_step_replayed_and_rerun(env):
    # Given a run whose worker died inside slow_lookup (idempotent) after hold_seats finished, in one node
    kit.CRASH_IN.add("slow_lookup")
    first = env.runner()
    with pytest.raises(Crash):
        await first.run(kit.BATCH, ORDER, run_id="batch-1")

    # When a new worker recovers it
    result = await env.runner().recover(kit.BATCH, "batch-1")

    # Then run.recovered says: a flow, the claimed step, hold_seats replayed, slow_lookup rerun
    assert result.status == "done"
    (event,) = env.named("run.recovered")
    assert event.run_id == "batch-1"
    assert event.data["kind"] == "flow"
    assert event.data["step"] == 1
    assert [cid.rsplit("/", 1)[0] for cid in event.data["replayed"]] == ["0/batch/0"]
    assert [cid.rsplit("/", 1)[0] for cid in event.data["rerun"]] == ["0/batch/1"]
    assert kit.LEDGER == {"hold_seats": 1, "slow_lookup": 2, "charge_card": 1, "email_tickets": 1}


async def test_second_crash_in_the_same_superstep_replays_what_both_workers_finished(env):
    # Given a run whose worker died inside slow_lookup, and whose first recoverer reran it
    # and then died inside charge_card, all in the same superstep
    kit.CRASH_IN.add("slow_lookup")
    with pytest.raises(Crash):
        await env.runner().run(kit.BATCH, ORDER, run_id="batch-1")
    kit.CRASH_IN.add("charge_card")
    with pytest.raises(Crash):
        await env.runner().recover(kit.BATCH, "batch-1")
    assert kit.LEDGER == {"hold_seats": 1, "slow_lookup": 2, "charge_card": 1}

    # When a third worker recovers it
    # Then charge_card (started in the second segment) is in doubt
    with pytest.raises(RecoveryNeedsDecision) as caught:
        await env.runner().recover(kit.BATCH, "batch-1")
    assert [tool for tool, _ in caught.value.calls] == ["charge_card"]

    # And once allowed, hold_seats (segment 0) and slow_lookup (segment 1) replay; only charge_card reruns
    result = await env.runner().recover(kit.BATCH, "batch-1", rerun_in_doubt=True)
    assert result.status == "done"
    assert kit.LEDGER == {"hold_seats": 1, "slow_lookup": 2, "charge_card": 2, "email_tickets": 1}
    last = env.named("run.recovered")[-1].data
    assert [cid.rsplit("/", 1)[0] for cid in last["replayed"]] == ["0/batch/0", "0/batch/1"]
    assert [cid.rsplit("/", 1)[0] for cid in last["rerun"]] == ["0/batch/2"]


async def test_recover_of_another_flows_run_is_a_conflict(env):
    # Given a crashed run of the tickets flow
    await crashed_tickets(env, "order-1", before_save=2)
    before = kit.snapshot()

    # When a worker recovers it as a run of another flow
    # Then CheckpointConflict ("it is another flow's"), and nothing ran
    try:
        with pytest.raises(CheckpointConflict):
            await env.runner().recover(kit.SWITCHED, "order-1")
    finally:
        assert kit.LEDGER == before


async def test_recover_with_a_flow_whose_graph_changed_is_a_flow_error(env):
    # Given a crashed run of the tickets flow
    await crashed_tickets(env, "order-1", before_save=2)
    before = kit.snapshot()

    # When a worker recovers it with a flow of the same name but another graph
    changed = kit.tickets_flow(with_receipt=True)
    assert changed.name == TICKETS.name and changed.digest != TICKETS.digest

    # Then FlowError, and nothing ran
    with pytest.raises(FlowError):
        await env.runner().recover(changed, "order-1")
    assert kit.LEDGER == before


async def test_idempotency_key_is_the_same_on_the_first_run_and_after_recovery(env):
    # Given a run whose worker died inside charge_card after it read its idempotency key
    kit.CRASH_IN.add("charge_card")
    await crashed_tickets(env, "order-1")

    # When a new worker reruns the call in doubt
    await env.runner().recover(TICKETS, "order-1", rerun_in_doubt=True)

    # Then charge_card saw the same key both times; another run's call has another key
    await env.runner().run(TICKETS, ORDER, run_id="order-2")
    keys = [key for tool, key in kit.KEYS if tool == "charge_card"]
    assert len(keys) == 3
    assert keys[0] == keys[1]
    assert keys[2] != keys[0]


# -- keys --------------------------------------------------------------------------------


async def test_sqlite_store_without_a_key_is_refused_at_construction(tmp_path: Path):
    # Given an SQLite store, shared with other processes
    store = kit.sqlite_store_class()(tmp_path / "runs.db")
    try:
        # When a runner is built on it without checkpoint_key
        # Then ValueError, at construction
        with pytest.raises(ValueError, match="checkpoint_key"):
            FlowRunner(Executor(kit.REGISTRY), checkpoints=store)
    finally:
        await store.aclose()


def test_memory_store_without_a_key_is_accepted():
    # Given the in-process memory store
    # When a runner is built on it without a key
    runner = FlowRunner(Executor(kit.REGISTRY), checkpoints=MemoryCheckpointStore())

    # Then it signs with the store's own key
    assert runner.sealer is not None


@pytest.mark.parametrize("size", [0, 16, 31])
async def test_key_shorter_than_32_bytes_is_refused_at_construction(env, size):
    # Given a key shorter than 32 bytes
    short = b"k" * size

    # When a runner is built with it (also as part of a rotation list)
    # Then ValueError at construction
    with pytest.raises(ValueError):
        env.runner(key=short)
    with pytest.raises(ValueError):
        env.runner(key=[kit.KEY, short])


async def test_key_rotation_recovers_old_rows_and_signs_new_ones_with_the_first_key(env):
    # Given a run started under key A whose worker died after the pay superstep
    await crashed_tickets(env, "order-1", before_save=2)

    # When a worker with keys [B, A] recovers it, and dies before saving its last checkpoint
    rotated = env.runner(key=[kit.KEY_B, kit.KEY])
    rotated.checkpoints.crash("save", step=4)
    with pytest.raises(Crash):
        await rotated.recover(TICKETS, "order-1")

    # Then the old rows stay signed with A and every new row is signed with B
    a, b = key_id(kit.KEY), key_id(kit.KEY_B)
    history = await env.history("order-1")
    assert [c.kid for c in history] == [a, a, b, b]
    calls = await env.calls("order-1")
    assert {r.kid for r in calls if r.segment == 0} == {a}
    assert {r.kid for r in calls if r.segment == 2} == {b}
    before = kit.snapshot()

    # When a worker holding only B recovers it
    # Then the rows signed with A are refused and nothing runs
    with pytest.raises(CheckpointStoreCorrupt):
        await env.runner(key=kit.KEY_B).recover(TICKETS, "order-1")
    assert kit.LEDGER == before

    # And a worker with [B, A] finishes it, replaying everything
    result = await env.runner(key=[kit.KEY_B, kit.KEY]).recover(TICKETS, "order-1")
    assert result.status == "done"
    assert kit.LEDGER == before == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}
