"""A durable agent's start retried with the same run id attaches to the run its first try stored.

The rule of tests/protocol/test_retried_start.py, for `DurableAgent` runs: `AgentRunner.run` and
`AgentRunner.start` (what `FlowClient.start_agent` calls) retried with the same run id, prompt,
``deps_data``, request budget and identity carry on the run that is there, or return it as it
stands; never a second run, never a charge twice. Another input under the id is a conflict that
says to use a new run id, and the stored run is left as it was. The agent is the order agent of
`_kit.agents`; each test runs on every store set-up (`_kit.stores`), and the last on a Redis
primary whose replica is cut off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _kit.agents import EXPECTED, MAX_REQUESTS, PROMPT, durable, make_agent
from _kit.replication import replica_set, wait_for
from _kit.stores import StoreSetup
from _kit.tickets import Ledger
from agentkit import KEY

from agentflow import Registry, RunContext, RunStatus
from agentflow.errors import CheckpointConflict, StoreNotDurable
from agentflow.exec import LoopRunner
from agentflow.exec.checkpoints import CheckpointStore, RedisCheckpointStore
from agentflow.integrations.pydantic_ai import AgentInput, AgentRunner, DurableAgent
from agentflow.models import Message

#: What one whole run does: three model requests, each tool once.
ONCE = {"model": 3, "lookup_order": 1, "charge": 1}


def shop(run: AgentInput) -> str:
    """The order agent's deps here: the shop its run was started for (its ``deps_data``)."""
    return str(run.data.get("shop", ""))


def runner(store: CheckpointStore, ledger: Ledger, **agent: Any) -> AgentRunner:
    """A new runner (another process) of the order agent over `store`, its effects in `ledger`."""
    made = DurableAgent(make_agent(ledger), deps=shop, **agent) if agent else durable(make_agent(ledger), deps=shop)
    return made.runner(store, KEY)


async def test_an_agent_run_retried_with_the_same_run_id_carries_on_the_run_its_first_try_stored(
    store_setup: StoreSetup,
) -> None:
    ledger = Ledger(None)
    # Given a run whose step 0 is stored but whose caller never heard back
    await runner(store_setup.open(), ledger).start(PROMPT, run_id="order-1", deps_data={"shop": "eu"})
    # When the caller retries the run with the same run id, prompt and deps_data (another process)
    result = await runner(store_setup.open(), ledger).run(PROMPT, run_id="order-1", deps_data={"shop": "eu"})
    # Then the run it stored goes to its end: one charge
    assert result.status == RunStatus.DONE and result.output == EXPECTED
    assert ledger.counts("order-1") == ONCE
    # And a retry after the end returns the run as it ended, with no model request and no tool
    ended = await runner(store_setup.open(), ledger).run(PROMPT, run_id="order-1", deps_data={"shop": "eu"})
    assert ended.status == RunStatus.DONE and ended.output == EXPECTED and ended.messages == result.messages
    assert ledger.counts("order-1") == ONCE


async def test_an_agent_start_retried_returns_the_run_as_it_stands(store_setup: StoreSetup) -> None:
    ledger = Ledger(None)
    ctx = RunContext(user="ana", thread="t1")
    await runner(store_setup.open(), ledger).start(PROMPT, run_id="order-2", ctx=ctx)
    # When a client's start is sent again, as FlowClient.start_agent does it
    again = await runner(store_setup.open(), ledger).start(PROMPT, run_id="order-2", ctx=ctx)
    # Then it is the same run, still at its step 0, nothing run
    assert (again.run_id, again.status, again.step) == ("order-2", RunStatus.RUNNING, 0)
    assert [c.step for c in await store_setup.history("order-2")] == [0]
    # And once the run ended, a start sent again returns it as it ended, running nothing
    done = await runner(store_setup.open(), ledger).run(PROMPT, run_id="order-2", ctx=ctx)
    late = await runner(store_setup.open(), ledger).start(PROMPT, run_id="order-2", ctx=ctx)
    assert (late.status, late.step, late.messages) == (RunStatus.DONE, done.step, done.messages)
    assert ledger.counts("order-2") == ONCE


