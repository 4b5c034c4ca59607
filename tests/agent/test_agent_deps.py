"""A durable agent's deps: each mistake with the factory is caught as early as it can be seen, with what to pass.

The rules of `agentflow.integrations.pydantic_ai._deps`: at construction (no factory for an
agent that declares a deps type; the deps themselves given instead of a factory; a factory
that cannot take the run), at a run's start (``deps_data`` nobody would read), and when a stage
builds them (a factory that raises, or returns the wrong type): the run fails with a message
that names the factory and what it was given, never a bare error from inside a tool.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _kit.agents import PROMPT, durable, make_agent
from _kit.tickets import Ledger
from agentkit import KEY
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentflow import RunStatus
from agentflow.errors import CheckpointNotFound
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.integrations.pydantic_ai import AgentInput, DurableAgent


@dataclass
class Shop:
    """The deps the shop agent's tools read."""

    name: str


def _greets(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart("hello")])


def shop_agent() -> Agent[Shop, str]:
    agent = Agent(FunctionModel(_greets), deps_type=Shop, name="shop")

    @agent.instructions
    def where(ctx: RunContext[Shop]) -> str:
        return f"You work for {ctx.deps.name}."

    return agent


def test_an_agent_that_declares_deps_needs_a_factory() -> None:
    with pytest.raises(ValueError, match=r"takes deps of type Shop and no deps factory was given.*deps=lambda run"):
        DurableAgent(shop_agent())


def test_the_deps_themselves_are_refused_with_the_factory_to_give_instead() -> None:
    with pytest.raises(TypeError, match=r"must be a factory, not the deps themselves \(got Shop\).*deps=lambda run"):
        DurableAgent(shop_agent(), deps=Shop("eu"))  # type: ignore[arg-type]  # the mistake under test


def test_a_factory_that_cannot_take_the_run_is_refused() -> None:
    with pytest.raises(TypeError, match=r"must take one argument, an AgentInput \(run_id, data\)"):
        DurableAgent(shop_agent(), deps=lambda: Shop("eu"))  # type: ignore[arg-type,misc]  # the mistake under test


async def test_deps_data_for_an_agent_without_a_factory_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    store = MemoryCheckpointStore()
    runner = durable(make_agent(Ledger(tmp_path / "ledger.jsonl"))).runner(store, KEY)
    with pytest.raises(ValueError, match=r"has no deps factory, so deps_data \['shop'\] would never be read"):
        await runner.start(PROMPT, run_id="order-1", deps_data={"shop": "eu"})
    with pytest.raises(CheckpointNotFound):
        await runner.read("order-1")


async def test_a_factory_that_raises_fails_the_run_naming_the_factory_and_the_data_it_got() -> None:
    # Given a factory that reads a key the run was not started with
    agent = DurableAgent(shop_agent(), deps=lambda run: Shop(run.data["shop"]))
    runner = agent.runner(MemoryCheckpointStore(), KEY)
    # When the run goes
    result = await runner.run("hi", run_id="s-1", deps_data={"region": "eu"})
    # Then it fails with what went wrong and what to do, not a bare KeyError
    assert result.status == RunStatus.FAILED
    error = result.error or ""
    assert "the deps factory of agent 'shop' raised KeyError: 'shop'" in error
    assert "deps_data keys ['region']" in error and "start a new run with it" in error


async def test_a_factory_that_returns_another_type_fails_the_run_saying_what_the_agent_takes() -> None:
    agent = DurableAgent(shop_agent(), deps=lambda run: run.data["shop"])
    result = await agent.runner(MemoryCheckpointStore(), KEY).run("hi", run_id="s-2", deps_data={"shop": "eu"})
    assert result.status == RunStatus.FAILED
    assert "returned str, and the agent takes Shop" in (result.error or "")


async def test_a_good_factory_gives_the_tools_the_deps_it_built() -> None:
    seen: list[Any] = []

    def build(run: AgentInput) -> Shop:
        seen.append(dict(run.data))
        return Shop(run.data["shop"])

    result = (
        await DurableAgent(shop_agent(), deps=build)
        .runner(MemoryCheckpointStore(), KEY)
        .run("hi", run_id="s-3", deps_data={"shop": "eu"})
    )
    assert result.status == RunStatus.DONE and result.output == "hello" and seen == [{"shop": "eu"}]
