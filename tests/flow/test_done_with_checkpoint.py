"""A superstep's last ``done`` goes with its checkpoint, in one atomic write.

When a lone `Call` node's call returns, nothing but the merge lies between it and the
superstep's checkpoint, so its ``done`` record is held and stored together with the
checkpoint (`save_after_calls`): one commit or round trip instead of two, and no moment
at which one is stored without the other. Any other call's ``done`` is stored at once.
"""

from __future__ import annotations

import secrets

import pytest
from _kit.faults import WriteLog
from pydantic import BaseModel

from agentflow import Call, Executor, Flow, FlowRunner, Registry
from agentflow.exec.calls.log import Journal
from agentflow.exec.checkpoints import CheckpointConflict, MemoryCheckpointStore
from agentflow.exec.seal import Sealer
from agentflow.flow import NodeHandle

registry = Registry()


@registry.tool
async def charge(amount: int) -> str:
    return f"charged {amount}"


class Bill(BaseModel):
    amount: int = 5
    note: str = ""


async def test_a_lone_call_nodes_done_is_stored_with_the_checkpoint():
    # Given a one-node flow whose node is a declarative Call
    flow = (
        Flow("bill", state=Bill)
        .node("pay", Call("charge", args=lambda b: {"amount": b.amount}, into="note"))
        .end("pay")
    )
    store = WriteLog(MemoryCheckpointStore())

    # When it runs
    result = await FlowRunner(Executor(registry), checkpoints=store).run(flow, {})

    # Then `started` was stored before the tool ran, and `done` went with the checkpoint
    assert result.status == "done" and result.state.note == "charged 5"
    assert store.methods == ["save:0", "record:started", "both:done:1"]
    assert [c.kind for c in await store.calls(result.run_id)] == ["started", "done"]


async def test_a_function_nodes_done_is_stored_as_soon_as_its_call_returns():
    # Given a node function that calls the tool and then goes on working
    async def pay(bill: Bill, handle: NodeHandle) -> dict[str, object]:
        note = await handle.call("charge", amount=bill.amount)
        return {"note": note.upper()}

    flow = Flow("bill-fn", state=Bill).node("pay", pay).end("pay")
    store = WriteLog(MemoryCheckpointStore())

    # When it runs
    result = await FlowRunner(Executor(registry), checkpoints=store).run(flow, {})

    # Then its `done` was stored on its own, before the checkpoint (the node could still have died)
    assert result.state.note == "CHARGED 5"
    assert store.methods == ["save:0", "record:started", "record:done", "save:1"]


async def test_a_refused_combined_save_still_stores_the_held_done_record():
    # Given a journal holding a `done` record, while another worker saved the next step first
    store = MemoryCheckpointStore()
    sealer = Sealer(secrets.token_bytes(32))
    await store.save("r1", 0, sealer.seal_checkpoint("r1", 0, "f", "running", 0, 1.0, {}))
    journal = Journal(store, sealer, "r1", segment=0)
    await journal.write("started", {"call_id": "0/pay/0/x"})
    await journal.hold_encoded("done", b'{"call_id":"0/pay/0/x"}')
    await store.save("r1", 1, sealer.seal_checkpoint("r1", 1, "f", "running", 1, 2.0, {}))

    # When the journal saves its checkpoint for the same step
    with pytest.raises(CheckpointConflict):
        await journal.save(1, sealer.seal_checkpoint("r1", 1, "f", "running", 0, 3.0, {}))

    # Then the checkpoint was refused, but the finished call's result is in the log
    assert (await store.latest("r1")).segment == 1
    assert [(c.seq, c.kind) for c in await store.calls("r1")] == [(0, "started"), (1, "done")]
