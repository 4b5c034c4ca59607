"""`Tracing`: agentflow's OpenTelemetry spans, one trace per run across every worker (the ``otel`` extra).

`Tracing` implements the tracing port (`agentflow.exec.tracing.Tracer`) on the
OpenTelemetry API: pass it to an `Executor` and the runs it drives report spans to the
tracer provider you configured (the global one by default). Without an SDK configured,
the API makes every span a no-op.

The trace: saving a run's step 0 opens ``agentflow.start <flow>`` (a child of the caller's
current span, else the root of a new trace), whose context the run carries in every
checkpoint. Each superstep (a tool loop's stage) is a span ``agentflow.superstep <flow>``
whose parent is that context, in whatever process runs it; each tool call inside it is
``agentflow.tool <tool>`` (the current span while the tool runs, so a client the tool
instruments nests under it), each model call ``chat <model>``. A run started untraced
gets a trace id derived from its run id, the same on every worker. A superstep that
continues one a dead worker cut off carries ``agentflow.recovered`` and a link to the
span of the cut-off superstep (whose id its ``started`` records carry).

Store operations are span events (``store.<op>``, with ``agentflow.store.ms``) when the
store is a `ForwardingStore` with `Tracing.store_hook`; what an entry point does before its first span opens
(the lease, reading the head and the log, the claim) becomes events of that span, which
starts when the entry point began.

Attributes are ids, names and counts (see docs/observability.md): never the state, a
principal, a key, or a tool's arguments and result unless the tool opted in
(``trace_args``, ``trace_result``). An error is named by its type only (``error.type``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from contextvars import Token
from types import TracebackType
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, Status, StatusCode

from agentflow.exec import Tool
from agentflow.exec.checkpoints.forwarding import StoreHook
from agentflow.exec.run.cancel import CancelRequested
from agentflow.exec.run.cursor import RunCursor
from agentflow.exec.tracing import NO_SPAN, CallSpan, ModelSpan, StepSpan
from agentflow.models.usage import clear_usage, last_usage
from agentflow.observe._store import StoreTimer
from agentflow.observe._trace_context import (
    Pending,
    current,
    pending_ops,
    run_context,
    store_op,
    take_pending,
    traceparent,
)

__all__ = ["SCOPE", "Tracing", "trace_worker"]

#: The instrumentation scope's name (``otel.scope.name`` in a backend).
SCOPE = "agentflow"
#: Parsed trace contexts kept (a worker sees the same few runs' over and over).
MAX_PARENTS = 1024
#: Store operations as events of agentflow's current span (`Tracing.store_hook`), from when each began.
_STORE_EVENTS = StoreTimer(lambda op, took: store_op(op, time.time_ns() - took, took))


class _Open:
    """A span made current for a block (in OpenTelemetry's context, and as agentflow's `current` span)."""

    span: Span = trace.INVALID_SPAN
    _token: object = None
    _ours: Token[Span | None] | None = None

    def _open(self, span: Span, pending: Pending | None = None) -> None:
        self.span = span
        if pending is not None:
            for op, start, duration in pending.ops:
                span.add_event(f"store.{op}", {"agentflow.store.ms": duration / 1e6}, start)
        self._token = otel_context.attach(trace.set_span_in_context(span))
        self._ours = current.set(span)

    def _close(self, exc: BaseException | None, error: bool) -> None:
        if exc is not None and error:
            self.span.set_status(Status(StatusCode.ERROR))
            self.span.set_attribute("error.type", type(exc).__name__)
        if self._ours is not None:
            current.reset(self._ours)
        otel_context.detach(self._token)  # type: ignore[arg-type,unused-ignore]
        self.span.end()


class _Start(_Open):
    """The span around the save of a run's step 0; gives the run its trace context."""

    def __init__(self, tracer: trace.Tracer, cur: RunCursor, flow: str) -> None:
        self._tracer, self._cur, self._flow = tracer, cur, flow

    def __enter__(self) -> _Start:
        pending = take_pending()
        attributes = {"agentflow.run_id": self._cur.run_id, "agentflow.flow": self._flow}
        span = self._tracer.start_span(
            f"agentflow.start {self._flow}",
            attributes=attributes,
            start_time=pending.began if pending is not None else None,
            record_exception=False,
        )
        self._open(span, pending)
        ctx = span.get_span_context()
        self._cur.trace = traceparent(ctx) if ctx.is_valid else None
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._close(exc, error=True)


