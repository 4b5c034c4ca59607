"""The app the test workers run: the kit's ticket flows and tools, with a shared file ledger and tunable delays.

Worker processes import it as ``celery_flows:app`` (tests/celery and tests/ on ``PYTHONPATH``).
Effects go to the file `_kit.tickets.Ledger` named by ``AGENTFLOW_TEST_LEDGER``; the ticket
tools wait a random time in ``AGENTFLOW_TEST_DELAY`` ("low,high" seconds) around their effect.
With ``AGENTFLOW_TEST_SPANS`` (a folder), each pool process exports its spans there with the
OpenTelemetry SDK, one JSON line per span in a file of its own (as docs/observability.md
configures a worker's SDK: in ``worker_process_init``). With ``AGENTFLOW_TEST_STALL_NEXT`` (a
folder), a pool process about to send the ``next`` message of a run whose id ends in
``-stall`` leaves a file named after the run holding its pid, and blocks there, once per run:
the superstep is saved and its lease given up, the next message not sent (a test kills it).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _kit.agents import durable, make_agent
from _kit.parked import ChargeModel
from _kit.tickets import (
    FANOUT,
    SLOW,
    TICKETS,
    Ledger,
    Order,
    Refund,
    amount_args,
    make_tickets,
    show_args,
    was_denied,
    went_out,
)
from celery.signals import worker_process_init
from pydantic import BaseModel

from agentflow import Call, Child, Flow, FlowApp, LoopSpec, Map, Registry, Wait
from agentflow.celery._tasks import AgentflowTasks
from agentflow.celery.follow_ups import FollowUp
from agentflow.exec import current_call, idempotency_key
from agentflow.integrations.pydantic_ai import AgentInput
from agentflow.models import Message, ToolCall

#: Every effect of every worker process, in the file the test names.
ledger = Ledger(env="AGENTFLOW_TEST_LEDGER")


async def _pause() -> None:
    low, high = (float(x) for x in os.environ.get("AGENTFLOW_TEST_DELAY", "0,0").split(","))
    await asyncio.sleep(random.uniform(low, high))


def _effect(tool: str) -> None:
    ledger.record(tool, current_call().run_id, idempotency_key())


tickets = make_tickets(ledger, pause=_pause)


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
    """A stateless model: ask for a refund of 250 (over 100: the kit's refund tool needs approval), then report."""

    async def complete(self, messages, tools):
        results = [m for m in messages if m.role == "tool"]
        if not results:
            return Message.assistant(tool_calls=[ToolCall(id="r1", name="refund", arguments={"amount": 250})])
        return Message.assistant(f"answer: {results[-1].content}")


#: Waits ``order.seconds``, then mails: a run that waits holds nothing, and a sweep wakes it.
COOLED = (
    Flow("cooled", state=Order)
    .node("cool", Wait(seconds=lambda o: o.seconds))
    .node("send", Call("email_tickets", args=show_args, into="sent"))
    .edge("cool", "send")
    .end("send")
)
#: A refund of over 100 waits two seconds for an approval, then the deadline denies it (and apologizes).
DEADLINE = (
    Flow("deadline", state=Refund)
    .node("refund", Call("refund", args=amount_args, into="outcome", on_deny="denied", timeout_s=2.0))
    .node("notify", Call("notify", args=amount_args, into="after"))
    .node("apologize", Call("apologize", args=amount_args, into="after"))
    .edge("refund", "notify", when=went_out)
    .edge("refund", "apologize", when=was_denied)
    .end("notify", "apologize")
)


@tickets.registry.tool
async def publish(item: int) -> str:
    """Publish one item (not idempotent: an element in doubt needs a decision)."""
    await _pause()
    _effect("publish")
    return f"published {item}"


class Items(BaseModel):
    """The elements a map goes over, and what it made of them."""

    items: list[int]
    results: list[str] = []


#: One publish per item, twenty at a time.
MAPPED = (
    Flow("mapped", state=Items)
    .node(
        "publish",
        Map("publish", over=lambda s: s.items, args=lambda i: {"item": i}, into="results", max_concurrency=20),
    )  # fmt: skip
    .end("publish")
)


def _report_args(order: Order) -> dict[str, object]:
    return {"show": order.show, "seconds": order.seconds}


#: The child of FAMILY: a slow report (idempotent), its result into ``held``.
FAMILY_CHILD = Flow("family_child", state=Order).node("report", Call("slow_report", args=_report_args, into="held"))
FAMILY_CHILD.end("report")
#: prepare (a slow report) -> child (FAMILY_CHILD, on the queue) -> send (mail: not idempotent).
FAMILY = (
    Flow("family", state=Order)
    .node("prepare", Call("slow_report", args=_report_args, into="looked"))
    .node(
        "child",
        Child(
            FAMILY_CHILD,
            state=lambda o: {"show": o.show, "seconds": o.seconds},
            result=lambda child: child.held,
            into="paid",
        ),
    )  # fmt: skip
    .node("send", Call("email_tickets", args=show_args, into="sent"))
    .edge("prepare", "child")
    .edge("child", "send")
    .end("send")
)


def shop_of(run: AgentInput) -> str:
    """The deps of the ``shop-orders`` agent: the shop its run was started for (``deps_data={"shop": ...}``)."""
    return str(run.data["shop"])


app = FlowApp(
    tickets.registry,
    [TICKETS, SLOW, FANOUT, COOLED, DEADLINE, MAPPED, FAMILY, FAMILY_CHILD],
    loops={
        "forecast": LoopSpec(model_factory=ForecastModel, registry=loop_tools),
        "refunds": LoopSpec(model_factory=RefundModel, registry=tickets.registry),
        "charges": LoopSpec(model_factory=ChargeModel, registry=tickets.registry),  # charge_card: not idempotent
        "orders": durable(make_agent(ledger, pause=_pause)),  # a durable pydantic-ai agent
        "shop-orders": durable(make_agent(ledger), deps=shop_of),  # the order agent, its deps from deps_data
    },
)


def export_spans(**_: Any) -> None:
    """Have this pool process export its spans to ``$AGENTFLOW_TEST_SPANS/spans-<pid>.jsonl`` (the SDK's exporter)."""
    folder = os.environ.get("AGENTFLOW_TEST_SPANS")
    if not folder:
        return
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    out = (Path(folder) / f"spans-{os.getpid()}.jsonl").open("a")
    exporter = ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
    provider = TracerProvider()
    # Each span is written as it ends: a SIGKILL loses none that ended.
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


worker_process_init.connect(export_spans, weak=False)


def _stalling(send: Callable[[AgentflowTasks, FollowUp], str]) -> Callable[[AgentflowTasks, FollowUp], str]:
    """`send` (`AgentflowTasks.send_follow_up`), blocking once before a ``-stall`` run's next message (see above)."""

    def stalled(self: AgentflowTasks, up: FollowUp) -> str:
        gate = Path(os.environ["AGENTFLOW_TEST_STALL_NEXT"]) / up.run_id
        if up.cause == "next" and up.run_id.endswith("-stall") and not gate.exists():
            gate.write_text(str(os.getpid()))
            while True:  # blocked until the test kills this pool process (SIGKILL: no handler runs)
                signal.pause()
        return send(self, up)

    return stalled


if os.environ.get("AGENTFLOW_TEST_STALL_NEXT"):
    setattr(AgentflowTasks, "send_follow_up", _stalling(AgentflowTasks.send_follow_up))  # noqa: B010
