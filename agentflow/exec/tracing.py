"""The tracing port: the spans a run reports (its start, supersteps, tool calls, model calls), off by default.

agentflow.exec knows nothing of OpenTelemetry: `Tracer` is the port, `NO_TRACING` its
default, and `agentflow.observe.Tracing` the OpenTelemetry implementation a user passes
to an `Executor` (``Executor(registry, tracer=Tracing())``), as they pass an event hub.

Moving parts:
- `Tracer.start`: around the save of a run's step 0; it sets the cursor's ``trace``, the
  run's trace context as a W3C ``traceparent`` string, which every checkpoint body then
  carries (``trace``, signed), so every worker that opens the run continues its trace.
- `Tracer.superstep`: around one superstep (a tool loop's stage); while it is open the
  cursor's ``span`` is its `StepSpan`, which `RunSteps.save` tells what was saved. Its
  ``cause`` and ``cut_off`` are read from the cursor (the protocol sets them).
- `Tracer.tool_call` (`CallSpan`) and `Tracer.model_call` (`ModelSpan`): around one call.
- `Tracer.in_doubt`: a superstep that found calls in doubt it may not rerun.
- `Tracer.taking_up`: called as an entry point begins to take a run up (before its lease),
  so the tracer can put what happens before the first span opens into that span.

Invariants:
- Off costs nothing worth measuring: every method of `NO_TRACING` returns one shared
  object that does nothing, and nothing is built for it.
- The port is given ids and names: run id, flow, step, segment, cause, tool, call id,
  outcome. A tool's arguments and result reach it only as the call log has them, and an
  implementation shows them only for a tool that opted in (``trace_args``, ``trace_result``);
  never the state, a principal or a key.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from agentflow.exec._registry import Tool
    from agentflow.exec.run.cursor import RunCursor

#: What became of a tool call, as its span says (``outcome``).
OUTCOMES = ("ran", "replayed", "rerun", "in doubt", "denied", "failed", "pending")

#: Why a superstep runs (``cause``): the first of a run, the next in the same process, a recovery
#: of a cut-off one, a run handed over between workers, or a signed decision being spent.
CAUSES = ("start", "next", "recovery", "resume", "handoff", "retry", "decision", "migrate", "wake")


class StepSpan(Protocol):
    """One superstep's span, as the run protocol sees it."""

    @property
    def ref(self) -> str | None:
        """The span's id (16 hex digits) that the superstep's ``started`` records carry (None: not traced)."""

    def saved(self, step: int, status: str) -> None:
        """The superstep saved checkpoint `step` with `status`."""

    def recovered(self, replayed: Sequence[str], rerun: Sequence[str]) -> None:
        """The superstep continued a cut-off one: these calls replayed, these ran again."""


class CallSpan(Protocol):
    """One tool call's span."""

    def attempt(self, number: int) -> None:
        """The tool's attempt `number` (1, 2, ...) begins."""

    def outcome(self, outcome: str, result: Any = None) -> None:
        """How the call ended (one of `OUTCOMES`); `result` is what the tool returned, when it ran."""


class ModelSpan(Protocol):
    """One model call's span."""

    def reply(self, message: Any) -> None:
        """The model answered with `message` (its token counts are read where its adapter noted them)."""


class Tracer(Protocol):
    """What a run reports to a tracer (see the module docstring)."""

    def taking_up(self) -> None:
        """An entry point begins to take a run up (nothing is open yet)."""

    def start(self, cur: RunCursor, flow: str) -> AbstractContextManager[Any]:
        """Around the save of step 0 of a new run of `flow`; sets ``cur.trace``."""

    def superstep(self, cur: RunCursor, flow: str, superstep: int) -> AbstractContextManager[StepSpan]:
        """Around one superstep of the held run `cur` (``cur.span`` is the span while it is open)."""

    def tool_call(
        self, run_id: str, tool: Tool, call_id: str, args: dict[str, Any]
    ) -> AbstractContextManager[CallSpan]:
        """Around one tool call (it is the current span while the tool runs)."""

    def model_call(self, run_id: str, model: Any, turn: int) -> AbstractContextManager[ModelSpan]:
        """Around one model call of a tool loop."""

    def in_doubt(self, cur: RunCursor, flow: str, superstep: int, calls: Sequence[tuple[str, str]]) -> None:
        """A superstep of `cur` stopped at these ``(tool, call_id)`` calls in doubt: nothing ran."""


class _Nothing:
    """Every span of `NO_TRACING`: a context manager and a span that do nothing."""

    ref: str | None = None

    def __enter__(self) -> _Nothing:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def saved(self, step: int, status: str) -> None:
        """Nothing."""

    def recovered(self, replayed: Sequence[str], rerun: Sequence[str]) -> None:
        """Nothing."""

    def attempt(self, number: int) -> None:
        """Nothing."""

    def outcome(self, outcome: str, result: Any = None) -> None:
        """Nothing."""

    def reply(self, message: Any) -> None:
        """Nothing."""


#: The one do-nothing span: what ``cur.span`` is outside a traced superstep.
NO_SPAN = _Nothing()


class NoTracing:
    """Tracing off: every method returns `NO_SPAN` (the `Tracer` every executor has by default)."""

    def taking_up(self) -> None:
        """Nothing."""

    def start(self, cur: RunCursor, flow: str) -> _Nothing:
        """`NO_SPAN`: the run gets no trace context."""
        return NO_SPAN

    def superstep(self, cur: RunCursor, flow: str, superstep: int) -> _Nothing:
        """`NO_SPAN`."""
        return NO_SPAN

    def tool_call(self, run_id: str, tool: Tool, call_id: str, args: dict[str, Any]) -> _Nothing:
        """`NO_SPAN`."""
        return NO_SPAN

    def model_call(self, run_id: str, model: Any, turn: int) -> _Nothing:
        """`NO_SPAN`."""
        return NO_SPAN

    def in_doubt(self, cur: RunCursor, flow: str, superstep: int, calls: Sequence[tuple[str, str]]) -> None:
        """Nothing."""


#: The default tracer: off.
NO_TRACING = NoTracing()
