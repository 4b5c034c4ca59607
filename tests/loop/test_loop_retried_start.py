"""A tool loop's start retried with the same run id attaches to the loop its first try stored.

The rule of tests/protocol/test_retried_start.py, for tool loops: `run_tool_loop` (`LoopRunner.run`)
and `LoopRunner.start` (what `FlowClient.start_loop` calls) retried with the same run id,
messages, ``max_steps`` and identity carry on the loop that is there, or return it as it stands;
never a second loop, never a tool run twice. Another input under the id is a conflict that says
to use a new run id, and the stored loop is left as it was. The conversation is loopkit.py's
(``lookup``, then ``charge`` and ``email``, each writing the ledger); each test runs on every
store set-up (`_kit.stores`), and the last on a Redis primary whose replica is cut off.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from _kit.replication import replica_set, wait_for
from _kit.stores import StoreSetup
from _kit.tickets import ORDER, TICKETS, Ledger, make_tickets
from loopkit import FINAL, KEY, MAX_STEPS, PROMPT, LedgerModel, build

from agentflow import FlowRunner, RunContext, RunStatus
from agentflow.errors import CheckpointConflict, StoreNotDurable
from agentflow.exec import Executor, LoopResult, LoopRunner, run_tool_loop
from agentflow.exec.checkpoints import CheckpointStore, RedisCheckpointStore
from agentflow.models import Message

MESSAGES = [Message.user(PROMPT)]
#: What one whole conversation runs: three model calls, each tool once.
ONCE = {"model": 3, "lookup": 1, "charge": 1, "email": 1}


def runner(store: CheckpointStore, ledger: Ledger, run_id: str, *, name: str = "tool_loop") -> LoopRunner:
    """A new runner (another process) over `store`, its model and tools writing `ledger` under `run_id`."""
    return LoopRunner(
        LedgerModel(ledger, run_id), build(ledger, run_id), checkpoints=store, checkpoint_key=KEY, name=name
    )


async def retried_run(
    store: CheckpointStore, ledger: Ledger, run_id: str, messages: Sequence[Message] = MESSAGES, **kw: Any
) -> LoopResult:
    """`run_tool_loop` as a client that retries it calls it, with a model and tools of its own."""
    kw.setdefault("max_steps", MAX_STEPS)
    model, tools = LedgerModel(ledger, run_id), build(ledger, run_id)
    return await run_tool_loop(model, tools, messages, run_id=run_id, checkpoints=store, checkpoint_key=KEY, **kw)


async def test_a_tool_loop_run_retried_with_the_same_run_id_carries_on_the_loop_its_first_try_stored(
    store_setup: StoreSetup,
) -> None:
    ledger = Ledger(None)
    # Given a loop whose step 0 is stored but whose caller never heard back
    await runner(store_setup.open(), ledger, "chat-1").start(MESSAGES, run_id="chat-1", max_steps=MAX_STEPS)
    # When the caller retries run_tool_loop with the same run id and messages (another process)
    result = await retried_run(store_setup.open(), ledger, "chat-1")
    # Then the loop it stored goes to its end: each tool once
    assert result.status == RunStatus.DONE and result.text == FINAL
    assert ledger.counts("chat-1") == ONCE
    # And a retry after the end returns the loop as it ended, calling neither the model nor a tool
    ended = await retried_run(store_setup.open(), ledger, "chat-1")
    assert ended.status == RunStatus.DONE and ended.messages == result.messages
    assert ledger.counts("chat-1") == ONCE
    assert [c.step for c in await store_setup.history("chat-1")][0] == 0


async def test_a_tool_loop_start_retried_returns_the_loop_as_it_stands(store_setup: StoreSetup) -> None:
    ledger = Ledger(None)
    ctx = RunContext(user="ana", thread="t1")
    first = await runner(store_setup.open(), ledger, "chat-2").start(MESSAGES, run_id="chat-2", ctx=ctx)
    # When a client's start is sent again, as FlowClient.start_loop does it
    again = await runner(store_setup.open(), ledger, "chat-2").start(MESSAGES, run_id="chat-2", ctx=ctx)
    # Then it is the same loop, still at its step 0, nothing run
    assert (again.run_id, again.status, again.step) == ("chat-2", RunStatus.RUNNING, 0)
    assert again.messages == first.messages == MESSAGES
    assert [c.step for c in await store_setup.history("chat-2")] == [0]
    # And once the loop ended, a start sent again returns it as it ended, running nothing
    done = await retried_run(store_setup.open(), ledger, "chat-2", ctx=ctx, max_steps=10)
    late = await runner(store_setup.open(), ledger, "chat-2").start(MESSAGES, run_id="chat-2", ctx=ctx)
    assert (late.status, late.messages, late.step) == (RunStatus.DONE, done.messages, done.step)
    assert ledger.counts("chat-2") == ONCE


@pytest.mark.parametrize("how", ["run", "start"])
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("messages", "started with another input, identity or lineage.*use a new run id"),
        ("max_steps", "started with another input, identity or lineage.*use a new run id"),
        ("user", "started with another input, identity or lineage.*use a new run id"),
        ("name", "is a tool loop named 'tool_loop', not a tool loop named 'other'.*use a new run id"),
        ("kind", "is a flow named 'tickets', not a tool loop named 'tool_loop'.*use a new run id"),
    ],
    ids=["messages", "max_steps", "user", "name", "kind"],
)
async def test_a_tool_loop_start_with_another_input_under_a_taken_run_id_stays_a_conflict(
    store_setup: StoreSetup, how: str, change: str, message: str
) -> None:
    ledger = Ledger(None)
    if change == "kind":  # the id is a flow run's
        tickets = make_tickets()
        flows = FlowRunner(Executor(tickets.registry), checkpoints=store_setup.open(), checkpoint_key=KEY)
        await flows.start(TICKETS, ORDER, run_id="chat-3", ctx=RunContext(user="ana"))
    else:
        await runner(store_setup.open(), ledger, "chat-3").start(
            MESSAGES, run_id="chat-3", max_steps=MAX_STEPS, ctx=RunContext(user="ana")
        )
    before = await store_setup.history("chat-3")
    messages, max_steps, ctx, name = MESSAGES, MAX_STEPS, RunContext(user="ana"), "tool_loop"
    if change == "messages":
        messages = [Message.user(PROMPT + " Twice.")]
    elif change == "max_steps":
        max_steps = MAX_STEPS + 1
    elif change == "user":
        ctx = RunContext(user="bob")
    elif change == "name":
        name = "other"
    again = runner(store_setup.open(), ledger, "chat-3", name=name)
    # When a start with something else under the same run id comes
    with pytest.raises(CheckpointConflict, match=message):
        if how == "run":
            await again.run(messages, run_id="chat-3", max_steps=max_steps, ctx=ctx)
        else:
            await again.start(messages, run_id="chat-3", max_steps=max_steps, ctx=ctx)
    # Then the stored run is as it was and nothing ran
    assert await store_setup.history("chat-3") == before
    assert ledger.counts("chat-3") == {}


@pytest.mark.redis
@pytest.mark.slow
async def test_a_tool_loop_start_the_replica_did_not_acknowledge_is_retried_into_one_loop(tmp_path: Path) -> None:
    ledger = Ledger(None)
    with replica_set(tmp_path) as pair:
        store = RedisCheckpointStore.from_url(pair.primary.url, wait_replicas=1, wait_timeout_s=0.3)
        async with store:
            # Given the replica cut off when a loop starts: its step 0 is not acknowledged
            pair.link.cut()
            with pytest.raises(StoreNotDurable, match=r"step 0 .*the run may exist.*retry the start with the same"):
                await retried_run(store, ledger, "chat-4")
            # And a retry while the replica is still away is not answered either (its step 0 could still be lost)
            with pytest.raises(StoreNotDurable, match="as a start retried with its id found it"):
                await retried_run(store, ledger, "chat-4")
            assert ledger.counts("chat-4") == {}
            # When the replica is back and the client retries the same start once more
            pair.link.heal()
            wait_for(pair.in_sync, "the replica to catch up")
            result = await retried_run(store, ledger, "chat-4")
            # Then it carried on the one loop the first try stored: each tool once
            assert result.status == RunStatus.DONE and result.text == FINAL
            assert ledger.counts("chat-4") == ONCE
