"""The call log: ``started`` before a tool can run, then how it ended; replay and in-doubt checks.

Moving parts:
- `Journal` (`calls.journal`): one worker's pen on a run's log, numbering its records
  within its segment and holding a step's closing ``done`` for the checkpoint.
- `CallLog`: what a node's tool calls go through. For each call it replays a finished
  result, pauses for an approval, or takes the slots of its tool's limits, logs
  ``started``, runs the tool and logs the end.

Invariants:
- A tool never runs unless its ``started`` record is in the store (accepted, not fenced),
  and, for a non-idempotent tool, acknowledged as durable where the store is set to wait
  for that (`SealedCall.durable`: replicas, an fsync); not acknowledged, the tool does not run.
- Nothing is logged ``started`` until the call holds a slot of every limit of its tool
  (`Gate.holding`, renewed until the first attempt ends): a call waiting for a slot is not
  in doubt, so a worker killed while it waits leaves a call that simply runs on recovery.
  A cancel request that came during the wait is honoured before ``started`` (the call
  does not start). A call that asks a synchronous approval port holds its slots while
  the port decides (the port is asked after ``started``).
- A tool attempt runs only once its worker confirmed its lease on the run, right before it
  (`Tenure.confirm`): a worker that stalled past its lease after ``started`` (frozen, a long
  approval, a retry's backoff) runs nothing and raises `LeaseLost`; the call stays in doubt.
- Call identity is ``superstep/node/ordinal/argument digest``: the same on every worker.
- A started call with no end record, or an ``unrecordable`` one, is in doubt.

Reading the log back (checking, folding, deciding what may rerun) is `calls.read`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentflow._errors import ApprovalDenied, LeaseLost, ToolError
from agentflow._identity import RunContext
from agentflow.exec._executor import ApprovalRequest, Executor
from agentflow.exec._registry import Tool
from agentflow.exec.calls.journal import Journal as Journal
from agentflow.exec.calls.read import FINAL, CallState
from agentflow.exec.context import CallInfo, current_delivery
from agentflow.exec.limits.gate import Slots
from agentflow.exec.run.cancel import CancelWatch
from agentflow.exec.run.lease import Tenure
from agentflow.exec.seal import canonical, digest
from agentflow.exec.tracing import CallSpan


class PauseForApproval(Exception):
    """Internal signal: a call needs approval and no port can give it now."""

    def __init__(self, request: ApprovalRequest) -> None:
        super().__init__(request.call_id)
        self.request = request


class ToolFailed(ToolError):
    """Raised on replay of a call whose tool failed before the crash (its text is the stored failure)."""


def describe_failure(exc: BaseException) -> str:
    """How a tool's failure is stored and shown: ``Type: message`` (a replayed one as stored)."""
    return str(exc) if isinstance(exc, ToolFailed) else f"{type(exc).__name__}: {exc}"


def denial(tool: str, note: str | None) -> ApprovalDenied:
    """The error a node (or model) sees for a denied call, the same live and on replay."""
    return ApprovalDenied(f"call of {tool!r} was denied" + (f": {note}" if note else ""))


@dataclass(frozen=True, slots=True)
class Decision:
    """An approval decision stored with a checkpoint until it is spent."""

    approve: bool
    note: str | None = None


def too_large(run_id: str, step: int, body: Mapping[str, Any], size: int, limit: int) -> str:
    """Say which part of an oversized checkpoint body is large, and what to do about it."""
    sizes = {key: len(canonical(value)) for key, value in body.items()}
    part = max(sizes, key=lambda k: sizes[k])
    value = body[part]
    if isinstance(value, Mapping) and value:
        inner = {key: len(canonical(v)) for key, v in value.items()}
        field = max(inner, key=lambda k: inner[k])
        where = f"{part}.{field} ({inner[field]} bytes)"
    else:
        where = f"{part} ({sizes[part]} bytes)"
    return (
        f"run {run_id!r}: checkpoint {step} would be {size} bytes, over max_checkpoint_bytes ({limit}); "
        f"the largest part is {where}. Keep large data out of the state: store it elsewhere (a file, a bucket, "
        "a table) and keep a reference to it, or raise max_checkpoint_bytes"
    )


