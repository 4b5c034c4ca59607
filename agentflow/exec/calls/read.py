"""Reading a run's call log: check every record, fold a superstep's, decide what may rerun.

Moving parts:
- `read_log`: load every record of a run, check each signature and the numbering, and
  return the decoded bodies. Nothing is decoded before its signature checks.
- `read_head`: the latest checkpoint and the records per segment, in one read.
- `fold` / `analyze`: fold the records (of the run, or of one superstep) into a
  `CallState` per call identity; `calls_in_doubt` decides which of them may run again.
  The read model (`run.read`) shows calls from the same fold.

Invariants:
- A started call with no end record, or an ``unrecordable`` one, is in doubt.
- A ``done`` record is final: no later record (an operator's decision taken before a
  stalled worker's late ``done`` arrived, a retry) makes its call run again.

What the log must hold against the latest checkpoint (markers, pins, nothing past it) is
checked in `run.checks`, the one set of checks every reader of a run makes.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentflow._errors import CheckpointStoreCorrupt, RecoveryNeedsDecision
from agentflow.exec._registry import Registry
from agentflow.exec.checkpoints import CheckpointStore, SealedCheckpoint
from agentflow.exec.seal import Sealer

#: Record kinds that close a call for good.
FINAL = frozenset({"done", "failed", "denied"})
#: Deciding record kinds that leave a call in doubt: it may or may not have had its effect.
IN_DOUBT = frozenset({"started", "unrecordable"})


@dataclass(frozen=True, slots=True)
class LoggedRecord:
    """A checked, decoded call record."""

    segment: int
    seq: int
    kind: str
    body: dict[str, Any]


async def read_log(store: CheckpointStore, sealer: Sealer, run_id: str) -> list[LoggedRecord]:
    """Load and check every call record of a run: signatures, and numbering within each segment.

    What the log must hold against the checkpoints (their markers and pins) is checked by
    the caller with `agentflow.exec.run.checks`.

    Raises:
        CheckpointStoreCorrupt: a record fails its signature or is out of place (a gap).
    """
    out: list[LoggedRecord] = []
    counts: dict[int, int] = {}
    for row in await store.calls(run_id):
        body = sealer.open_call(row, run_id)
        want = counts.get(row.segment, 0)
        if row.seq != want:
            raise CheckpointStoreCorrupt(
                f"call log of run {run_id!r}: record {row.segment}.{want} is missing (found {row.segment}.{row.seq})"
            )
        counts[row.segment] = want + 1
        out.append(LoggedRecord(row.segment, row.seq, row.kind, body))
    return out


async def read_head(store: CheckpointStore, run_id: str) -> tuple[SealedCheckpoint, Mapping[int, int]]:
    """The run's latest checkpoint and its records per segment, counted no earlier than it (one read).

    Raises:
        CheckpointNotFound: nothing is stored for the run.
    """
    return await store.head(run_id)


@dataclass(slots=True)
class CallState:
    """Where one call stood when the log was read."""

    call_id: str
    tool: str
    node: str
    args: dict[str, Any]
    kind: str
    """The deciding record: ``started`` or ``unrecordable`` (in doubt), ``pending``, or a final kind."""
    result: Any = None
    error: str | None = None
    """Why it failed, was denied, or could not be stored."""
    superstep: int = -1
    """The superstep (a tool loop's turn) that made it."""
    segments: list[int] = field(default_factory=list)
    """The segments that wrote its records."""
    closed_in: int = -1
    """The segment of the record that made its kind final (-1: not final)."""
    supplied_by: str | None = None
    """The operator whose decision supplied its final record (`Happened`, `DidNotHappen`), if one did."""
    started_on: str | None = None
    """Who logged its latest ``started`` (the lease holder, ``<name>@<host>:<pid>``), if it said."""
    started_at: float | None = None
    """When (seconds since the epoch), if it said."""
    signed_idempotent: bool | None = None
    """What its latest ``started`` record says of its tool: idempotent or not (None: it does not say)."""
    signed_approval: bool = False
    """Whether its latest ``started`` record says the call needed a person's approval."""

    @property
    def in_doubt(self) -> bool:
        """Whether the call may or may not have had its effect."""
        return self.kind in IN_DOUBT


def fold(records: Sequence[LoggedRecord], superstep: int | None = None) -> dict[str, CallState]:
    """Fold call records into the state of each call, by call identity, in the order calls first appear.

    Args:
        records: checked records (`read_log`).
        superstep: only that superstep's calls (None: every call of the run).

    Raises:
        CheckpointStoreCorrupt: a record closes a call that never started.
    """
    states: dict[str, CallState] = {}
    for rec in records:
        body = rec.body
        if body.get("model"):
            continue  # a tool loop's model-call marker: counted by the loop, never in doubt
        at = body.get("superstep")
        if superstep is not None and at != superstep:
            continue
        cid = str(body["call_id"])
        state = states.get(cid)
        if state is None:
            if rec.kind not in ("started", "pending"):
                raise CheckpointStoreCorrupt(
                    f"call record {rec.segment}.{rec.seq} closes call {cid!r} that never started"
                )
            step = at if isinstance(at, int) else -1
            state = states[cid] = CallState(cid, str(body["tool"]), str(body["node"]), body.get("args", {}), rec.kind)
            state.superstep = step
        if rec.segment not in state.segments:
            state.segments.append(rec.segment)
        if rec.kind == "started":
            on, when = body.get("on"), body.get("at")
            state.started_on = on if isinstance(on, str) else None
            state.started_at = float(when) if isinstance(when, int | float) else None
            flag = body.get("idempotent")
            state.signed_idempotent = flag if isinstance(flag, bool) else None
            state.signed_approval = body.get("approval") is True
        if rec.kind in ("started", "pending"):
            # A failed call started again in a later segment is a retry's new attempt.
            retried = state.kind == "failed" and rec.kind == "started" and rec.segment > state.closed_in
            if state.kind not in FINAL or retried:
                state.kind = rec.kind
            continue
        if settled(state):
            continue
        state.kind = rec.kind
        state.closed_in = rec.segment
        supplied = body.get("supplied")
        if isinstance(supplied, dict):
            state.supplied_by = str(supplied.get("operator") or "an operator")
        state.result = body.get("result")
        state.error = body.get("note") if rec.kind == "denied" else body.get("error") or body.get("why")
    return states


def settled(state: CallState) -> bool:
    """Whether no later record changes the call: it has its own result (``done``).

    A later closing record (an operator's "did not happen") was decided on a read that the
    call's late ``done``, written by a stalled worker in its old segment, had not reached
    yet: the call happened, and a retry must not run it again.
    """
    return state.kind == "done"


def analyze(records: Sequence[LoggedRecord], superstep: int) -> dict[str, CallState]:
    """The calls of one superstep: what replays, what is in doubt (`fold` of that superstep)."""
    return fold(records, superstep)


def calls_in_doubt(
    run_id: str, states: Mapping[str, CallState], registry: Registry, rerun_in_doubt: bool | Collection[str]
) -> list[str]:
    """Return the in-doubt calls that will run again, or refuse to go on.

    Args:
        run_id: the run (for messages).
        states: the calls of the step being continued.
        registry: the tools deployed now (`needs_decision` weighs them against the signed records).
        rerun_in_doubt: True reruns every call in doubt; a collection of call ids reruns
            those (an operator's signed decision); False only the ones `needs_decision` lets
            rerun unasked.

    Raises:
        RecoveryNeedsDecision: a call is in doubt, `needs_decision` holds it back, and
            `rerun_in_doubt` does not cover it.
    """

    def allowed(state: CallState) -> bool:
        if isinstance(rerun_in_doubt, bool):
            return rerun_in_doubt
        return state.call_id in rerun_in_doubt

    doubtful = [s for s in states.values() if s.in_doubt]
    blocked = [(s, why) for s in doubtful if not allowed(s) and (why := needs_decision(s, registry)) is not None]
    if blocked:
        calls = [(s.tool, _why(s) + (f" ({why})" if why else "")) for s, why in blocked]
        raise RecoveryNeedsDecision(run_id, calls, [s.call_id for s, _ in blocked])
    return [s.call_id for s in doubtful]


def needs_decision(state: CallState, registry: Registry) -> str | None:
    """Whether a call in doubt must wait for a person's decision before it runs again.

    The one home of the rule, for flows, tool loops and agents, at recovery and at a
    decision. The stricter of the call's signed ``started`` record and the registry
    deployed now wins: a tool declared idempotent since the call started does not make its
    call safe to rerun (the effect it may have had was made by the code of then), and a
    tool that is gone (renamed or removed) leaves its call to a person.

    Returns:
        None when the call may run again unasked; otherwise what the person deciding
        should know beyond "in doubt" (empty when its tool is simply not idempotent).
    """
    if state.tool not in registry:
        return "its tool is not registered in this deployment: renamed or removed since the call started?"
    idempotent_now = registry.get(state.tool).idempotent
    if state.signed_idempotent is False and idempotent_now:
        return "not idempotent when the call started, as its signed record says; declared idempotent since"
    return None if idempotent_now else ""


def _why(state: CallState) -> str:
    if state.kind == "unrecordable":
        return f"call {state.call_id} ran but its result could not be stored"
    return f"call {state.call_id} was started{started_where(state.started_on, state.started_at)} and has no result"


def started_where(on: str | None, at: float | None) -> str:
    """`` on <holder> at <time>`` of a call's latest ``started`` (what its record says), or nothing."""
    where = f" on {on}" if on else ""
    if at is not None:
        where += " at " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
    return where