@pytest.mark.parametrize("how", ["run", "start"])
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("prompt", "started with another input, identity or lineage.*use a new run id"),
        ("deps_data", "started with another input, identity or lineage.*use a new run id"),
        ("user", "started with another input, identity or lineage.*use a new run id"),
        ("max_requests", "started with another input, identity or lineage.*use a new run id"),
        ("kind", "is a tool loop named 'orders', not a run of pydantic-ai agent 'orders': use a new run id"),
    ],
    ids=["prompt", "deps_data", "user", "max_requests", "kind"],
)
async def test_an_agent_start_with_another_input_under_a_taken_run_id_stays_a_conflict(
    store_setup: StoreSetup, how: str, change: str, message: str
) -> None:
    ledger = Ledger(None)
    if change == "kind":  # the id is a plain tool loop's, stored under the agent's name
        loops = LoopRunner(None, Registry(), checkpoints=store_setup.open(), checkpoint_key=KEY, name="orders")
        await loops.start([Message.user(PROMPT)], run_id="order-3", ctx=RunContext(user="ana"))
    else:
        await runner(store_setup.open(), ledger).start(
            PROMPT, run_id="order-3", deps_data={"shop": "eu"}, ctx=RunContext(user="ana")
        )
    before = await store_setup.history("order-3")
    prompt, deps_data, ctx = PROMPT, {"shop": "eu"}, RunContext(user="ana")
    agent: dict[str, Any] = {}
    if change == "prompt":
        prompt = PROMPT + " Twice."
    elif change == "deps_data":
        deps_data = {"shop": "us"}
    elif change == "user":
        ctx = RunContext(user="bob")
    elif change == "max_requests":
        agent = {"name": "orders", "idempotent": {"lookup_order"}, "max_requests": MAX_REQUESTS + 1}
    again = runner(store_setup.open(), ledger, **agent)
    # When a start with something else under the same run id comes
    with pytest.raises(CheckpointConflict, match=message):
        if how == "run":
            await again.run(prompt, run_id="order-3", deps_data=deps_data, ctx=ctx)
        else:
            await again.start(prompt, run_id="order-3", deps_data=deps_data, ctx=ctx)
    # Then the stored run is as it was and nothing ran
    assert await store_setup.history("order-3") == before
    assert ledger.counts("order-3") == {}


@pytest.mark.redis
@pytest.mark.slow
async def test_an_agent_start_the_replica_did_not_acknowledge_is_retried_into_one_run(tmp_path: Path) -> None:
    ledger = Ledger(None)
    with replica_set(tmp_path) as pair:
        store = RedisCheckpointStore.from_url(pair.primary.url, wait_replicas=1, wait_timeout_s=0.3)
        async with store:
            agent = runner(store, ledger)
            # Given the replica cut off when an agent run starts: its step 0 is not acknowledged
            pair.link.cut()
            with pytest.raises(StoreNotDurable, match=r"step 0 .*the run may exist.*retry the start with the same"):
                await agent.run(PROMPT, run_id="order-4")
            # And a retry while the replica is still away is not answered either (its step 0 could still be lost)
            with pytest.raises(StoreNotDurable, match="as a start retried with its id found it"):
                await agent.run(PROMPT, run_id="order-4")
            assert ledger.counts("order-4") == {}
            # When the replica is back and the client retries the same start once more
            pair.link.heal()
            wait_for(pair.in_sync, "the replica to catch up")
            result = await agent.run(PROMPT, run_id="order-4")
            # Then it carried on the one run the first try stored: one charge
            assert result.status == RunStatus.DONE and result.output == EXPECTED
            assert ledger.counts("order-4") == ONCE
