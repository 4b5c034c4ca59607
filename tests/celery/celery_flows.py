"""Flows the test workers run: the ticket flow with a shared ledger and tunable delays."""

from __future__ import annotations

import asyncio
import json
import os
import random

from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, LoopSpec, Registry
from agentflow.exec import current_call, idempotency_key
from agentflow.models import Message, ToolCall

registry = Registry()


def _effect(tool: str) -> str:
    info = current_call()
    with open(os.environ["AGENTFLOW_TEST_LEDGER"], "a") as fh:
        fh.write(json.dumps([tool, info.run_id, idempotency_key()]) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return f"{tool} ok"


async def _pause() -> None:
    low, high = (float(x) for x in os.environ.get("AGENTFLOW_TEST_DELAY", "0,0").split(","))
    await asyncio.sleep(random.uniform(low, high))


@registry.tool(idempotent=True)
async def hold_seats(show: str, seats: int) -> str:
    await _pause()
    return _effect("hold_seats")


@registry.tool
async def charge_card(show: str, seats: int) -> str:
    await _pause()
    out = _effect("charge_card")
    await _pause()
    return out


@registry.tool
async def email_tickets(show: str) -> str:
    await _pause()
    return _effect("email_tickets")


@registry.tool(idempotent=True)
async def slow_report(show: str, seconds: float) -> str:
    await asyncio.sleep(seconds)
    return _effect("slow_report")


class Order(BaseModel):
    show: str
    seats: int = 2
    note: str = ""
    wired: str = ""
    seconds: float = 0.0


def args(order: Order) -> dict[str, object]:
    return {"show": order.show, "seats": order.seats}


tickets = (
    Flow("tickets", state=Order)
    .node("hold", Call("hold_seats", args=args, into="note"))
    .node("pay", Call("charge_card", args=args, into="note"))
    .node("send", Call("email_tickets", args=lambda o: {"show": o.show}, into="note"))
    .edge("hold", "pay")
    .edge("pay", "send")
    .end("send")
)


@registry.tool(approval=True)
async def wire_money(show: str, seats: int) -> str:
    return _effect("wire_money")


# hold fans out to charge_card (runs at once) and wire_money (waits for approval)
fanout = (
    Flow("fanout", state=Order)
    .node("hold", Call("hold_seats", args=args, into="note"))
    .node("pay", Call("charge_card", args=args, into="note"))
    .node("wire", Call("wire_money", args=args, into="wired"))
    .edge("hold", "pay")
    .edge("hold", "wire")
    .end("pay", "wire")
)

slow = (
    Flow("slow", state=Order)
    .node("report", Call("slow_report", args=lambda o: {"show": o.show, "seconds": o.seconds}, into="note"))
    .end("report")
)


class ForecastModel:
    """A stateless model (the same answer in every worker process): ask the tool, then answer."""

    async def complete(self, messages, tools):
        results = [m for m in messages if m.role == "tool"]
        if not results:
            city = messages[-1].content
            return Message.assistant(tool_calls=[ToolCall(id="c1", name="forecast", arguments={"city": city})])
        return Message.assistant(f"answer: {results[-1].content}")


loop_tools = Registry()


@loop_tools.tool
async def forecast(city: str) -> str:
    await _pause()
    _effect("forecast")
    return f"sunny in {city}"


class RefundModel:
    """A stateless model: ask for a refund (which needs approval), then report the tool's answer."""

    async def complete(self, messages, tools):
        results = [m for m in messages if m.role == "tool"]
        if not results:
            return Message.assistant(tool_calls=[ToolCall(id="r1", name="refund", arguments={"amount": 250})])
        return Message.assistant(f"answer: {results[-1].content}")


refund_tools = Registry()


@refund_tools.tool(approval=True)
async def refund(amount: int) -> str:
    _effect("refund")
    return f"refunded {amount}"


app = FlowApp(
    registry,
    [tickets, slow, fanout],
    loops={
        "forecast": LoopSpec(model_factory=ForecastModel, registry=loop_tools),
        "refunds": LoopSpec(model_factory=RefundModel, registry=refund_tools),
    },
)
