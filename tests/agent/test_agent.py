"""A pydantic-ai agent made durable (`agentflow.integrations.pydantic_ai`), in one process.

The order agent of agentkit.py: ``lookup_order`` (idempotent, answers a lower-case id with
``ModelRetry``), ``charge`` (not idempotent), a structured `Receipt` output. A worker's death is
`Crash` raised inside a tool (a BaseException: nothing below catches it), and a second runner
with its own owner takes the run over once the dead one's lease lapsed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from _kit.agents import EXPECTED, PROMPT, Receipt, charge_result, durable, make_agent
from _kit.leases import KILLED_LEASE_S, once_lapsed
from _kit.runs_here import runs_here
from _kit.stores import StoreSetup
from _kit.tickets import Crash, Ledger, raise_crash
from agentkit import KEY
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.exceptions import ModelAPIError, UnexpectedModelBehavior
from pydantic_ai.messages import ModelResponse, RetryPromptPart, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from agentflow import DidNotHappen, Events, FlowApp, Happened, Registry, Rerun, RunStatus
from agentflow.errors import CheckpointConflict, CheckpointStoreCorrupt, ModelError, RecoveryNeedsDecision
from agentflow.exec import LoopRunner
from agentflow.exec.run.events import follow_events
from agentflow.exec.seal import Sealer
from agentflow.integrations.pydantic_ai import AgentInput, AgentRunner, DurableAgent


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.jsonl")


def crashing(ledger: Ledger, tool: str) -> Agent[None, Receipt]:
    """The order agent whose `tool` dies (`Crash`) right after its effect hit the ledger."""
    return make_agent(ledger, die_in=tool, die=raise_crash)


def runner_on(store_setup: StoreSetup, agent: Agent[None, Receipt], owner: str, **kw: Any) -> AgentRunner:
    return durable(agent).runner(store_setup.open(), KEY, owner=owner, lease_s=KILLED_LEASE_S, **kw)


async def killed_in(store_setup: StoreSetup, ledger: Ledger, tool: str) -> None:
    """Run the agent until it dies inside `tool`."""
    with pytest.raises(Crash):
        await runner_on(store_setup, crashing(ledger, tool), "dead").run(PROMPT, run_id="order-1")


async def test_a_durable_agent_gives_the_output_the_plain_agent_gives(store_setup: StoreSetup, ledger: Ledger) -> None:
    # Given the order agent, run once by pydantic-ai alone
    plain = await make_agent(ledger).run(PROMPT)
    # When the same agent runs durably
    result = await runner_on(store_setup, make_agent(ledger), "w1").run(PROMPT, run_id="order-1")
    # Then it reaches the same typed output, each tool effect once, three model requests
    assert result.status == RunStatus.DONE and result.output == plain.output == EXPECTED
    assert isinstance(result.output, Receipt)
    assert ledger.counts("order-1") == {"model": 3, "lookup_order": 1, "charge": 1}
    assert result.model_calls == 3 and result.usage.requests == 3
    assert [type(m).__name__ for m in result.messages] == [type(m).__name__ for m in plain.all_messages()]


async def test_each_stage_ends_with_a_checkpoint_and_stores_each_message_once(store_setup: StoreSetup) -> None:
    # Given a finished run
    ledger = Ledger(None)
    runner = runner_on(store_setup, make_agent(ledger), "w1")
    result = await runner.run(PROMPT, run_id="order-1")
    # Then step 0 holds the prompt, each model request and each round of tools one checkpoint more
    rows = await store_setup.history("order-1")
    bodies = [runner.sealer.open_checkpoint(row, "order-1") for row in rows]  # type: ignore[union-attr]
    assert [b["stage"] for b in bodies] == ["start", "model", "tools", "model", "tools", "model", "model"]
    assert bodies[0]["prompt"] == PROMPT and all("prompt" not in b for b in bodies[1:])
    # And a message is stored once, but for the request a model stage resumes from, which pydantic-ai
    # sends re-stamped (stored as left and as sent: one copy more per round of tools)
    stored = sum(len(b["new"]) for b in bodies)
    assert stored == len(result.messages) + 2
    assert (await runner.read("order-1")).messages == result.messages


async def test_a_tool_that_asks_the_model_to_retry_is_replayed_as_a_retry(store_setup: StoreSetup) -> None:
    # Given a run whose first lookup raised ModelRetry, killed inside the charge that came after
    ledger = Ledger(None)
    await killed_in(store_setup, ledger, "charge")
    # When it is recovered and the operator says the charge happened
    runner = runner_on(store_setup, make_agent(ledger), "w2")
    with pytest.raises(RecoveryNeedsDecision) as asked:
        await once_lapsed(lambda: runner.recover("order-1"))
    await runner.decide_in_doubt("order-1", calls={asked.value.call_ids[0]: Happened(charge_result("A1", 90))})
    result = await runner.recover("order-1")
    # Then the retry is part of the history as pydantic-ai made it, and the output is the same
    assert result.output == EXPECTED
    retried = [p for m in result.messages for p in m.parts if isinstance(p, ToolReturnPart) and p.outcome == "retried"]
    assert [p.content for p in retried] == ["order ids are upper case"]


async def test_a_cut_off_charge_parks_the_run_and_never_runs_again_on_its_own(
    store_setup: StoreSetup, ledger: Ledger
) -> None:
    # Given a worker that died inside charge (the card was charged, the result never logged)
    await killed_in(store_setup, ledger, "charge")
    runner = runner_on(store_setup, make_agent(ledger), "w2")
    # When another worker recovers it, twice
    for _ in range(2):
        with pytest.raises(RecoveryNeedsDecision) as asked:
            await once_lapsed(lambda: runner.recover("order-1"))
        # Then it asks about charge alone, and runs nothing
        assert [tool for tool, _ in asked.value.calls] == ["charge"]
    assert ledger.counts("order-1")["charge"] == 1
    # And once told it happened, with its result, the agent goes on to the uninterrupted output
    await runner.decide_in_doubt("order-1", calls={asked.value.call_ids[0]: Happened(charge_result("A1", 90))})
    result = await runner.recover("order-1")
    assert result.status == RunStatus.DONE and result.output == EXPECTED
    assert ledger.counts("order-1")["charge"] == 1


async def test_a_charge_declared_idempotent_since_it_was_cut_off_still_waits_for_a_decision(
    store_setup: StoreSetup, ledger: Ledger
) -> None:
    # Given a worker of v1 (charge not idempotent) that died inside charge: the card was charged
    await killed_in(store_setup, ledger, "charge")
    # When v2, which declares charge idempotent, recovers the run
    v2 = DurableAgent(make_agent(ledger), name="orders", idempotent={"lookup_order", "charge"})
    runner = v2.runner(store_setup.open(), KEY, owner="v2", lease_s=KILLED_LEASE_S)
    with pytest.raises(RecoveryNeedsDecision) as asked:
        await once_lapsed(lambda: runner.recover("order-1"))
    # Then the charge waits for a decision, as its signed record says, and ran once
    [(tool, why)] = asked.value.calls
    assert tool == "charge" and "not idempotent when the call started" in why
    assert ledger.counts("order-1")["charge"] == 1


async def test_a_rerun_decision_runs_the_cut_off_call_once_more(store_setup: StoreSetup, ledger: Ledger) -> None:
    await killed_in(store_setup, ledger, "charge")
    runner = runner_on(store_setup, make_agent(ledger), "w2")
    with pytest.raises(RecoveryNeedsDecision) as asked:
        await once_lapsed(lambda: runner.recover("order-1"))
    await runner.decide_in_doubt("order-1", calls={asked.value.call_ids[0]: Rerun()}, operator="erin")
    result = await runner.recover("order-1")
    assert result.output == EXPECTED and ledger.counts("order-1")["charge"] == 2  # the operator's call
    assert result.rerun == asked.value.call_ids


async def test_did_not_happen_fails_the_run_and_a_retry_runs_the_call(store_setup: StoreSetup, ledger: Ledger) -> None:
    # Given a cut-off charge an operator says did not happen
    await killed_in(store_setup, ledger, "charge")
    runner = runner_on(store_setup, make_agent(ledger), "w2")
    with pytest.raises(RecoveryNeedsDecision) as asked:
        await once_lapsed(lambda: runner.recover("order-1"))
    await runner.decide_in_doubt("order-1", calls={asked.value.call_ids[0]: DidNotHappen("declined at the bank")})
    # When the run goes on, Then pydantic-ai sees the failed call and the run fails, saying why
    failed = await runner.recover("order-1")
    assert failed.status == RunStatus.FAILED and "declined at the bank" in (failed.error or "")
    # And a retry runs the failed stage again: charge runs, and the agent ends as an uninterrupted run
    result = await runner.retry("order-1", operator="erin")
    assert result.status == RunStatus.DONE and result.output == EXPECTED
    assert ledger.counts("order-1")["charge"] == 2


async def test_a_cut_off_idempotent_lookup_reruns_without_asking(store_setup: StoreSetup, ledger: Ledger) -> None:
    await killed_in(store_setup, ledger, "lookup_order")
    runner = runner_on(store_setup, make_agent(ledger), "w2")
    result = await once_lapsed(lambda: runner.recover("order-1"))
    assert result.output == EXPECTED and len(result.rerun) == 1
    assert ledger.counts("order-1") == {"model": 3, "lookup_order": 2, "charge": 1}


async def test_a_tool_declared_for_approval_pauses_the_run_until_a_signed_decision(
    store_setup: StoreSetup, ledger: Ledger
) -> None:
    # Given the agent with charge needing a person's approval
    agent = DurableAgent(make_agent(ledger), name="orders", idempotent={"lookup_order"}, approval={"charge"})
    runner = agent.runner(store_setup.open(), KEY)
    paused = await runner.run(PROMPT, run_id="order-1")
    # Then the run pauses before charge runs
    assert paused.status == RunStatus.PAUSED and [p.tool for p in paused.pending] == ["charge"]
    assert ledger.counts("order-1").get("charge", 0) == 0
    # When it is approved, Then charge runs once and the agent ends as usual
    result = await runner.resume("order-1", approve=True, operator="erin")
    assert result.output == EXPECTED and ledger.counts("order-1")["charge"] == 1
    # And the approval was single-use: resuming again is refused
    with pytest.raises(CheckpointConflict):
        await runner.resume("order-1", approve=True)


async def test_a_denied_call_is_told_to_the_model(store_setup: StoreSetup, ledger: Ledger) -> None:
    agent = DurableAgent(make_agent(ledger), name="orders", idempotent={"lookup_order"}, approval={"charge"})
    runner = agent.runner(store_setup.open(), KEY)
    await runner.run(PROMPT, run_id="order-1")
    result = await runner.resume("order-1", approve=False, note="over the limit")
    assert result.status == RunStatus.DONE and ledger.counts("order-1").get("charge", 0) == 0
    told = [
        p.content for m in result.messages for p in m.parts if isinstance(p, ToolReturnPart) and p.tool_name == "charge"
    ]
    assert len(told) == 1 and "denied" in str(told[0]) and "over the limit" in str(told[0])


async def test_a_cancelled_agent_run_is_never_recovered(store_setup: StoreSetup, ledger: Ledger) -> None:
    await killed_in(store_setup, ledger, "charge")
    runner = runner_on(store_setup, make_agent(ledger), "w2")
    cancelled = await once_lapsed(lambda: runner.cancel("order-1", reason="customer withdrew", operator="erin"))
    assert cancelled.status == RunStatus.CANCELLED
    with pytest.raises(CheckpointConflict):
        await runner.recover("order-1")
    assert ledger.counts("order-1")["charge"] == 1


async def test_max_requests_counts_requests_cut_off_by_crashes(store_setup: StoreSetup) -> None:
    # Given an agent whose every model request dies, with a budget of two requests
    def dies(messages: list[Any], info: AgentInfo) -> ModelResponse:
        raise Crash("the worker died inside the model request")

    agent = DurableAgent(Agent(FunctionModel(dies)), name="stuck", max_requests=2)
    first = agent.runner(store_setup.open(), KEY, owner="w1", lease_s=KILLED_LEASE_S)
    with pytest.raises(Crash):
        await first.run("hello", run_id="stuck-1")
    second = agent.runner(store_setup.open(), KEY, owner="w2", lease_s=KILLED_LEASE_S)
    with pytest.raises(Crash):
        await once_lapsed(lambda: second.recover("stuck-1"))
    # When a third worker recovers it, Then the run fails without asking the model a third time
    third = agent.runner(store_setup.open(), KEY, owner="w3", lease_s=KILLED_LEASE_S)
    failed = await once_lapsed(lambda: third.recover("stuck-1"))
    assert failed.status == RunStatus.FAILED and "max_requests (2)" in (failed.error or "")
    assert failed.model_calls == 2


async def test_deps_are_rebuilt_on_each_worker_from_the_run_and_its_data(store_setup: StoreSetup) -> None:
    # Given an agent whose deps a factory makes from the run id and the JSON it started with
    made: list[AgentInput] = []

    def reply(messages: list[Any], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart("hello")])

    def deps(run: AgentInput) -> dict[str, Any]:
        made.append(run)
        return dict(run.data)

    agent = DurableAgent(Agent(FunctionModel(reply), deps_type=dict), name="greeter", deps=deps)
    runner = agent.runner(store_setup.open(), KEY)
    # When the run goes in one process, Then its stages share one pydantic-ai run, so the deps are made once
    result = await runner.run("hi", run_id="g-1", deps_data={"user": "u-7"})
    assert result.output == "hello" and [(d.run_id, d.data) for d in made] == [("g-1", {"user": "u-7"})]
    # And when each stage goes on a worker of its own (a superstep each), each worker makes them again,
    # from the run id and the data signed into step 0
    made.clear()
    await runner.start("hi", run_id="g-2", deps_data={"user": "u-8"})
    for step in (0, 1):
        await runner.advance("g-2", expected_step=step, handoff=True)
    assert (await runner.read("g-2")).output == "hello"
    assert [(d.run_id, d.data) for d in made] == [("g-2", {"user": "u-8"})] * 2


async def test_an_app_acts_on_agent_runs_as_on_any_run(store_setup: StoreSetup, ledger: Ledger) -> None:
    # Given an app with the agent registered beside flows, and a run cut off inside charge
    await killed_in(store_setup, ledger, "charge")
    app = FlowApp(Registry(), [], loops={"orders": durable(make_agent(ledger))})
    operator = runs_here(app, store_setup.open(), [KEY], name="operator-test")
    # When the operator decides and recovers it by id alone
    ops = await operator.open("order-1")
    assert isinstance(ops, AgentRunner) and ops.refuses("migrate") and not ops.refuses("retry")
    with pytest.raises(RecoveryNeedsDecision) as asked:
        await once_lapsed(lambda: operator.recover("order-1", operator="erin"))
    await operator.decide_in_doubt(
        "order-1", calls={asked.value.call_ids[0]: Happened(charge_result("A1", 90))}, operator="erin"
    )
    await operator.recover("order-1", operator="erin")
    acted = await operator.loop("orders").read("order-1")
    # Then it ends as an uninterrupted run, charge once
    assert acted.status == "done" and ledger.counts("order-1")["charge"] == 1


async def test_checkpoint_events_name_the_agent_and_its_stage(store_setup: StoreSetup, ledger: Ledger) -> None:
    events = Events()
    seen: list[tuple[Any, Any]] = []
    events.subscribe(
        lambda e: seen.append((e.data.get("loop"), e.data.get("stage"))) if e.name == "checkpoint.saved" else None
    )
    runner = runner_on(store_setup, make_agent(ledger), "w1", events=events)
    await runner.run(PROMPT, run_id="order-1")
    assert seen[0] == ("orders", "start") and ("orders", "tools") in seen and seen[-1] == ("orders", "model")


async def test_a_changed_checkpoint_is_refused_before_its_messages_are_read(
    store_setup: StoreSetup, ledger: Ledger
) -> None:
    runner = runner_on(store_setup, make_agent(ledger), "w1")
    await runner.run(PROMPT, run_id="order-1")
    rows = await store_setup.history("order-1")
    await store_setup.rows.put_checkpoint(rows[1], dataclasses.replace(rows[1], payload=rows[2].payload))
    with pytest.raises(CheckpointStoreCorrupt):
        await runner.read("order-1")


async def test_a_plain_tool_loop_of_the_same_name_refuses_an_agent_run(store_setup: StoreSetup, ledger: Ledger) -> None:
    await runner_on(store_setup, make_agent(ledger), "w1").run(PROMPT, run_id="order-1")
    loop = LoopRunner(None, Registry(), checkpoints=store_setup.open(), checkpoint_key=KEY, name="orders")
    refused = "is a run of pydantic-ai agent 'orders', not a tool loop named 'orders': act on it through its agent"
    with pytest.raises(CheckpointConflict, match=refused):
        await loop.read("order-1")


def test_bad_arguments_say_what_to_fix(ledger: Ledger) -> None:
    agent = make_agent(ledger)
    with pytest.raises(ValueError, match="needs a name"):
        DurableAgent(Agent(FunctionModel(lambda m, i: ModelResponse(parts=[TextPart("x")]))))
    with pytest.raises(ValueError, match=r"has no tool \['refund'\] \(its tools: \['charge', 'lookup_order'\]\)"):
        DurableAgent(agent, idempotent={"refund"})
    with pytest.raises(ValueError, match="max_requests must be at least 1"):
        DurableAgent(agent, max_requests=0)


async def test_a_run_needs_a_prompt_and_json_deps_data(ledger: Ledger) -> None:
    runner = durable(make_agent(ledger)).runner()
    with pytest.raises(ValueError, match="starts from a prompt"):
        await runner.run("")
    with pytest.raises(ValueError, match="deps_data"):
        await runner.run("hi", deps_data={"when": object()})


async def test_without_a_store_the_agent_runs_as_pydantic_ai_alone_would(ledger: Ledger) -> None:
    result = await durable(make_agent(ledger)).runner().run(PROMPT, run_id="order-1")
    assert result.output == EXPECTED and result.step is None


async def test_a_streaming_agent_reports_the_models_text_in_the_runs_stored_events(store_setup: StoreSetup) -> None:
    # Given an agent built with stream=True, whose model streams its answer in three pieces
    async def pieces(messages: list[Any], info: AgentInfo) -> AsyncIterator[str]:
        for piece in ("Your order ", "A1 ", "is on its way."):
            yield piece

    def whole(messages: list[Any], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart("Your order A1 is on its way.")])

    agent = DurableAgent(Agent(FunctionModel(whole, stream_function=pieces)), name="tracker", stream=True)
    store = store_setup.open()
    # When it runs on a hub that records its events
    result = await agent.runner(store, KEY, events=Events(record=True)).run("where is A1?", run_id="t-1")
    # Then a follower of the run's stored events gets the text as it came, then the run's end
    followed = [event async for event in follow_events(store, Sealer(KEY), "t-1")]
    texts = [event.data["text"] for event in followed if event.name == "model.text"]
    assert result.output == "Your order A1 is on its way." and "".join(texts) == result.output
    assert len(texts) == 3 and followed[-1].name == "run.finished"


async def test_a_tool_pydantic_ai_would_defer_for_approval_pauses_the_run_for_a_signed_decision(
    store_setup: StoreSetup,
) -> None:
    # Given a plain pydantic-ai agent whose refund tool requires approval (pydantic-ai's deferred tools)
    refunds: list[str] = []

    def reply(messages: list[Any], info: AgentInfo) -> ModelResponse:
        if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[TextPart("Refunded A1.")])
        return ModelResponse(parts=[ToolCallPart("refund", {"order": "A1"})])

    agent = Agent(FunctionModel(reply), name="refunds")

    @agent.tool_plain(requires_approval=True)
    def refund(order: str) -> str:
        refunds.append(order)
        return f"refunded {order}"

    runner = DurableAgent(agent).runner(store_setup.open(), KEY)
    # When it runs durably, Then it pauses before the refund, which has not run
    paused = await runner.run("refund A1", run_id="r-1")
    assert paused.status == RunStatus.PAUSED and [p.tool for p in paused.pending] == ["refund"] and refunds == []
    # And once a person approves (a signed, single-use decision), the refund runs once and the agent answers
    done = await runner.resume("r-1", approve=True, operator="erin")
    assert done.status == RunStatus.DONE and done.output == "Refunded A1." and refunds == ["A1"]


async def test_pydantic_ais_usage_limits_hold_over_the_whole_run(store_setup: StoreSetup, ledger: Ledger) -> None:
    # Given the order agent (three requests) limited by pydantic-ai to two
    agent = DurableAgent(make_agent(ledger), name="orders", usage_limits=UsageLimits(request_limit=2))
    result = await agent.runner(store_setup.open(), KEY).run(PROMPT, run_id="order-1")
    # Then the third request is refused, although each stage is a pydantic-ai run of its own
    assert result.status == RunStatus.FAILED and "UsageLimitExceeded" in (result.error or "")
    assert ledger.counts("order-1")["model"] == 2


async def test_a_failing_model_provider_leaves_the_run_to_a_recovery_that_asks_again(store_setup: StoreSetup) -> None:
    # Given a provider that fails the first request, then answers
    answers: list[str] = []

    def flaky(messages: list[Any], info: AgentInfo) -> ModelResponse:
        answers.append("asked")
        if len(answers) == 1:
            raise ModelAPIError("stand-in", "503 Service Unavailable")
        return ModelResponse(parts=[TextPart("hello")])

    agent = DurableAgent(Agent(FunctionModel(flaky)), name="greeter")
    runner = agent.runner(store_setup.open(), KEY, lease_s=KILLED_LEASE_S)
    # When the run meets the failure, Then it is not the agent's: the run stays running, the request counted
    with pytest.raises(ModelError, match="503"):
        await runner.run("hi", run_id="g-1")
    assert (await runner.read("g-1")).status == RunStatus.RUNNING
    # And a recovery asks again and ends
    result = await once_lapsed(lambda: runner.recover("g-1"))
    assert result.status == RunStatus.DONE and result.output == "hello" and result.model_calls == 2


def _always_retries(tries: list[int], crash_on: int | None = None) -> Agent[None, str]:
    """An agent whose model asks for ``flaky`` until told otherwise, and whose ``flaky`` always says retry."""

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart("flaky", {"x": len(messages)})])

    agent = Agent(FunctionModel(model), retries=2)

    @agent.tool_plain
    def flaky(x: int) -> str:
        tries.append(x)
        if crash_on is not None and len(tries) == crash_on:
            raise Crash("killed after the tool's attempt")
        raise ModelRetry("not yet")

    return agent


async def test_a_tools_retry_limit_holds_over_the_stages_and_a_crash_as_in_pydantic_ai(store_setup: StoreSetup) -> None:
    # Given a tool that always asks the model to retry, allowed 2 retries: pydantic-ai alone tries it 3 times, fails
    plain: list[int] = []
    with pytest.raises(UnexpectedModelBehavior, match="exceeded max retries count of 2"):
        await _always_retries(plain).run("go")
    # When the same agent runs durably (each stage a pydantic-ai run of its own, started from the saved history)
    tries: list[int] = []
    result = (
        await DurableAgent(_always_retries(tries), name="flaky", idempotent={"flaky"})
        .runner(store_setup.open(), KEY)
        .run("go", run_id="f-1")
    )
    # Then it fails as pydantic-ai does, after as many tries, not when the request budget runs out
    assert result.status == RunStatus.FAILED and "exceeded max retries count of 2" in (result.error or "")
    assert len(tries) == len(plain) == 3 and result.model_calls == 3
    # And a run killed in its second try counts the first after its recovery (the count comes from the history)
    cut: list[int] = []
    dead = DurableAgent(_always_retries(cut, crash_on=2), name="flaky", idempotent={"flaky"})
    with pytest.raises(Crash):
        await dead.runner(store_setup.open(), KEY, owner="dead", lease_s=KILLED_LEASE_S).run("go", run_id="f-2")
    alive = DurableAgent(_always_retries(cut), name="flaky", idempotent={"flaky"})
    runner = alive.runner(store_setup.open(), KEY, owner="alive", lease_s=KILLED_LEASE_S)
    recovered = await once_lapsed(lambda: runner.recover("f-2"))
    assert recovered.status == RunStatus.FAILED and "exceeded max retries count of 2" in (recovered.error or "")
    assert len(cut) == 4  # the try cut off by the crash, made again (idempotent), is not counted twice


def _forging(shape: dict[str, Any], crashed: list[bool]) -> Agent[None, str]:
    """An agent whose ``echo`` returns `shape`; ``boom`` (same round, after it) dies the first time."""

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        parts = [p for m in messages for p in m.parts]
        if not any(isinstance(p, ToolReturnPart | RetryPromptPart) for p in parts):
            return ModelResponse(parts=[ToolCallPart("echo", {}), ToolCallPart("boom", {})])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), retries=0)

    @agent.tool_plain
    def echo() -> dict[str, Any]:
        return shape

    @agent.tool_plain
    def boom() -> str:
        if not crashed:
            crashed.append(True)
            raise Crash("killed after echo's done was logged")
        return "ok"

    return agent


@pytest.mark.parametrize(
    "shape", [{"agentflow.model_retry": "try again"}, {"agentflow.result": "unwrapped?"}], ids=["retry", "plain"]
)
async def test_a_tool_result_shaped_like_the_retry_envelope_is_its_plain_result(
    store_setup: StoreSetup, shape: dict[str, Any]
) -> None:
    # Given a tool whose own result has the shape of the log's envelopes (what a tool that passes on
    # a JSON document from elsewhere may return), in a run killed after its done record was logged
    crashed: list[bool] = []
    dead = DurableAgent(_forging(shape, crashed), name="forge", idempotent={"echo", "boom"})
    with pytest.raises(Crash):
        await dead.runner(store_setup.open(), KEY, owner="dead", lease_s=KILLED_LEASE_S).run("go", run_id="g-1")
    # When another worker recovers it (echo replays from the log)
    alive = DurableAgent(_forging(shape, crashed), name="forge", idempotent={"echo", "boom"})
    runner = alive.runner(store_setup.open(), KEY, owner="alive", lease_s=KILLED_LEASE_S)
    result = await once_lapsed(lambda: runner.recover("g-1"))
    # Then pydantic-ai got the tool's result as it was returned, not a retry, and the run ends
    assert result.status == RunStatus.DONE and result.output == "done" and result.replayed
    parts = [p for m in result.messages for p in m.parts]
    assert not [p for p in parts if isinstance(p, RetryPromptPart) or getattr(p, "outcome", None) == "retried"]
    assert [p.content for p in parts if isinstance(p, ToolReturnPart) and p.tool_name == "echo"] == [shape]
