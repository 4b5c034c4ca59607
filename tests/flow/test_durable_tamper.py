"""Tampering with a store: every changed, moved, forged or missing row is CheckpointStoreCorrupt, and nothing runs.

Each test starts from the same crash: the tickets run died after its pay superstep, before
saving step 2. The store then holds checkpoints 0 and 1 and four call records in segment 0:
hold started (0), hold done (1), pay started (2), pay done (3). Recovery would replay pay.
"""

from __future__ import annotations

import dataclasses
import json

import durable_kit as kit
import pytest
from durable_kit import ORDER, TICKETS, Crash, body

from agentflow.exec._durable_seal import Sealer, canonical
from agentflow.exec.checkpoints import CheckpointStoreCorrupt


@pytest.fixture(params=kit.STORE_KINDS)
async def env(request, tmp_path):
    async with kit.open_env(request.param, tmp_path) as opened:
        yield opened


async def crashed(env: kit.Env, run_id: str = "order-1") -> None:
    first = env.runner()
    first.checkpoints.crash("save", step=2)
    with pytest.raises(Crash):
        await first.run(TICKETS, ORDER, run_id=run_id)
    assert [r.kind for r in await env.calls(run_id)] == ["started", "done", "started", "done"]
    assert [c.step for c in await env.history(run_id)] == [0, 1]


async def refused(env: kit.Env, run_id: str = "order-1", *, key: bytes = kit.KEY) -> CheckpointStoreCorrupt:
    """Recover `run_id`: it must fail with CheckpointStoreCorrupt, run no tool and claim nothing."""
    before, steps = kit.snapshot(), len(await env.history(run_id))
    with pytest.raises(CheckpointStoreCorrupt) as caught:
        await env.runner(key=key).recover(TICKETS, run_id)
    assert kit.LEDGER == before
    assert len(await env.history(run_id)) == steps
    return caught.value


def reencoded(row, change) -> bytes:
    decoded = body(row)
    change(decoded)
    return canonical(decoded)


async def test_changed_result_in_a_done_record_is_corrupt(env):
    # Given a crashed run whose log holds pay's result
    await crashed(env)
    done = (await env.calls("order-1"))[3]
    assert body(done)["result"] == "charged 80 for Hamlet"

    # When someone changes that result in the store (signature left as it was)
    forged = reencoded(done, lambda b: b.update(result="charged 0 for Hamlet"))
    env.put_call(done, dataclasses.replace(done, payload=forged))

    # Then recovery refuses the log and nothing runs
    await refused(env)


async def test_changed_state_field_in_a_checkpoint_is_corrupt(env):
    # Given a crashed run
    await crashed(env)
    latest = (await env.history("order-1"))[-1]

    # When someone changes a state field in its latest checkpoint
    forged = reencoded(latest, lambda b: b["state"].update(seats=200))
    env.put_checkpoint(latest, dataclasses.replace(latest, payload=forged))

    # Then recovery refuses it and nothing runs
    await refused(env)


@pytest.mark.parametrize(
    ("column", "value"),
    [("step", 5), ("status", "paused"), ("segment", 7), ("saved_at", 0.5), ("flow", "other")],
)
async def test_changed_column_of_a_checkpoint_row_is_corrupt(env, column, value):
    # Given a crashed run
    await crashed(env)
    latest = (await env.history("order-1"))[-1]

    # When someone changes a column kept in clear (step, status, segment, ...) of its latest checkpoint
    env.put_checkpoint(latest, dataclasses.replace(latest, **{column: value}))

    # Then recovery refuses it and nothing runs
    await refused(env)


async def test_swapped_call_records_are_corrupt(env):
    # Given a crashed run
    await crashed(env)
    records = await env.calls("order-1")
    started, done = records[2], records[3]

    # When someone swaps two records' contents (each keeps its place in the numbering)
    env.put_call(started, dataclasses.replace(done, seq=started.seq))
    env.put_call(done, dataclasses.replace(started, seq=done.seq))

    # Then recovery refuses the log and nothing runs
    await refused(env)


async def test_call_record_moved_from_another_run_is_corrupt(env):
    # Given two runs that crashed at the same point, so their pay results are byte-identical
    await crashed(env, "order-1")
    await crashed(env, "order-2")
    mine, theirs = (await env.calls("order-1"))[3], (await env.calls("order-2"))[3]
    assert mine.payload == theirs.payload and mine.sig != theirs.sig

    # When someone copies the other run's genuine record over this run's
    env.put_call(mine, dataclasses.replace(theirs, run_id="order-1"))

    # Then recovery refuses the log and nothing runs
    await refused(env, "order-1")