class _Step(_Open):
    """One superstep's span (`StepSpan`): while it is open, the cursor's ``span``."""

    def __init__(self, tracing: Tracing, cur: RunCursor, flow: str, superstep: int) -> None:
        self._tracing, self._cur = tracing, cur
        self._name = f"agentflow.superstep {flow}"
        self._attributes: dict[str, Any] = {
            "agentflow.run_id": cur.run_id,
            "agentflow.flow": flow,
            "agentflow.superstep": superstep,
            "agentflow.cause": cur.cause,
        }
        if cur.step is not None:
            self._attributes["agentflow.step"] = cur.step
        if cur.journal is not None:
            self._attributes["agentflow.segment"] = cur.journal.segment
        self._cut_off = cur.cut_off

    #: The span's id, for the superstep's ``started`` records (None when it is not recorded: sampled out).
    ref: str | None = None

    def __enter__(self) -> _Step:
        parent, links = self._tracing.parent(self._cur, self._cut_off)
        if self._cut_off is not None:
            self._attributes["agentflow.recovered"] = True
        pending = take_pending()
        span = self._tracing.tracer.start_span(
            self._name,
            parent,
            attributes=self._attributes,
            links=links,
            start_time=pending.began if pending is not None else None,
            record_exception=False,
        )
        self._open(span, pending)
        if span.is_recording():  # (a span a sampler dropped is exported by nobody: nothing to link to)
            self.ref = f"{span.get_span_context().span_id:016x}"
        self._cur.span = self
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._cur.span = NO_SPAN
        self._close(exc, error=exc is not None and not isinstance(exc, CancelRequested))

    def saved(self, step: int, status: str) -> None:
        """The checkpoint the superstep saved, and its status (a failed run is an error)."""
        self.span.set_attributes({"agentflow.saved_step": step, "agentflow.status": status})
        if status == "failed":
            self.span.set_status(Status(StatusCode.ERROR))

    def recovered(self, replayed: Sequence[str], rerun: Sequence[str]) -> None:
        """It continued a cut-off superstep: the ``agentflow.recovered`` event counts what it replayed and reran."""
        self.span.add_event("agentflow.recovered", {"agentflow.replayed": len(replayed), "agentflow.rerun": len(rerun)})


class _Call(_Open):
    """One tool call's span (`CallSpan`); current while the tool runs."""

    def __init__(self, tracer: trace.Tracer, run_id: str, tool: Tool, call_id: str, args: dict[str, Any]) -> None:
        self._tracer, self._tool = tracer, tool
        self._attributes: dict[str, Any] = {
            "agentflow.run_id": run_id,
            "agentflow.tool": tool.name,
            "agentflow.call_id": call_id,
            "agentflow.idempotent": tool.idempotent,
        }
        if tool.trace_args:
            self._attributes["agentflow.tool.args"] = _json(lambda: args)
        self._outcome: str | None = None
        self._attempts = 0

    def __enter__(self) -> _Call:
        self._open(
            self._tracer.start_span(
                f"agentflow.tool {self._tool.name}", attributes=self._attributes, record_exception=False
            )
        )
        return self

    def attempt(self, number: int) -> None:
        """Attempt `number` of the tool begins."""
        self._attempts = number

    def outcome(self, outcome: str, result: Any = None) -> None:
        """How the call ended (and its result, for a tool that opted in)."""
        self._outcome = outcome
        if self._tool.trace_result and result is not None:
            self.span.set_attribute("agentflow.tool.result", _json(lambda: self._tool.encode_result(result)))

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        span = self.span
        ended: dict[str, Any] = {"agentflow.attempts": self._attempts}
        if self._outcome is not None:
            ended["agentflow.outcome"] = self._outcome
        span.set_attributes(ended)
        failed = exc is not None and self._outcome in (None, "failed")
        if failed and self._tool.trace_result:
            span.record_exception(exc)  # type: ignore[arg-type,unused-ignore]
        self._close(exc, error=failed)


class _Model(_Open):
    """One model call's span (`ModelSpan`), named as OpenTelemetry's GenAI conventions name a chat call."""

    def __init__(self, tracer: trace.Tracer, run_id: str, model: Any, turn: int) -> None:
        name = getattr(model, "model", None)
        self._model = name if isinstance(name, str) else type(model).__name__
        self._tracer = tracer
        self._attributes: dict[str, Any] = {
            "agentflow.run_id": run_id,
            "agentflow.turn": turn,
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": self._model,
        }

    def __enter__(self) -> _Model:
        clear_usage()
        self._open(self._tracer.start_span(f"chat {self._model}", attributes=self._attributes, record_exception=False))
        return self

    def reply(self, message: Any) -> None:
        """The model's reply: how many calls it asks for, and its token counts when the adapter noted them."""
        self.span.set_attribute("agentflow.tool_calls", len(getattr(message, "tool_calls", ())))
        usage = last_usage()
        if usage is not None and usage.input_tokens is not None:
            self.span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
        if usage is not None and usage.output_tokens is not None:
            self.span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._close(exc, error=True)


def _json(value: Callable[[], Any]) -> str:
    """`value()` as JSON for an attribute (one that cannot be encoded is named: tracing never breaks a run)."""
    try:
        return json.dumps(value(), sort_keys=True, default=str)
    except Exception as exc:
        return f"<not encodable: {type(exc).__name__}>"


