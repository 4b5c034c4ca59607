"""A durable pydantic-ai agent on real Celery workers: each stage is a task; a worker SIGKILLed inside
a non-idempotent tool parks the run until an operator decides, through the client."""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter

import pytest
from _kit.agents import EXPECTED, PROMPT, charge_result

from agentflow import Happened, Rerun
from agentflow.errors import FlowError

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.timeout(300)]


async def test_a_durable_agent_runs_stage_by_stage_as_tasks(shared):
    # Given a worker whose app registers the order agent beside its flows
    # When the agent is started through the client
    run_id = await shared.client.start_agent("orders", PROMPT)
    result = await shared.client.settle(run_id, timeout_s=60)
    # Then every stage ran as a task and the run ended with the output an in-process run gives
    assert (result.kind, result.name, result.engine) == ("agent", "orders", "pydantic-ai")
    assert result.status == "done", result.error
    assert result.output == await shared.client.result(run_id) == EXPECTED
    effects = shared.effects()
    assert (effects[("lookup_order", run_id)], effects[("charge", run_id)]) == (1, 1)
    # And each stage was its own checkpoint: the prompt, three responses and two rounds of tools, the output
    assert result.step == 6


async def test_a_worker_killed_inside_charge_parks_the_agent_until_an_operator_decides(deployment):
    # Given a worker that dies (its whole process group, SIGKILL) right after the card was charged
    deployment.set_delay(0.8, 0.8)  # charge waits this long after its effect: the kill lands inside it
    deployment.start_worker("w1")
    run_id = await deployment.client.start_agent("orders", PROMPT, run_id=f"{deployment.prefix}-agent")
    await deployment.until_effect("charge", run_id)
    deployment.kill_group("w1")
    deployment.set_delay(0.0, 0.0)
    # When another worker starts and looks at the run
    deployment.start_worker("w2")
    parked = await deployment.client.settle(run_id, timeout_s=60)
    # Then the charge is in doubt and the run waits for a person: nothing reran it
    assert parked.status == "running" and parked.waiting is not None and parked.waiting.what == "decision"
    doubtful = parked.waiting.calls
    assert [c.tool for c in doubtful] == ["charge"], parked
    assert deployment.effects()[("charge", run_id)] == 1
    # When an operator checked the card and says it happened, with its result
    await deployment.client.decide_in_doubt(
        run_id, calls={doubtful[0].call_id: Happened(charge_result("A1", 90))}, operator="erin"
    )
    # Then a worker carries the agent on to the same output, and the card was charged once
    result = await deployment.client.settle(run_id, timeout_s=60)
    assert result.status == "done" and result.output == EXPECTED
    assert deployment.effects()[("charge", run_id)] == 1


async def test_a_tool_loop_is_not_started_as_an_agent_nor_an_agent_as_a_tool_loop(deployment):
    from agentflow.models import Message

    with pytest.raises(FlowError, match="is a tool loop started from messages: start it with start_loop"):
        await deployment.client.start_agent("forecast", PROMPT)
    with pytest.raises(FlowError, match="is a pydantic-ai agent, not a tool loop started from messages"):
        await deployment.client.start_loop("orders", [Message.user(PROMPT)])


#: Random SIGKILLs of the worker running an agent run (`make soak` sets AGENT_WORKER_KILLS for the long form).
WORKER_KILLS = int(os.environ.get("AGENT_WORKER_KILLS", "2"))


@pytest.mark.timeout(60 + 30 * WORKER_KILLS)
async def test_random_worker_kills_never_charge_an_agent_run_twice(deployment):
    rng = random.Random(int(os.environ.get("AGENT_SEED", "20261204")))
    decided = Counter[str]()
    for i in range(WORKER_KILLS):
        # Given a worker running an agent run with slow tools, SIGKILLed (its whole group) at a random moment
        deployment.set_delay(0.2, 0.5)
        deployment.start_worker(f"k{i}")
        run_id = await deployment.client.start_agent("orders", PROMPT, run_id=f"{deployment.prefix}-a{i}")
        await asyncio.sleep(rng.uniform(0.0, 1.5))  # the kill's moment: anywhere in the run, or after it
        deployment.kill_group(f"k{i}")
        # When a new worker takes over, and an operator decides a cut-off charge from the card's statement
        deployment.set_delay(0.0, 0.0)
        deployment.start_worker(f"r{i}")
        while (settled := await deployment.client.settle(run_id, timeout_s=60)).status == "running":
            report = await deployment.report(run_id)
            charged = deployment.effects()[("charge", run_id)] > 0
            decision = Happened(charge_result("A1", 90)) if charged else Rerun()
            doubtful = {c.call_id: decision for c in report.calls if c.state == "in doubt"}
            assert set(c.tool for c in report.calls if c.state == "in doubt") == {"charge"}, report.calls
            await deployment.client.decide_in_doubt(run_id, calls=doubtful, operator="soak")
            decided["happened" if charged else "rerun"] += 1
        # Then the run ends with the uninterrupted output, and the card was charged exactly once
        assert settled.status == "done", settled
        assert settled.output == EXPECTED
        assert deployment.effects()[("charge", run_id)] == 1
        deployment.kill_group(f"r{i}")  # idle: the next run starts on a worker of its own
    print(f"\n{WORKER_KILLS} worker kills over {WORKER_KILLS} agent runs: decisions {dict(decided)}, charges once each")


async def test_a_deps_factory_that_fails_on_a_worker_fails_the_run_saying_why(shared):
    # Given the order agent whose deps a factory builds from deps_data["shop"], started without it
    run_id = await shared.client.start_agent("shop-orders", PROMPT, deps_data={"region": "eu"})
    # When a worker runs its first stage, Then the run fails with the factory's mistake and what to do
    view = await shared.client.settle(run_id, timeout_s=60)
    assert view.status == "failed", view
    assert "the deps factory of agent 'shop-orders' raised KeyError: 'shop'" in (view.error or "")
    assert "deps_data keys ['region']" in (view.error or "")