async def test_checkpoint_moved_from_another_run_is_corrupt(env):
    # Given two runs that crashed at the same point
    await crashed(env, "order-1")
    await crashed(env, "order-2")
    mine, theirs = (await env.history("order-1"))[-1], (await env.history("order-2"))[-1]

    # When someone copies the other run's genuine latest checkpoint over this run's
    env.put_checkpoint(mine, dataclasses.replace(theirs, run_id="order-1"))

    # Then recovery refuses it and nothing runs
    await refused(env, "order-1")


async def test_checkpoint_copied_to_another_step_is_corrupt(env):
    # Given a crashed run
    await crashed(env)
    step0, step1 = await env.history("order-1")

    # When someone puts the run's genuine step 0 in place of step 1 (rolling the run back)
    env.put_checkpoint(step1, dataclasses.replace(step0, step=1))

    # Then recovery refuses it and nothing runs (hold_seats would otherwise run again)
    await refused(env)


async def test_missing_record_in_the_middle_of_a_segment_is_corrupt(env):
    # Given a crashed run
    await crashed(env)
    records = await env.calls("order-1")

    # When someone deletes a record in the middle of the segment (a gap in the numbers)
    env.drop_call(records[1])

    # Then recovery refuses the log and nothing runs
    error = await refused(env)
    assert "missing" in str(error)


async def test_records_cut_from_before_the_latest_checkpoint_are_corrupt(env):
    # Given a crashed run whose latest checkpoint saw two records of its segment
    await crashed(env)
    records = await env.calls("order-1")

    # When someone deletes the tail of the log, back past what that checkpoint saw (no gap left)
    for record in reversed(records[1:]):
        env.drop_call(record)
    assert [(r.segment, r.seq) for r in await env.calls("order-1")] == [(0, 0)]

    # Then recovery refuses the log and nothing runs
    await refused(env)


async def test_record_forged_with_another_key_is_corrupt(env):
    # Given a crashed run
    await crashed(env)

    # When someone appends a well-formed record in the right place, signed with a key of their own
    forger = Sealer(kit.OTHER_KEY)
    extra = forger.seal_call("order-1", 0, 4, "done", {"call_id": "1/pay/0/x", "superstep": 1, "result": "x"})
    await env.raw.record_call("order-1", extra)

    # Then recovery refuses the log and nothing runs
    await refused(env)


async def test_rows_read_with_another_key_are_corrupt(env):
    # Given a crashed run signed with KEY
    await crashed(env)

    # When a worker configured with another key recovers it
    # Then it refuses every row and nothing runs
    await refused(env, key=kit.OTHER_KEY)


@pytest.mark.parametrize("where", ["checkpoint", "call record"])
async def test_tampered_row_is_rejected_before_its_payload_is_decoded(env, where):
    # Given a crashed run
    await crashed(env)

    # When someone replaces a payload with bytes that are not even JSON (signature left as it was)
    garbage = b"\xff\xfe{not json"
    with pytest.raises(ValueError):
        json.loads(garbage)
    if where == "checkpoint":
        latest = (await env.history("order-1"))[-1]
        env.put_checkpoint(latest, dataclasses.replace(latest, payload=garbage))
    else:
        done = (await env.calls("order-1"))[3]
        env.put_call(done, dataclasses.replace(done, payload=garbage))

    # Then the error is about the signature, not about JSON: the payload was never parsed
    error = await refused(env)
    assert "signature" in str(error)
    assert "JSON" not in str(error)


async def test_latest_checkpoint_deleted_is_corrupt(env):
    # Given a run whose worker died after the send superstep: checkpoints 0..2, send's records in the log
    first = env.runner()
    first.checkpoints.crash("save", step=3)
    with pytest.raises(Crash):
        await first.run(TICKETS, ORDER, run_id="order-1")
    assert kit.LEDGER == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}

    # When someone deletes the latest checkpoint (the run now looks as if pay were its last superstep),
    # while the signed log still holds email_tickets' `done` record of the superstep after it
    latest = (await env.history("order-1"))[-1]
    env.drop_checkpoint(latest)
    assert [body(r)["superstep"] for r in await env.calls("order-1")][-1] == 2

    # Then recovery refuses the store, and email_tickets (already done) does not run again
    await refused(env)