class Tracing:
    """agentflow's spans on OpenTelemetry (see the module docstring): ``Executor(registry, tracer=Tracing())``."""

    def __init__(self, provider: trace.TracerProvider | None = None) -> None:
        """Trace to `provider` (default: the global tracer provider, looked up when a span starts).

        Args:
            provider: an SDK `TracerProvider` of your own (a test's, or one per tenant).
        """
        self.tracer = trace.get_tracer(SCOPE, tracer_provider=provider)
        self._parents: dict[str, tuple[Context, SpanContext]] = {}

    @property
    def store_hook(self) -> StoreHook:
        """The store hook that notes each operation as an event of the current span: ``ForwardingStore(store, [hook])``.

        An event ``store.<op>`` with ``agentflow.store.ms``; the same hook for every `Tracing`.
        """
        return _STORE_EVENTS

    def run(self, cur: RunCursor) -> tuple[Context, SpanContext]:
        """The run's trace context (`run_context`), and a context whose span it is (cached per run)."""
        key = cur.trace if cur.trace is not None else cur.run_id  # (a run id: a derived context)
        cached = self._parents.get(key)
        if cached is None:
            ctx = run_context(cur.run_id, cur.trace)
            cached = (trace.set_span_in_context(NonRecordingSpan(ctx)), ctx)
            if len(self._parents) >= MAX_PARENTS:
                self._parents.clear()
            self._parents[key] = cached
        return cached

    def parent(self, cur: RunCursor, cut_off: tuple[str, ...] | None) -> tuple[Context, list[Link]]:
        """The context a superstep span of `cur` is a child of, and its links.

        The links: one to each span of a cut-off superstep (`cut_off`), and one to the
        caller's span when a caller in another trace takes the run up (a recovery from a web
        request, say).
        """
        parent, ctx = self.run(cur)
        links = [
            Link(SpanContext(ctx.trace_id, int(span_id, 16), True, ctx.trace_flags), {"agentflow.link": "cut_off"})
            for span_id in cut_off or ()
        ]
        if cur.cause != "next":  # (a next superstep has the same caller as the one before it)
            caller = trace.get_current_span().get_span_context()
            if caller.is_valid and caller.trace_id != ctx.trace_id:
                links.append(Link(caller, {"agentflow.link": "caller"}))
        return parent, links

    def taking_up(self) -> None:
        """An entry point begins: keep its store operations for its first span, which starts now."""
        pending_ops.set(Pending(time.time_ns()))

    def start(self, cur: RunCursor, flow: str) -> _Start:
        """The span around step 0's save; it sets ``cur.trace``."""
        return _Start(self.tracer, cur, flow)

    def superstep(self, cur: RunCursor, flow: str, superstep: int) -> AbstractContextManager[StepSpan]:
        """One superstep's span; none in a run whose start was not sampled (its context says so)."""
        if not self.run(cur)[1].trace_flags.sampled:
            return NO_SPAN
        return _Step(self, cur, flow, superstep)

    def tool_call(
        self, run_id: str, tool: Tool, call_id: str, args: dict[str, Any]
    ) -> AbstractContextManager[CallSpan]:
        """One tool call's span, inside the superstep's (none outside one: an unsampled run's)."""
        if current.get() is None:
            return NO_SPAN
        return _Call(self.tracer, run_id, tool, call_id, args)

    def model_call(self, run_id: str, model: Any, turn: int) -> AbstractContextManager[ModelSpan]:
        """One model call's span, inside the stage's (none outside one)."""
        if current.get() is None:
            return NO_SPAN
        return _Model(self.tracer, run_id, model, turn)

    def in_doubt(self, cur: RunCursor, flow: str, superstep: int, calls: Sequence[tuple[str, str]]) -> None:
        """A superstep span that stopped at calls in doubt, and a span per call (its outcome ``in doubt``)."""
        if not self.run(cur)[1].trace_flags.sampled:
            return
        with _Step(self, cur, flow, superstep) as step:
            step.span.set_attribute("agentflow.status", "needs decision")
            for tool, call_id in calls:
                attributes = {
                    "agentflow.run_id": cur.run_id,
                    "agentflow.tool": tool,
                    "agentflow.call_id": call_id,
                    "agentflow.outcome": "in doubt",
                }
                self.tracer.start_span(f"agentflow.tool {tool}", attributes=attributes).end()


class _Hookable(Protocol):
    """What `trace_worker` needs of a Celery worker (`agentflow.celery.worker.Worker`)."""

    tracer: Any

    def hook_store(self, hook: StoreHook) -> None: ...


def trace_worker(worker: _Hookable, tracing: Tracing | None = None) -> Tracing:
    """Have a Celery worker's runs report spans: `tracing` (a new `Tracing` by default), its store traced.

    Call it after `register_tasks`, before the first task (``register_tasks(...).worker``);
    the runnable workers do when ``AGENTFLOW_TRACING=1``. Returns the tracing.
    """
    chosen = tracing if tracing is not None else Tracing()
    worker.tracer = chosen
    worker.hook_store(chosen.store_hook)
    return chosen
