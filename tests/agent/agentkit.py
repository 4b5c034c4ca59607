"""The crash kit for durable pydantic-ai agents: an order agent whose tools keep a ledger, and a worker entry point.

The agent (`make_agent`) has two tools, ``lookup_order`` (idempotent) and ``charge`` (not), and a
structured output (`Receipt`). Its model is a pydantic-ai `FunctionModel` whose replies depend only
on the history, so a model in a new process picks up where a dead one stopped:

  turn 1: asks ``lookup_order("a1")``; the tool answers with ``ModelRetry`` (ids are upper case)
  turn 2: asks ``lookup_order("A1")`` and ``charge("A1", 90)`` in one response
  turn 3: gives the output ``Receipt(order="A1", charged=90, note=<the lookup's result>)``

Every model request and every tool body writes the ledger (`_kit.tickets.Ledger`) first, so a test
counts what really ran in every process together.

Boundaries (``--crash POINT[:WHAT]``), each a SIGKILL of the worker's own process:
  model:N               inside the Nth model request of this process (after it hit the ledger)
  after_reply:N         just after this process saved its Nth response checkpoint (stage ``model``)
  after_started:TOOL    just after TOOL's ``started`` record is stored (the tool has not run)
  in_tool:TOOL          inside TOOL, after its effect hit the ledger
  before_done:TOOL      after TOOL ran, before its ``done`` record is stored
  after_done:TOOL       just after TOOL's ``done`` record is stored
  after_tools:N         just after this process saved its Nth tool-results checkpoint

Run as ``python agentkit.py --db PATH --ledger PATH --run-id ID --action ACTION`` with tests/ on
``PYTHONPATH`` (`_kit.stores.child_env`); the last line of stdout is a JSON outcome (nothing is
printed when the process was killed). Actions: ``run``, ``recover``, ``recover_rerun`` (every call in
doubt reruns), ``operator`` (recover; where a cut-off charge needs a decision, an operator looks at the
ledger as at the card's statement: `Happened` with the tool's result if it ran, else `Rerun`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any, NoReturn

from _kit.faults import FaultyStore
from _kit.leases import KILLED_LEASE_S, once_lapsed
from _kit.specs import open_spec
from _kit.tickets import Ledger, sigkill
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentflow import Events, Happened, Rerun
from agentflow.exec.checkpoints import RecoveryNeedsDecision, SQLiteCheckpointStore
from agentflow.integrations.pydantic_ai import AgentResult, DurableAgent

KEY = b"agent-crash-kit-key-0123456789abcdef"
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


def make_agent(
    ledger: Ledger,
    run_id: str,
    *,
    die_in_model: int | None = None,
    die_in: str | None = None,
    die: Callable[[str], NoReturn] = sigkill,
) -> Agent[None, Receipt]:
    """The order agent; its model request number `die_in_model` and its tool `die_in` `die` (SIGKILL by default)."""
    requests = Counter[str]()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        requests["n"] += 1
        ledger.record("model", run_id, str(requests["n"]))
        if die_in_model == requests["n"]:
            die("inside a model request")
        return reply(messages, info)

    agent = Agent(FunctionModel(model), output_type=Receipt, name="orders")

    @agent.tool_plain
    def lookup_order(order: str) -> str:
        """Find an order (safe to repeat)."""
        if order != order.upper():
            raise ModelRetry("order ids are upper case")
        ledger.record("lookup_order", run_id)
        if die_in == "lookup_order":
            die("inside lookup_order")
        return lookup_result(order)

    @agent.tool_plain
    async def charge(order: str, amount: int) -> str:
        """Charge the customer's card (not idempotent)."""
        ledger.record("charge", run_id)
        if die_in == "charge":
            die("inside charge")
        return charge_result(order, amount)

    return agent


def durable(agent: Agent[None, Receipt]) -> DurableAgent:
    """The order agent made durable: lookup_order may rerun, charge may not."""
    return DurableAgent(agent, name="orders", idempotent={"lookup_order"}, max_requests=MAX_REQUESTS)


def outcome(result: AgentResult) -> dict[str, Any]:
    output = result.output.model_dump() if isinstance(result.output, Receipt) else result.output
    return {
        "outcome": str(result.status),
        "output": output,
        "model_calls": result.model_calls,
        "replayed": result.replayed,
        "rerun": result.rerun,
        "error": result.error,
    }


def arm(store: FaultyStore, events: Events, point: str, what: str) -> None:
    """Make the process die at a call-log boundary, or right after its Nth checkpoint of a stage."""
    if point in ("after_started", "before_done", "after_done"):
        when, kind = point.split("_")
        store.crash(kind, tool=what, when=when)
    if point in ("after_reply", "after_tools"):
        stage = {"after_reply": "model", "after_tools": "tools"}[point]
        seen = Counter[str]()

        def on_event(event: Any) -> None:
            if event.name == "checkpoint.saved" and event.data.get("stage") == stage:
                seen[stage] += 1
                if seen[stage] == int(what):
                    sigkill("after a checkpoint")

        events.subscribe(on_event)


async def act(opts: argparse.Namespace) -> dict[str, Any]:
    point, _, what = (opts.crash or "").partition(":")
    ledger = Ledger(opts.ledger)
    agent = make_agent(
        ledger,
        opts.run_id,
        die_in_model=int(what) if point == "model" else None,
        die_in=what if point == "in_tool" else None,
    )
    inner = open_spec(opts.store) if opts.store else SQLiteCheckpointStore(opts.db)
    store = FaultyStore(inner, die=sigkill)
    events = Events()
    arm(store, events, point, what)
    runner = durable(agent).runner(store, KEY, events=events, lease_s=KILLED_LEASE_S)
    try:
        if opts.action == "run":
            result = await runner.run(PROMPT, run_id=opts.run_id)
        elif opts.action == "operator" and (ended := await runner.read(opts.run_id)).status in ("done", "failed"):
            result = ended  # the operator looks first: a worker killed after its last save left it ended
        elif opts.action == "operator":
            try:
                result = await once_lapsed(lambda: runner.recover(opts.run_id))
            except RecoveryNeedsDecision as exc:  # charge was cut off: the operator checks the card's ledger
                assert [tool for tool, _ in exc.calls] == ["charge"], exc.calls
                charged = ledger.counts(opts.run_id)["charge"] > 0
                decision = Happened(charge_result("A1", 90)) if charged else Rerun()
                calls = {call_id: decision for call_id in exc.call_ids}
                await runner.decide_in_doubt(opts.run_id, calls=calls, operator="kit")
                result = await once_lapsed(lambda: runner.recover(opts.run_id))
        else:
            rerun = opts.action == "recover_rerun"
            result = await once_lapsed(lambda: runner.recover(opts.run_id, rerun_in_doubt=rerun))
    except RecoveryNeedsDecision as exc:
        return {"outcome": "decision", "calls": exc.calls, "call_ids": exc.call_ids}
    except Exception as exc:
        return {"outcome": "error", "error": type(exc).__name__, "message": str(exc)}
    finally:
        await store.aclose()
    return outcome(result)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--store", default=None, help="a store spec (_kit.specs.open_spec) instead of --db")
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--action", choices=["run", "recover", "recover_rerun", "operator"], required=True)
    parser.add_argument("--crash", default=None)
    opts = parser.parse_args(argv)
    print(json.dumps(asyncio.run(act(opts))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
