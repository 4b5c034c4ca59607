"""`FlowClient` reads and acts on every kind of run alike, through real workers: a flow run, a tool loop, an agent run.

Each kind is parked on its charge in doubt (`Deployment.parked`: its worker SIGKILLed inside
the charge, the next worker parks the run); `settle` then gives the same view for each
(`_kit.parked.check_parked`), `result` says what it waits for, and after a decision each ends
with its own output. Forks of a loop and an agent run go on a worker as a flow run's do.
"""

from __future__ import annotations

import pytest
from _kit.agents import EXPECTED, PROMPT
from _kit.parked import PARKED, check_no_result_yet, check_parked
from celery_kit import Deployment

from agentflow import Happened
from agentflow.models import Message

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.timeout(180)]


@pytest.mark.parametrize("kind", sorted(PARKED))
async def test_a_parked_run_of_any_kind_settles_into_the_same_view_naming_its_call_in_doubt(
    deployment: Deployment, kind: str
) -> None:
    # Given a run of this kind whose worker was killed inside the charge, parked by the next worker
    run_id = await deployment.parked(kind)
    parked = PARKED[kind]
    # When the client settles it, by id alone
    view = await deployment.client.settle(run_id, timeout_s=30)
    # Then the view says what the run is, that it waits for a decision, and on which call (id, tool, args)
    call_id = check_parked(view, parked)
    await check_no_result_yet(deployment.client, run_id, parked)
    # When an operator, having checked the card, says the charge happened
    await deployment.client.decide_in_doubt(run_id, calls={call_id: Happened(parked.charged)}, operator="erin")
    # Then a worker carries the run on to its end, charged once, and its result is what its kind produces
    done = await deployment.client.settle(run_id, timeout_s=60)
    assert done.status == "done" and done.waiting is None, done
    assert parked.output(await deployment.client.result(run_id)) and parked.output(done.output)
    assert deployment.effects()[(parked.tool, run_id)] == 1


async def test_a_tool_loop_forked_through_the_client_goes_on_on_a_worker(shared: Deployment) -> None:
    # Given a finished loop
    run_id = await shared.client.start_loop("forecast", [Message.user("Oslo")])
    source = await shared.client.settle(run_id, timeout_s=30)
    assert source.status == "done"
    # When it is forked at the reply that asks for the forecast (step 1)
    forked = await shared.client.fork(run_id, at_step=1, operator="erin")
    # Then a worker runs the new loop from that reply: the tool once more (under the new id), the same answer
    view = await shared.client.settle(forked, timeout_s=30)
    assert (view.kind, view.name, view.status) == ("loop", "forecast", "done")
    assert view.output == source.output == "answer: sunny in Oslo"
    assert view.messages[:2] == source.messages[:2]
    assert shared.effects()[("forecast", forked)] == 1 and shared.effects()[("forecast", run_id)] == 1


async def test_an_agent_run_forked_through_the_client_goes_on_on_a_worker(shared: Deployment) -> None:
    # Given a finished agent run
    run_id = await shared.client.start_agent("orders", PROMPT)
    assert (await shared.client.settle(run_id, timeout_s=60)).output == EXPECTED
    # When it is forked at the stage whose response asks for the lookup and the charge (step 3)
    forked = await shared.client.fork(run_id, at_step=3, operator="erin")
    # Then a worker runs the tools of that response again (new calls) and the agent ends with the same output
    view = await shared.client.settle(forked, timeout_s=60)
    assert (view.kind, view.status, view.output) == ("agent", "done", EXPECTED)
    assert shared.effects()[("charge", forked)] == 1 and shared.effects()[("charge", run_id)] == 1