def envelope(
    identity: dict[str, Any],
    pending: Sequence[ApprovalRequest],
    decisions: Mapping[str, Decision],
    journal: Journal | None,
    error: str | None,
) -> dict[str, Any]:
    """The fields every checkpoint body carries, of a flow or of a tool loop."""
    return {
        "identity": identity,
        "pending": [{"call_id": p.call_id, "tool": p.tool, "args": p.args, "node": p.node} for p in pending],
        "decisions": {k: {"approve": d.approve, "note": d.note} for k, d in decisions.items()},
        "log": [journal.segment, journal.next_seq] if journal else None,
        "error": error,
    }


def decide(
    run_id: str, pending: Sequence[Any], approve: bool | Mapping[str, bool], note: str | None
) -> dict[str, Decision]:
    """Turn an operator's ``approve`` into one decision per pending call.

    Args:
        run_id: the paused run (for messages).
        pending: its pending approval requests (each has a ``call_id``).
        approve: one decision for every pending call, or one per call id.
        note: stored with each decision.

    Raises:
        ValueError: `approve` names a call that is not pending, or leaves one undecided.
    """
    ids = [p.call_id for p in pending]
    if isinstance(approve, bool):
        return {cid: Decision(approve, note) for cid in ids}
    unknown = sorted(set(approve) - set(ids))
    if unknown:
        raise ValueError(f"run {run_id!r} has no pending call(s) {unknown}; pending: {ids}")
    missing = [cid for cid in ids if cid not in approve]
    if missing:
        raise ValueError(f"run {run_id!r}: decide every pending call; missing {missing}")
    return {cid: Decision(bool(approve[cid]), note) for cid in ids}


def read_decisions(body: Mapping[str, Any]) -> dict[str, Decision]:
    """The decisions a checkpoint body stores, not yet spent."""
    return {k: Decision(bool(v["approve"]), v.get("note")) for k, v in body["decisions"].items()}


def read_pending(body: Mapping[str, Any], ctx: RunContext | None) -> list[ApprovalRequest]:
    """The approval requests a checkpoint body holds."""
    return [ApprovalRequest(p["call_id"], p["tool"], p["args"], p["node"], ctx) for p in body["pending"]]


