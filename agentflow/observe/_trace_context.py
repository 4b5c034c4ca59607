"""The trace context a run carries, and store operations as span events (`store_op`).

- `traceparent` / `run_context`: a run's trace context as its checkpoints carry it (a W3C
  ``traceparent``), or derived from its run id when it carries none (`derived_context`).
- `store_op`: a store operation (timed by `Tracing.store_hook` on a `ForwardingStore`)
  noted with its latency as an event of agentflow's current span. What an entry point
  does before its first span opens (the lease, reading the run) waits in that entry
  point's `Pending` list and goes into its first span (`take_pending`).
"""

from __future__ import annotations

import hashlib
import re
from contextvars import ContextVar
from dataclasses import dataclass, field

from opentelemetry.trace import Span, SpanContext, TraceFlags

#: A W3C ``traceparent`` of version 00.
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
#: At most this many store operations wait for the first span of an entry point.
MAX_PENDING = 64


def traceparent(ctx: SpanContext) -> str:
    """The W3C ``traceparent`` of a span context."""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def derived_context(run_id: str) -> SpanContext:
    """The trace context of a run that carries none (started untraced): derived from its run id, sampled."""
    digest = hashlib.sha256(b"agentflow/trace/" + run_id.encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def run_context(run_id: str, stored: str | None) -> SpanContext:
    """The run's trace context: the one its checkpoints carry, else (none, or malformed) `derived_context`."""
    found = TRACEPARENT.match(stored or "")
    if found is not None:
        trace_id, span_id, flags = (int(part, 16) for part in found.groups())
        if trace_id and span_id:
            return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))
    return derived_context(run_id)


# -- what happens before an entry point's first span ---------------------------------------


@dataclass
class Pending:
    """Store operations of an entry point that opened no span yet (`Tracing.taking_up`)."""

    began: int
    """When the entry point began (ns since the epoch): its first span starts then."""
    ops: list[tuple[str, int, int]] = field(default_factory=list)
    """``(op, start ns, duration ns)``."""
    closed: bool = False
    """Its first span took the operations; later ones (a lease renewal's) are dropped."""


#: The entry point under way in this context whose first span has not opened.
pending_ops: ContextVar[Pending | None] = ContextVar("agentflow_trace_pending", default=None)
#: agentflow's span current in this context (store operations become its events).
current: ContextVar[Span | None] = ContextVar("agentflow_trace_span", default=None)


def store_op(op: str, start_ns: int, duration_ns: int) -> None:
    """Note a store operation: on the entry point's pending list, else as an event of agentflow's current span."""
    pending = pending_ops.get()
    if pending is not None:
        if not pending.closed and len(pending.ops) < MAX_PENDING:
            pending.ops.append((op, start_ns, duration_ns))
        return
    span = current.get()
    if span is not None:
        span.add_event(f"store.{op}", {"agentflow.store.ms": duration_ns / 1e6}, start_ns)


def take_pending() -> Pending | None:
    """The entry point's pending operations, for its first span (later ones are dropped); None if none."""
    pending = pending_ops.get()
    if pending is not None:
        pending.closed = True
        pending_ops.set(None)
    return pending
