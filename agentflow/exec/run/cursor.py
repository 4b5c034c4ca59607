"""What a worker holds of a run between steps (`RunCursor`) and what a run returns (`RunOutcome`).

Flows and tool loops extend both: a flow's cursor adds its state, frontier and visits, a
loop's its messages and stage. Everything the run protocol (`run.protocol`) reads or
writes lives on the base, so the protocol never needs to know which kind it holds.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from agentflow._identity import RunContext
from agentflow._run_types import RunStatus
from agentflow.exec._executor import ApprovalRequest, Executor
from agentflow.exec.calls.log import CallLog, Decision, Journal
from agentflow.exec.calls.read import CallState
from agentflow.exec.run.cancel import CancelWatch
from agentflow.exec.run.lease import Tenure
from agentflow.exec.tracing import NO_SPAN, StepSpan


@dataclass
class RunCursor:
    """One worker's hold on a run: the fields every checkpoint envelope carries."""

    run_id: str
    """The run."""
    identity: dict[str, Any]
    """Who the run acts for, as signed into each checkpoint (a principal only as a proof)."""
    ctx: RunContext | None
    """Who the run acts for, restored (None: nobody)."""
    _: KW_ONLY
    step: int | None = None
    """The last step this worker saved or read (None before step 0)."""
    journal: Journal | None = None
    """This worker's pen on the call log (None without a store)."""
    decisions: dict[str, Decision] = field(default_factory=dict)
    """Approval decisions stored with the checkpoint and not yet spent."""
    pending: list[ApprovalRequest] = field(default_factory=list)
    """Calls waiting for an approval (a paused run)."""
    error: str | None = None
    """Why the run failed."""
    pins: dict[int, int] = field(default_factory=dict)
    """Record counts of earlier segments, pinned by the claim that opened this segment."""
    watch: CancelWatch | None = None
    """The look-out for a cancel request while this worker drives the run (None without a store)."""
    tenure: Tenure | None = field(default=None, repr=False)
    """The lease this worker holds while it drives the run (`run.lease.Tenure`; None: nothing is held,
    as without a store): each tool confirms it before it runs, and on a store that moves leases with
    its writes the drive's last save gives it up."""
    clock: float = field(default_factory=time.perf_counter, repr=False)
    """When this worker last saved the run, or took it up (`time.perf_counter`): the ``seconds``
    of its next ``checkpoint.saved`` event are counted from here."""
    started_at: float | None = None
    """When the run's step 0 was saved (seconds since the epoch), signed into every checkpoint
    from step 0 on (None: a run saved before the field existed)."""
    trace: str | None = None
    """The run's trace context (a W3C ``traceparent``), signed into every checkpoint from step 0 on
    (None: the run was started untraced; a tracer then derives one from the run id)."""
    wake: dict[str, Any] | None = None
    """A paused run's timer, signed into its checkpoint: ``{"at": seconds since the epoch, "for": "timer"
    or "approval"}`` (`run.timers`); None when nothing but a person wakes it."""
    events: dict[str, Any] | None = None
    """The head of the run's event chain its checkpoint names (`agentflow.exec.event_chain.ANCHOR`),
    carried into the next checkpoint by a process that records no events (None: none)."""
    cause: str = "start"
    """Why the next superstep runs (`agentflow.exec.tracing.CAUSES`); the protocol sets it."""
    cut_off: tuple[str, ...] | None = None
    """Set when the next superstep continues a cut-off one (a recovery): the span ids its
    ``started`` records carry (the spans of the superstep the dead worker left)."""
    span: StepSpan = field(default=NO_SPAN, repr=False)
    """The span of the superstep under way (`NO_SPAN` outside one, or untraced)."""

    def call_log(self, executor: Executor, superstep: int, seeds: Mapping[str, CallState]) -> CallLog:
        """What the calls of superstep `superstep` go through: this worker's journal, watch, span and lease."""
        log = CallLog(executor, self.run_id, superstep, self.ctx, self.journal, seeds, self.decisions)
        log.watch, log.span, log.lease = self.watch, self.span.ref, self.tenure
        return log

    def outcome(self, replayed: list[str] | None = None, rerun: list[str] | None = None) -> dict[str, Any]:
        """The keyword fields of `RunOutcome` as this cursor stands."""
        return {
            "step": self.step,
            "pending": list(self.pending),
            "error": self.error,
            "replayed": list(replayed or []),
            "rerun": list(rerun or []),
        }


@dataclass
class RunOutcome:
    """What every run returns, a flow's or a loop's."""

    run_id: str
    """The run's id (pass it to recover or resume)."""
    status: RunStatus
    """``running`` (a step limit was reached), ``paused``, ``done`` or ``failed``."""
    _: KW_ONLY
    step: int | None = None
    """The latest checkpoint's step (None without a store)."""
    pending: list[ApprovalRequest] = field(default_factory=list)
    """The calls waiting for approval when the run is paused."""
    error: str | None = None
    """Why the run failed."""
    replayed: list[str] = field(default_factory=list)
    """Calls whose stored results were replayed (after a recovery or resume)."""
    rerun: list[str] = field(default_factory=list)
    """Calls in doubt that ran again."""
    version: str | None = None
    """The version of the flow the run is on (None: a tool loop, which has no versions)."""