@dataclass
class CallLog:
    """What every tool call of one superstep goes through (with or without a store)."""

    executor: Executor
    run_id: str
    superstep: int
    ctx: RunContext | None = None
    journal: Journal | None = None
    seeds: Mapping[str, CallState] = field(default_factory=dict)
    decisions: Mapping[str, Decision] = field(default_factory=dict)
    replayed: list[str] = field(default_factory=list)
    rerun: list[str] = field(default_factory=list)
    unreplayed: list[str] = field(default_factory=list)
    pending: list[ApprovalRequest] = field(default_factory=list)
    closing: tuple[str, int] | None = None
    """The call that closes the step, ``(node, ordinal)``: its ``done`` goes with the checkpoint (`closes_with`)."""
    watch: CancelWatch | None = None
    """Looked at before a call starts: a cancel request stops the run there (`CancelRequested`)."""
    span: str | None = None
    """The superstep's span id, written into each ``started`` record (None: untraced)."""
    lease: Tenure | None = None
    """The worker's lease on the run, confirmed right before each attempt of a tool runs (None: none held)."""

    def closes_with(self, node: str, calls: int) -> None:
        """Say that the step is `calls` calls of `node`, one after another, with nothing after the last.

        The one rule of held records, for flows and tool loops alike: once the step's last
        call (ordinal ``calls - 1``) ends, only bookkeeping lies before the checkpoint
        (folding results into the cursor, the look-out for a cancel), so that call's
        ``done`` is held and stored with the checkpoint in one write (`Journal.save`).
        Every other record is stored at once: an earlier call's ``done`` would be stored
        anyway by the next ``started``, and the wait for that call's slots or approval
        must not leave a finished call unlogged. A held ``done`` goes in on its own before
        any later record, when the checkpoint is refused or cannot be stored, and before a
        cancelled run ends; lost with a crash, its call is in doubt as if the crash had
        come inside the tool. A driver never says this of calls made concurrently, or of
        calls its user's code may follow.
        """
        self.closing = (node, calls - 1) if calls > 0 else None

    async def call(self, node: str, ordinal: int, tool_name: str, args: Mapping[str, Any]) -> Any:
        """Make (or replay) one call of `node`, in a span of its own (`Tracer.tool_call`).

        Raises:
            PauseForApproval: the call needs approval and no port is configured.
            CancelRequested: the run is being cancelled; the call did not start.
            ApprovalDenied: the call needed approval and was denied.
            CheckpointConflict: the store refused the ``started`` record (fenced).
        """
        tool = self.executor.registry.get(tool_name)
        kwargs, encoded = tool.prepare(args)
        prefix = f"{self.superstep}/{node}/{ordinal}/"
        call_id = prefix + digest(encoded)[:16]
        seed = self.seeds.get(call_id)
        tracer = self.executor.tracer
        if seed is not None and seed.kind in FINAL:
            with tracer.tool_call(self.run_id, tool, call_id, encoded) as span:
                span.outcome("replayed")
                return self._replay(tool, seed)
        if self.watch is not None:
            await self.watch.check()
        if seed is not None and seed.in_doubt:
            self.rerun.append(call_id)
            self.executor.events.emit("tool.rerun", self.run_id, tool=tool.name, call_id=call_id)
        elif seed is None and any(k.startswith(prefix) for k in self.seeds):
            self.unreplayed.append(call_id)
        request = ApprovalRequest(call_id, tool.name, encoded, node, self.ctx)
        rerun = seed is not None and seed.in_doubt
        # A call that needed approval when it started needs it again to rerun, whatever the code says now.
        signed = rerun and seed is not None and seed.signed_approval
        with tracer.tool_call(self.run_id, tool, call_id, encoded) as span:
            return await self._decide(
                tool, kwargs, request, span, rerun=rerun, signed=signed, closes=self.closing == (node, ordinal)
            )

    async def _decide(
        self,
        tool: Tool,
        kwargs: dict[str, Any],
        request: ApprovalRequest,
        span: CallSpan,
        *,
        rerun: bool,
        signed: bool,
        closes: bool,
    ) -> Any:
        """Settle the approval, take the slots, log ``started`` and run the call (`call`, past replay and cancel).

        `signed`: the call's last ``started`` said it needed approval (it needs it again now).
        """
        decision = self.decisions.get(request.call_id)
        # A decision is given only to a call that asked for one; the policy is asked only without one.
        approval = decision is not None or signed or tool.needs_approval(kwargs, self.ctx)
        asks_port = False
        if decision is None and approval:
            if self.executor.approver is None:
                await self._write("pending", request, tool=tool.name, node=request.node, args=request.args)
                self.pending.append(request)
                span.outcome("pending")
                raise PauseForApproval(request)
            asks_port = True
        if decision is not None and not decision.approve:
            await self._write("denied", request, note=decision.note)
            span.outcome("denied")
            raise denial(tool.name, decision.note)
        who = {"run_id": self.run_id, "tool": tool.name, "call_id": request.call_id}
        async with self.executor.gate.holding(tool.limits, kwargs, self.ctx, who) as slots:
            if slots.waited and self.watch is not None:
                await self.watch.check(boundary=True)  # a cancel request that came while it waited: no start
            await self._start(tool, request, approval)
            if asks_port and not await self.executor.ask_approver(request):
                await self._write("denied", request, note="denied by the approval port")
                span.outcome("denied")
                raise denial(tool.name, "denied by the approval port")
            return await self._run(tool, kwargs, request, span, "rerun" if rerun else "ran", slots, closes)

    async def _start(self, tool: Tool, request: ApprovalRequest, approval: bool) -> None:
        """Log the call ``started`` (it holds its slots by now): from here on, a crash leaves it in doubt.

        The record signs what the code of now says of the call (idempotent; needing approval),
        so that a recovery under other code holds the call to the stricter of the two
        (`calls.read.needs_decision`, and `call` for approval).
        """
        started: dict[str, Any] = {"tool": tool.name, "node": request.node, "args": request.args}
        started["idempotent"] = tool.idempotent
        if approval:
            started["approval"] = True
        if self.journal is not None and self.journal.holder is not None:  # who to ask if it is cut off: its worker
            started["on"], started["at"] = self.journal.holder, time.time()
            if (message := current_delivery()) is not None:  # and the message it served (Flower's task)
                started["task"] = message
        if self.span is not None:  # the superstep's span: a recovery links to it (`run.checks.cut_off_spans`)
            started["span"] = self.span
        if self.journal is not None:  # a non-idempotent call's started must survive a failover before it runs
            await self.journal.write("started", self._body(request, **started), durable=not tool.idempotent)

    async def _run(
        self,
        tool: Tool,
        kwargs: dict[str, Any],
        request: ApprovalRequest,
        span: CallSpan,
        ran: str,
        slots: Slots,
        closes: bool,
    ) -> Any:
        info = CallInfo(self.run_id, request.call_id, tool.name, 1)
        confirm = functools.partial(self._confirm, tool, request) if self.lease is not None else None
        try:
            result = await self.executor.run(
                tool, kwargs, call=info, validated=True, approved=True, span=span, ctx=self.ctx, held=slots,
                before=confirm,
            )  # fmt: skip
        except LeaseLost:
            span.outcome("in doubt")  # it did not run (this attempt), and this worker may write nothing more
            raise
        except Exception as exc:
            if self.watch is not None:
                self.watch.moved()
            span.outcome("failed")
            await self._write("failed", request, error=describe_failure(exc))
            raise
        if self.watch is not None:
            self.watch.moved()
        span.outcome(ran, result)
        if self.journal is not None:
            try:  # encoded once: here, where a value JSON cannot carry makes the call unrecordable
                payload = canonical(self._body(request, result=tool.encode_result(result)))
            except Exception as exc:
                span.outcome("in doubt")
                await self._write("unrecordable", request, why=f"{type(exc).__name__}: {exc}")
                return result
            limit = self.journal.max_bytes
            if limit is not None and len(payload) > limit:  # it ran, but its result cannot be kept
                why = f"its result is {len(payload)} bytes, over the run's max_checkpoint_bytes ({limit})"
                span.outcome("in doubt")
                await self._write("unrecordable", request, why=why)
                return result
            if closes:  # the step's closing call: its `done` goes with the checkpoint (`closes_with`)
                await self.journal.hold_encoded("done", payload)
            else:
                await self.journal.write_encoded("done", payload)
        return result

    async def _confirm(self, tool: Tool, request: ApprovalRequest) -> None:
        """Let an attempt of the tool run only while this worker surely holds the run (`Tenure.confirm`).

        Between ``started`` and the tool a worker may stall past its lease (a frozen process, a
        long approval, a retry's backoff) and be taken over; the new holder may have decided the
        call did not happen and run it again. So a worker that cannot confirm its lease does not
        run the tool: the call stays in doubt for whoever holds the run now.

        Raises:
            LeaseLost: the lease lapsed or was taken over (the tool did not run).
        """
        assert self.lease is not None
        if await self.lease.confirm(self._unclaimed):
            return
        owner = self.lease.lease.owner
        self.executor.events.emit("tool.withheld", self.run_id, tool=tool.name, call_id=request.call_id, owner=owner)
        raise LeaseLost(
            f"run {self.run_id!r}: the lease of {owner} lapsed before tool {tool.name!r} could have its effect "
            f"(call {request.call_id}), and another worker took the run meanwhile (or the store could not be "
            "reached): the tool did not run, or stopped before its effect when it confirmed the lease itself; "
            "the call stays in doubt for whoever holds the run now"
        )

    async def _unclaimed(self) -> bool:
        """Whether the run's latest checkpoint (checked) is still in this worker's segment: nobody claimed it since."""
        journal = self.journal
        if journal is None:
            return False
        try:
            latest = await journal.store.latest(self.run_id)
            journal.sealer.open_checkpoint(latest, self.run_id)
        except Exception:  # unreadable, or failing its check: not a head to trust a tool's run on
            return False
        return latest.segment == journal.segment

    def _replay(self, tool: Tool, seed: CallState) -> Any:
        self.replayed.append(seed.call_id)
        self.executor.events.emit("tool.replayed", self.run_id, tool=tool.name, call_id=seed.call_id)
        if seed.kind == "failed":
            raise ToolFailed(seed.error or f"tool {tool.name!r} failed")
        if seed.kind == "denied":
            raise denial(tool.name, seed.error)
        return tool.revive_result(seed.result)

    def _body(self, request: ApprovalRequest, **fields: Any) -> dict[str, Any]:
        return {"call_id": request.call_id, "superstep": self.superstep, **fields}

    async def _write(self, kind: str, request: ApprovalRequest, **fields: Any) -> None:
        if self.journal is None:
            return
        await self.journal.write(kind, self._body(request, **fields))
