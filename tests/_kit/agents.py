"""The order agent every durable-agent test uses: a pydantic-ai agent whose effects keep a ledger.

The agent (`make_agent`) has two tools, ``lookup_order`` (idempotent) and ``charge`` (not), and a
structured output (`Receipt`). Its model is a pydantic-ai `FunctionModel` whose replies depend only
on the history, so a model in a new process picks up where a dead one stopped:

  turn 1: asks ``lookup_order("a1")``; the tool answers with ``ModelRetry`` (ids are upper case)
  turn 2: asks ``lookup_order("A1")`` and ``charge("A1", 90)`` in one response
  turn 3: gives the output ``Receipt(order="A1", charged=90, note=<the lookup's result>)``

Every model request and every tool body writes the ledger (`_kit.tickets.Ledger`) first, under the
run's id (a tool reads it from `agentflow.exec.current_call`, the model from the conversation id
agentflow gives pydantic-ai), so a test counts what really ran in every process together.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from _kit.tickets import Ledger, sigkill
from agentflow.exec import current_call
from agentflow.integrations.pydantic_ai import AgentInput, DurableAgent

PROMPT = "Charge order A1 90 EUR."
TOOLS = ("lookup_order", "charge")
NON_IDEMPOTENT = frozenset({"charge"})
#: Model requests an uninterrupted run makes.
REQUESTS = 3
#: The most model requests a run may make over every process.
MAX_REQUESTS = 6


class Receipt(BaseModel):
    """The agent's output."""

    order: str
    charged: int
    note: str


#: What every run reaches, interrupted or not.
EXPECTED = Receipt(order="A1", charged=90, note="A1: 90 EUR, card on file")


def lookup_result(order: str) -> str:
    """What lookup_order returns (an operator supplying a result uses it too)."""
    return f"{order}: 90 EUR, card on file"


def charge_result(order: str, amount: int) -> str:
    """What charge returns."""
    return f"charged {amount} EUR for {order}"


def _returns(messages: list[ModelMessage]) -> dict[str, Any]:
    return {
        part.tool_name: part.content
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart) and part.outcome != "retried"
    }


def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The model's next response, from the history alone (the same on every worker)."""
    turn = sum(1 for m in messages if isinstance(m, ModelResponse)) + 1
    retried = any(
        isinstance(p, ToolReturnPart) and p.outcome == "retried"  # pydantic-ai's answer to a ModelRetry
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
    )
    if turn == 1:
        return ModelResponse(parts=[ToolCallPart("lookup_order", {"order": "a1"}, tool_call_id="call-1")])
    if turn == 2 and retried:
        return ModelResponse(
            parts=[
                ToolCallPart("lookup_order", {"order": "A1"}, tool_call_id="call-2"),
                ToolCallPart("charge", {"order": "A1", "amount": 90}, tool_call_id="call-3"),
            ]
        )
    returns = _returns(messages)
    output = {"order": "A1", "charged": 90, "note": returns.get("lookup_order", "?")}
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, output, tool_call_id="call-out")])


def _run_id() -> str:
    """The run the tool is called for (``plain`` when pydantic-ai runs the agent alone)."""
    try:
        return current_call().run_id
    except RuntimeError:
        return "plain"


def make_agent(
    ledger: Ledger,
    *,
    die_in_model: int | None = None,
    die_in: str | None = None,
    die: Callable[[str], NoReturn] = sigkill,
    pause: Callable[[], Awaitable[None]] | None = None,
) -> Agent[None, Receipt]:
    """The order agent; its model request number `die_in_model` and its tool `die_in` `die` (SIGKILL by default)."""
    requests = Counter[str]()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        requests["n"] += 1
        ledger.record("model", messages[0].conversation_id or "?", str(requests["n"]))
        if die_in_model == requests["n"]:
            die("inside a model request")
        return reply(messages, info)

    agent = Agent(FunctionModel(model), output_type=Receipt, name="orders")

    @agent.tool_plain
    def lookup_order(order: str) -> str:
        """Find an order (safe to repeat)."""
        if order != order.upper():
            raise ModelRetry("order ids are upper case")
        ledger.record("lookup_order", _run_id())
        if die_in == "lookup_order":
            die("inside lookup_order")
        return lookup_result(order)

    @agent.tool_plain
    async def charge(order: str, amount: int) -> str:
        """Charge the customer's card (not idempotent)."""
        ledger.record("charge", _run_id())
        if die_in == "charge":
            die("inside charge")
        if pause is not None:  # a worker test's window to kill the process inside the charge
            await pause()
        return charge_result(order, amount)

    return agent


def durable(agent: Agent[None, Receipt], deps: Callable[[AgentInput], Any] | None = None) -> DurableAgent:
    """The order agent made durable: lookup_order may rerun, charge may not (with `deps`, a deps factory)."""
    return DurableAgent(agent, name="orders", idempotent={"lookup_order"}, max_requests=MAX_REQUESTS, deps=deps)
