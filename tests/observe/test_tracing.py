"""`Tracing`: the spans of in-process runs, exported with the SDK's in-memory exporter.

One trace per run (a start span, a span per superstep, a child span per tool call and per
model call), outcomes as attributes, a recovery by another runner continuing the trace,
nothing a run was given in any attribute unless a tool opted in, and tracing off.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from _kit.tickets import TICKETS, Crash, make_tickets
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from pydantic import BaseModel

from agentflow import Call, Events, Executor, Flow, FlowRunner, Registry, RunContext
from agentflow.errors import RecoveryNeedsDecision
from agentflow.exec import run_tool_loop
from agentflow.exec.checkpoints import MemoryCheckpointStore, SQLiteCheckpointStore
from agentflow.exec.checkpoints.conformance import validate
from agentflow.exec.checkpoints.forwarding import ForwardingStore
from agentflow.exec.checkpoints.protocol import EventStore, RetentionStore
from agentflow.exec.tracing import NO_TRACING
from agentflow.models import Message, ScriptedModel, ToolCall
from agentflow.models.usage import note_usage
from agentflow.observe import Tracing
from agentflow.observe._trace_context import derived_context, traceparent


def traced(store: Any) -> ForwardingStore:
    """`store`, its operations noted as events of the current span."""
    return ForwardingStore(store, [Tracing().store_hook])


class Process:
    """One "process": a tracer provider of its own exporting to memory, and a runner on the shared store."""

    def __init__(self, registry: Registry, store: Any, key: bytes | None = None) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracing = Tracing(self.provider)
        self.runner = FlowRunner(Executor(registry, tracer=self.tracing), checkpoints=store, checkpoint_key=key)

    def spans(self, name: str = "") -> list[ReadableSpan]:
        """The spans that ended, in order (those whose name starts with `name`)."""
        return [s for s in self.exporter.get_finished_spans() if s.name.startswith(name)]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def outcomes(process: Process) -> dict[str, Any]:
    return {attrs(s)["agentflow.tool"]: attrs(s).get("agentflow.outcome") for s in process.spans("agentflow.tool")}


class Out(BaseModel):
    a: str = ""
    b: str = ""


def two_calls(registry: Registry, second: str = "second") -> Flow[Out]:
    """One node that calls `first`, then `second`: one superstep with two calls."""

    async def both(state: Out, handle: Any) -> dict[str, str]:
        return {"a": await handle.call("first", x=1), "b": await handle.call(second, x=2)}

    return Flow("two", state=Out).node("both", both).end("both")


def crashing_tools(idempotent: bool) -> tuple[Registry, list[str]]:
    """`first` (fine) and `second`, which dies the first time right after its effect."""
    registry = Registry()
    ran: list[str] = []

    @registry.tool
    async def first(x: int) -> str:
        ran.append("first")
        return "one"

    @registry.tool(idempotent=idempotent)
    async def second(x: int) -> str:
        ran.append("second")
        if ran.count("second") == 1:
            raise Crash("the worker died inside second")
        return "two"

    return registry, ran


async def crashed(run_id: str, *, idempotent: bool) -> tuple[Process, Process, Flow[Out], list[str]]:
    """Two "processes" over one store, and a run of `two_calls` that died in the first inside `second`."""
    registry, ran = crashing_tools(idempotent=idempotent)
    store = MemoryCheckpointStore()
    one, two = Process(registry, store), Process(registry, store)
    flow = two_calls(registry)
    with pytest.raises(Crash):
        await one.runner.run(flow, {}, run_id=run_id)
    return one, two, flow, ran


async def test_a_run_is_one_trace_a_start_span_and_a_span_per_superstep_with_a_child_per_call():
    # Given a traced runner on a store (its operations traced too)
    tickets = make_tickets()
    p = Process(tickets.registry, traced(MemoryCheckpointStore()))
    # When a ticket run goes from start to done
    result = await p.runner.run(TICKETS, {"show": "Hamlet"}, run_id="t-1")
    assert result.status == "done"
    # Then its spans form one trace: the start, then three supersteps under it, each with its call
    (start,) = p.spans("agentflow.start")
    steps = p.spans("agentflow.superstep")
    calls = p.spans("agentflow.tool")
    assert start.name == "agentflow.start tickets" and start.parent is None
    assert len({s.context.trace_id for s in p.spans()}) == 1
    assert [s.parent.span_id for s in steps] == [start.context.span_id] * 3
    assert [attrs(s)["agentflow.cause"] for s in steps] == ["start", "next", "next"]
    assert [(attrs(s)["agentflow.step"], attrs(s)["agentflow.saved_step"]) for s in steps] == [(0, 1), (1, 2), (2, 3)]
    assert [attrs(s)["agentflow.segment"] for s in steps] == [0, 0, 0]
    assert [attrs(s)["agentflow.status"] for s in steps] == ["running", "running", "done"]
    assert {attrs(s)["agentflow.run_id"] for s in steps} == {"t-1"} and attrs(steps[0])["agentflow.flow"] == "tickets"
    assert [c.parent.span_id for c in calls] == [s.context.span_id for s in steps]
    assert [
        (attrs(c)["agentflow.tool"], attrs(c)["agentflow.outcome"], attrs(c)["agentflow.attempts"]) for c in calls
    ] == [
        ("hold_seats", "ran", 1),
        ("charge_card", "ran", 1),
        ("email_tickets", "ran", 1),
    ]
    assert attrs(calls[0])["agentflow.idempotent"] is True and attrs(calls[1])["agentflow.idempotent"] is False
    # and the store's operations are events with their latency: the lease and step 0 on the start span,
    # each call's started record on its span, each superstep's checkpoint on its span
    assert [e.name for e in start.events] == ["store.take_lease", "store.save"]
    assert start.events[0].attributes["agentflow.store.ms"] >= 0
    assert "store.record_call" in [e.name for e in calls[0].events]
    assert "store.save_after_calls" in [e.name for e in steps[0].events]


async def test_a_run_started_in_a_callers_span_joins_its_trace_and_every_checkpoint_carries_the_context():
    # Given a traced runner, and a caller's span (a web request, say) in the same tracer provider
    tickets = make_tickets()
    store = MemoryCheckpointStore()
    p = Process(tickets.registry, store)
    with p.provider.get_tracer("web").start_as_current_span("POST /orders") as request:
        # When the run starts inside it
        await p.runner.run(TICKETS, {"show": "Hamlet"}, run_id="t-2")
    # Then the start span is the request's child, and every superstep is in the request's trace
    (start,) = p.spans("agentflow.start")
    assert start.parent.span_id == request.get_span_context().span_id
    assert {s.context.trace_id for s in p.spans("agentflow")} == {request.get_span_context().trace_id}
    # and every checkpoint carries the start span's context, signed with the rest of the body
    sealer = p.runner.sealer
    assert sealer is not None
    bodies = [sealer.open_checkpoint(row, "t-2") for row in await store.history("t-2")]
    assert {b["trace"] for b in bodies} == {traceparent(start.context)}


async def test_a_recovery_by_another_runner_continues_the_trace_and_links_the_cut_off_superstep():
    # Given two "processes" over one store, and a run whose superstep died in the first, inside
    # its second call (idempotent), after its first call had finished
    one, two, flow, ran = await crashed("r-1", idempotent=True)
    (cut_off,) = one.spans("agentflow.superstep")
    assert attrs(cut_off)["error.type"] == "Crash"
    # When the second recovers it
    result = await two.runner.recover(flow, "r-1")
    assert result.status == "done" and ran == ["first", "second", "second"]
    # Then its superstep continues the first one's trace, under the run's start span, marked recovered,
    # linked to the cut-off superstep's span
    (start,) = one.spans("agentflow.start")
    (step,) = two.spans("agentflow.superstep")
    assert step.context.trace_id == start.context.trace_id and step.parent.span_id == start.context.span_id
    assert attrs(step)["agentflow.cause"] == "recovery" and attrs(step)["agentflow.recovered"] is True
    assert [(link.context.span_id, dict(link.attributes)) for link in step.links] == [
        (cut_off.context.span_id, {"agentflow.link": "cut_off"})
    ]
    (event,) = [e for e in step.events if e.name == "agentflow.recovered"]
    assert dict(event.attributes) == {"agentflow.replayed": 1, "agentflow.rerun": 1}
    # and its calls say what became of them: the finished one replayed, the one in doubt ran again
    assert outcomes(two) == {"first": "replayed", "second": "rerun"}


async def test_calls_in_doubt_that_may_not_rerun_show_as_spans_in_doubt():
    # Given a run whose worker died inside a call that is not idempotent
    one, two, flow, _ = await crashed("r-2", idempotent=False)
    # When another runner tries to recover it
    with pytest.raises(RecoveryNeedsDecision) as needs:
        await two.runner.recover(flow, "r-2")
    # Then a superstep span in the run's trace says it needs a decision, with a span for the call in doubt
    (step,) = two.spans("agentflow.superstep")
    (call,) = two.spans("agentflow.tool")
    assert step.context.trace_id == one.spans("agentflow.start")[0].context.trace_id
    assert attrs(step)["agentflow.status"] == "needs decision" and attrs(step)["agentflow.recovered"] is True
    assert call.parent.span_id == step.context.span_id
    assert (attrs(call)["agentflow.tool"], attrs(call)["agentflow.outcome"]) == ("second", "in doubt")
    assert [attrs(call)["agentflow.call_id"]] == needs.value.call_ids


async def test_a_pending_call_a_denied_call_a_failed_call_and_an_unrecordable_result_have_their_outcomes():
    # Given tools that need approval, fail twice, and return what JSON cannot carry
    registry = Registry()

    @registry.tool(approval=True)
    async def wire(amount: int) -> str:
        return "wired"

    @registry.tool(retries=1, backoff_s=0)
    async def flaky(amount: int) -> str:
        raise ValueError(f"card {amount} declined")

    @registry.tool
    async def opaque(amount: int) -> object:
        return object()

    class S(BaseModel):
        w: str = ""
        o: Any = None

    approvals = (
        Flow("wires", state=S).node("wire", Call("wire", args={"amount": 7}, into="w", on_deny="no")).end("wire")
    )
    failing = Flow("flaky", state=S).node("f", Call("flaky", args={"amount": 4111}, into="w")).end("f")
    odd = Flow("odd", state=S).node("o", Call("opaque", args={"amount": 1})).end("o")
    p = Process(registry, MemoryCheckpointStore())
    # When a run pauses for the approval and is resumed with a denial
    paused = await p.runner.run(approvals, {}, run_id="w-1")
    await p.runner.resume(approvals, "w-1", approve=False)
    # and a run calls the failing tool, and one the opaque tool
    failed = await p.runner.run(failing, {}, run_id="f-1")
    await p.runner.run(odd, {}, run_id="o-1")
    # Then the outcomes are pending, then denied (after a resume), failed after two attempts, and in doubt
    assert paused.status == "paused" and failed.status == "failed"
    calls = [
        (attrs(c)["agentflow.tool"], attrs(c)["agentflow.outcome"], attrs(c)["agentflow.attempts"])
        for c in p.spans("agentflow.tool")
    ]
    assert calls == [("wire", "pending", 0), ("wire", "denied", 0), ("flaky", "failed", 2), ("opaque", "in doubt", 1)]
    resumed = [s for s in p.spans("agentflow.superstep") if attrs(s)["agentflow.run_id"] == "w-1"]
    assert [attrs(s)["agentflow.cause"] for s in resumed] == ["start", "resume"]
    # and a failure is named by its type only (the message may hold what the tool was given)
    flaky_call = p.spans("agentflow.tool flaky")[0]
    assert attrs(flaky_call)["error.type"] == "ValueError" and flaky_call.status.status_code.name == "ERROR"
    assert not flaky_call.events and "4111" not in json.dumps(attrs(flaky_call))
    failed_step = [s for s in p.spans("agentflow.superstep") if attrs(s)["agentflow.run_id"] == "f-1"][0]
    assert attrs(failed_step)["agentflow.status"] == "failed" and failed_step.status.status_code.name == "ERROR"


class CountingModel(ScriptedModel):
    """A scripted model whose replies report token counts, as the adapters note them."""

    async def complete(self, messages, tools):
        reply = await super().complete(messages, tools)
        note_usage({"usage": {"in": 11 * self.calls, "out": 5}}, "in", "out")
        return reply


async def test_a_tool_loop_has_a_span_per_stage_and_a_chat_span_per_model_call_with_its_token_counts():
    # Given a traced tool loop whose model asks for one tool, then answers
    registry = Registry()

    @registry.tool
    async def forecast(city: str) -> str:
        return f"sunny in {city}"

    model = CountingModel(
        [
            Message.assistant(tool_calls=[ToolCall(id="c1", name="forecast", arguments={"city": "Oslo"})]),
            Message.assistant("sunny"),
        ]
    )
    p = Process(registry, None)
    store = MemoryCheckpointStore()
    # When it runs
    result = await run_tool_loop(
        model, registry, [Message.user("weather?")], run_id="l-1", checkpoints=store, name="weather", tracer=p.tracing
    )
    assert result.status == "done"
    # Then each stage is a superstep span of loop:weather (model, tools, model), in one trace
    steps = p.spans("agentflow.superstep")
    assert [s.name for s in steps] == ["agentflow.superstep loop:weather"] * 3
    assert len({s.context.trace_id for s in p.spans()}) == 1
    # and each model call is a chat span inside its stage, with the calls it asked for and its token counts
    chats = p.spans("chat")
    assert [c.parent.span_id for c in chats] == [steps[0].context.span_id, steps[2].context.span_id]
    assert [
        (
            a["gen_ai.request.model"],
            a["agentflow.tool_calls"],
            a["gen_ai.usage.input_tokens"],
            a["gen_ai.usage.output_tokens"],
        )
        for a in map(attrs, chats)
    ] == [("CountingModel", 1, 11, 5), ("CountingModel", 0, 22, 5)]
    # and the tool call is a span inside the tools stage
    (call,) = p.spans("agentflow.tool")
    assert call.parent.span_id == steps[1].context.span_id and attrs(call)["agentflow.outcome"] == "ran"


def every_value(spans: list[ReadableSpan]) -> str:
    """Everything the spans say, as one text to search."""
    parts: list[Any] = []
    for s in spans:
        parts += [s.name, dict(s.attributes or {}), s.status.description]
        parts += [(e.name, dict(e.attributes or {})) for e in s.events]
        parts += [dict(link.attributes or {}) for link in s.links]
    return json.dumps(parts, default=str)


async def test_no_argument_state_result_key_or_principal_in_any_span_unless_the_tool_opted_in(tmp_path):
    # Given tools that take and return secrets, one of them opted in to show its arguments and result
    registry = Registry()

    @registry.tool
    async def lookup(card: str) -> str:
        return "result-SECRET-R1"

    @registry.tool(trace_args=True, trace_result=True)
    async def shown(card: str) -> str:
        return "result-SHOWN-R2"

    class Wallet(BaseModel):
        card: str = "state-SECRET-S1"
        out: str = ""
        shown: str = ""

    flow = (
        Flow("wallet", state=Wallet)
        .node("look", Call("lookup", args=lambda s: {"card": "arg-SECRET-A1"}, into="out"))
        .node("show", Call("shown", args={"card": "arg-SHOWN-A2"}, into="shown"))
        .edge("look", "show")
        .end("show")
    )
    key = b"tracing-key-SECRET-0123456789abcdef"
    store = SQLiteCheckpointStore(tmp_path / "runs.db")
    p = Process(registry, store, key)
    # When a run for a principal goes through both
    ctx = RunContext(user="ada", principal="principal-SECRET-P1")
    assert (await p.runner.run(flow, {}, ctx=ctx)).status == "done"
    # Then no span says any of the state, the first tool's argument or result, the principal or the key
    said = every_value(p.spans())
    for secret in ("state-SECRET-S1", "arg-SECRET-A1", "result-SECRET-R1", "principal-SECRET-P1", key.decode()):
        assert secret not in said, secret
    # and the tool that opted in shows its arguments and its result
    (shown_call,) = p.spans("agentflow.tool shown")
    assert json.loads(attrs(shown_call)["agentflow.tool.args"]) == {"card": "arg-SHOWN-A2"}
    assert json.loads(attrs(shown_call)["agentflow.tool.result"]) == "result-SHOWN-R2"
    await store.aclose()


async def test_the_tool_call_span_is_the_current_span_while_the_tool_runs_sync_or_async():
    # Given tools that look at the current span (as an instrumented HTTP client does)
    registry = Registry()
    seen: dict[str, int] = {}

    @registry.tool
    async def fetch(url: str) -> str:
        seen["fetch"] = trace.get_current_span().get_span_context().span_id
        return "ok"

    @registry.tool
    def fetch_sync(url: str) -> str:
        seen["fetch_sync"] = trace.get_current_span().get_span_context().span_id
        return "ok"

    flow = (
        Flow("fetches", state=Out)
        .node("a", Call("fetch", args={"url": "u"}, into="a"))
        .node("b", Call("fetch_sync", args={"url": "u"}, into="b"))
        .edge("a", "b")
        .end("b")
    )
    p = Process(registry, MemoryCheckpointStore())
    # When a run calls them
    await p.runner.run(flow, {})
    # Then each saw its own call's span as the current one
    assert seen == {attrs(s)["agentflow.tool"]: s.context.span_id for s in p.spans("agentflow.tool")}


async def test_tracing_off_stores_no_context_and_a_run_started_untraced_gets_its_trace_from_its_run_id():
    # Given a runner without a tracer: tracing is off
    registry, _ = crashing_tools(idempotent=True)
    store = MemoryCheckpointStore()
    plain = FlowRunner(Executor(registry), checkpoints=store)
    assert plain.executor.tracer is NO_TRACING
    # When it runs a run that dies in its superstep
    with pytest.raises(Crash):
        await plain.run(two_calls(registry), {}, run_id="u-1")
    # Then no checkpoint carries a trace context
    sealer = plain.sealer
    assert sealer is not None
    assert all("trace" not in sealer.open_checkpoint(row, "u-1") for row in await store.history("u-1"))
    # And when a traced runner recovers it, its spans are in the trace derived from the run id
    p = Process(registry, store)
    await p.runner.recover(two_calls(registry), "u-1")
    derived = derived_context("u-1")
    (step,) = p.spans("agentflow.superstep")
    assert step.context.trace_id == derived.trace_id and step.parent.span_id == derived.span_id
    assert attrs(step)["agentflow.recovered"] is True and not step.links  # the dead superstep was not traced


async def test_the_traced_store_keeps_every_rule_of_the_store_it_wraps():
    # When the stores' conformance suite runs on memory stores with the tracing store hook
    report = await validate(lambda: traced(MemoryCheckpointStore()))
    # Then every rule holds through the wrapper
    assert {name: why for name, why in report.items() if why} == {}


async def test_a_run_whose_start_was_sampled_out_makes_no_span_on_any_worker():
    # Given a process whose sampler records no trace, and another that records every one
    registry, _ = crashing_tools(idempotent=True)
    store = MemoryCheckpointStore()
    one, two = Process(registry, store), Process(registry, store)
    one.provider = TracerProvider(sampler=ALWAYS_OFF)
    one.runner.executor.tracer = Tracing(one.provider)
    # When the first starts a run (its worker dies in the superstep) and the second recovers it
    with pytest.raises(Crash):
        await one.runner.run(two_calls(registry), {}, run_id="s-1")
    assert (await two.runner.recover(two_calls(registry), "s-1")).status == "done"
    # Then the run carries its trace context, marked not sampled, and nobody made a span of it
    sealer = two.runner.sealer
    assert sealer is not None
    (context,) = {sealer.open_checkpoint(row, "s-1")["trace"] for row in await store.history("s-1")}
    assert int(context[-2:], 16) & 1 == 0  # the W3C flags: not sampled
    assert two.spans() == [] and one.spans() == []


async def test_a_wrapped_store_keeps_the_event_stream_of_the_store_it_wraps_and_nothing_else():
    # Given a traced runner whose memory store (an EventStore, not a retention store once wrapped) is traced
    tickets = make_tickets()
    inner = MemoryCheckpointStore()
    store = traced(inner)
    assert isinstance(store, EventStore) and not isinstance(store, RetentionStore)
    tracing = Process(tickets.registry, store).tracing
    runner = FlowRunner(Executor(tickets.registry, tracer=tracing, events=Events(record=True)), checkpoints=store)
    # When a run goes from start to done, recorded
    await runner.run(TICKETS, {"show": "Hamlet"}, run_id="e-1")
    # Then its events went into the wrapped store's stream, read the same through the wrapper
    events = await store.read_events("e-1")
    assert events and events == await inner.read_events("e-1")
