"""`FlowClient.start_loop` and `start_agent` retried with the same run id, on real Celery workers.

A client whose start raised (`StoreNotDurable` among the errors) or whose answer was lost sends
the same start again. It attaches to the run its first try stored and sends its first stage
again: one run, each effect once, and a stage message that finds the run moved on does nothing
(its task ends ``SKIPPED``). Another input under the id is a `CheckpointConflict` that says to
use a new run id, and nothing is sent. The loop is celery_flows.py's ``forecast``, the agent its
``orders`` (the order agent of `_kit.agents`).
"""

from __future__ import annotations

from typing import Any

import pytest
from _kit.agents import EXPECTED, PROMPT
from celery_kit import Deployment, ended

from agentflow.errors import CheckpointConflict
from agentflow.models import Message

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.timeout(120)]

OSLO = [Message.user("Oslo")]


def sent_tasks(deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the stage tasks the client sends from now on, in order."""
    sent: list[str] = []
    send = deployment.tasks.send_superstep

    def recording(*args: Any, **kwargs: Any) -> str:
        sent.append(send(*args, **kwargs))
        return sent[-1]

    monkeypatch.setattr(deployment.tasks, "send_superstep", recording)
    return sent


async def test_a_loop_or_agent_start_retried_through_the_client_attaches_to_the_run_it_stored(
    shared: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = sent_tasks(shared, monkeypatch)
    loop_id, agent_id = f"{shared.prefix}-loop", f"{shared.prefix}-agent"
    # When each start is sent twice with the same run id and input (the first answer lost)
    for _ in range(2):
        assert await shared.client.start_loop("forecast", OSLO, run_id=loop_id) == loop_id
        assert await shared.client.start_agent("shop-orders", PROMPT, run_id=agent_id, deps_data={"shop": "eu"}) == (
            agent_id
        )
    # Then each is one run that goes to its end, each effect once
    loop = await shared.client.settle(loop_id, timeout_s=60)
    assert loop.status == "done" and loop.output == "answer: sunny in Oslo"
    agent = await shared.client.settle(agent_id, timeout_s=60)
    assert agent.status == "done" and agent.output == EXPECTED
    # When the same starts come once more, after the runs ended
    await shared.client.start_loop("forecast", OSLO, run_id=loop_id)
    await shared.client.start_agent("shop-orders", PROMPT, run_id=agent_id, deps_data={"shop": "eu"})
    # Then their stage messages find the runs moved on and do nothing
    for late in sent[-2:]:
        assert (await ended(shared.celery_app.AsyncResult(late)))["done"] == "skipped"
    assert (await shared.client.status(loop_id)).step == loop.step
    assert (await shared.client.status(agent_id)).step == agent.step
    effects = shared.effects()
    assert (effects[("forecast", loop_id)], effects[("lookup_order", agent_id)], effects[("charge", agent_id)]) == (
        1,
        1,
        1,
    )


async def test_a_loop_or_agent_start_with_another_input_under_a_taken_run_id_is_refused_by_the_client(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_id, agent_id = f"{deployment.prefix}-loop", f"{deployment.prefix}-agent"
    await deployment.client.start_loop("forecast", OSLO, run_id=loop_id)
    await deployment.client.start_agent("shop-orders", PROMPT, run_id=agent_id, deps_data={"shop": "eu"})
    sent = sent_tasks(deployment, monkeypatch)
    # When starts with other input come under the same ids
    with pytest.raises(CheckpointConflict, match="started with another input.*use a new run id"):
        await deployment.client.start_loop("forecast", [Message.user("Bergen")], run_id=loop_id)
    with pytest.raises(CheckpointConflict, match="started with another input.*use a new run id"):
        await deployment.client.start_agent("shop-orders", PROMPT, run_id=agent_id, deps_data={"shop": "us"})
    with pytest.raises(CheckpointConflict, match="is a tool loop named 'forecast'.*use a new run id"):
        await deployment.client.start_agent("orders", PROMPT, run_id=loop_id)
    # Then nothing was sent, and each run is still at its step 0
    assert sent == []
    assert (await deployment.client.status(loop_id)).step == 0
    assert (await deployment.client.status(agent_id)).step == 0
