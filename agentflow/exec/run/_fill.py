"""Stage 2 of reading a run: the views built from its rows once every one of them checked.

`fill` turns checked checkpoint bodies and call records into the read model's views
(`agentflow.exec.run.view`): the history, the segments (who held the run when), the
calls and their shown states, the recoveries, the identity and the latest state.

Invariants:
- Nothing here checks a row: it is only ever given bodies and records that stage 1
  (`agentflow.exec.run.read`) opened and checked. A body not shaped as agentflow writes
  it raises (`KeyError`, `TypeError`, ...), and the reader reports the run corrupt.
- Who did what comes from the checked bodies only (`run.control.control_of`), never from
  the store's unsigned columns or its leases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from agentflow._errors import CheckpointStoreCorrupt
from agentflow._run_types import RunKind, version_of
from agentflow.exec.calls.read import IN_DOUBT, LoggedRecord, fold, started_where
from agentflow.exec.checkpoints import SealedCheckpoint
from agentflow.exec.run import view as v
from agentflow.exec.run.control import control_of
from agentflow.exec.run.steps import CLAIM_CAUSES
from agentflow.exec.run.timers import wake_of

Body = dict[str, Any]


def _claim_cause(previous: SealedCheckpoint, body: Body) -> str:
    """Why a worker claimed the run: as the claim says, or (older rows) from what came before it."""
    said = body.get("claim")
    if said in CLAIM_CAUSES:
        return str(said)
    return "resume" if previous.status == "paused" else "recovery"


def _what(row: SealedCheckpoint, previous: SealedCheckpoint | None, body: Body) -> str:
    if previous is None:
        return "start" if row.step == 0 else f"{row.status} (kept; earlier steps trimmed)"
    if row.segment == row.step:
        return f"claim ({_claim_cause(previous, body)})"
    return row.status if row.status in ("paused", "done", "failed") else "superstep"


def superstep_of(body: Body) -> int | None:
    value = body.get("superstep", body.get("turn"))
    return value if isinstance(value, int) else None


def _segments(
    rows: Sequence[SealedCheckpoint], bodies: Sequence[Body], records: Sequence[LoggedRecord]
) -> list[v.SegmentView]:
    out: list[v.SegmentView] = []
    for i, row in enumerate(rows):
        if i == 0 or row.segment == row.step:
            # A trimmed run's history starts at the step a retention trim kept: how its segment began is gone.
            how = ("start" if row.step == 0 else "trimmed") if i == 0 else _claim_cause(rows[i - 1], bodies[i])
            count = sum(1 for rec in records if rec.segment == row.segment)
            said = control_of(bodies[i])
            seg = v.SegmentView(row.segment, how, row.step, row.step, row.saved_at, row.saved_at, count)
            settled = tuple(_settled(rec) for rec in records if rec.segment == row.segment and _supplied(rec))
            out.append(
                dataclasses.replace(
                    seg,
                    owner=said.by,
                    operator=said.operator,
                    rerun=said.rerun,
                    awaiting=said.awaiting,
                    settled=settled,
                )
            )
        else:
            out[-1] = dataclasses.replace(out[-1], last_step=row.step, until=row.saved_at)
    return out


def _supplied(rec: LoggedRecord) -> bool:
    """Whether a record is an operator's word on a call in doubt (stored with a decision's claim)."""
    return isinstance(rec.body.get("supplied"), dict)


def _settled(rec: LoggedRecord) -> tuple[str, str, Any]:
    """``(call_id, word, what)`` of a record an operator's decision supplied."""
    call_id = str(rec.body.get("call_id"))
    if rec.kind == "done":
        return call_id, "happened", rec.body.get("result")
    return call_id, "did not happen", rec.body.get("error")


def _fold_calls(records: Sequence[LoggedRecord]) -> list[v.CallView]:
    """One view per call identity, in the order the calls first appear in the log (`fold`)."""
    return [
        v.CallView(
            c.call_id,
            c.tool,
            c.node,
            c.superstep,
            c.kind,
            c.args,
            c.segments,
            c.result,
            c.error,
            supplied_by=c.supplied_by,
            started_on=c.started_on,
            started_at=c.started_at,
        )
        for c in fold(records).values()
    ]


def _label(calls: list[v.CallView], recoveries: list[v.Recovery]) -> None:
    """Set each call's shown state from its deciding record and what the recoveries say."""
    replayed = {cid for rec in recoveries for cid in rec.replayed}
    rerun = {cid for rec in recoveries for cid in rec.rerun}
    for call in calls:
        if call.kind == "done":
            call.state = v.REPLAYED if call.call_id in replayed else v.DONE
            call.note = "rerun after recovery (it was in doubt)" if call.call_id in rerun else ""
            if call.supplied_by is not None:
                call.note = f"in doubt; happened, said {call.supplied_by}, who supplied its result"
        elif call.kind in IN_DOUBT:
            call.state = v.IN_DOUBT
            where = started_where(call.started_on, call.started_at)
            why = "ran, but its result could not be stored" if call.kind == "unrecordable" else "no result"
            call.note = f"started{where}, {why}" if call.kind != "unrecordable" else why
        else:
            call.state = {"pending": v.PENDING, "failed": v.FAILED, "denied": v.DENIED}.get(call.kind, call.kind)


def _messages(run_id: str, bodies: Sequence[Body]) -> list[Any]:
    """A tool loop's or an agent's whole conversation, as stored (JSON), from its checked checkpoints.

    Each checkpoint holds the messages added since the one before (``new``); an agent's also
    says how many of the earlier ones it keeps (``keep``: pydantic-ai may rewrite the tail it
    resumed from). The latest one's ``history`` says how long the conversation is.

    Raises:
        CheckpointStoreCorrupt: the messages do not add up to the length the latest checkpoint signs.
    """
    saved: list[Any] = []
    for body in bodies:
        keep = body.get("keep")
        if isinstance(keep, int):
            del saved[keep:]
        saved.extend(body["new"])
    signed = bodies[-1]["history"]["len"]
    if len(saved) != signed:
        raise CheckpointStoreCorrupt(f"run {run_id!r}: its checkpoints hold {len(saved)} messages, not {signed}")
    return saved


def _state(body: Body) -> Any:
    if RunKind.of_body(body) is RunKind.LOOP:
        keys = ("stage", "turn", "model_calls", "max_steps")
        return {k: body.get(k) for k in keys} | {"messages": (body.get("history") or {}).get("len")}
    return body.get("state")


def fill(
    report: v.RunReport, rows: Sequence[SealedCheckpoint], bodies: list[Body], records: Sequence[LoggedRecord]
) -> None:
    """Build the views of a run whose every row checked."""
    segments = _segments(rows, bodies, records)
    held = {s.segment: s for s in segments}
    for i, (row, body) in enumerate(zip(rows, bodies, strict=True)):
        what = _what(row, rows[i - 1] if i else None, body)
        said = control_of(body)
        report.checkpoints.append(
            v.CheckpointView(
                row.step,
                row.saved_at,
                row.status,
                row.segment,
                superstep_of(body),
                what,
                by=said.by,
                operator=said.operator,
            )
        )
        done = body.get("recovered")
        if isinstance(done, dict):
            seg = held.get(row.segment)
            how, by, operator = (seg.how, seg.owner, seg.operator) if seg else ("recovery", said.by, None)
            replayed, rerun = list(done.get("replayed", [])), list(done.get("rerun", []))
            report.recoveries.append(v.Recovery(row.step, how, replayed, rerun, by, operator))
    latest = bodies[-1]
    if "claim" in latest:  # a parked run: what it waits for a decision about
        report.awaiting = list(control_of(latest).awaiting)
    ident = latest.get("identity") or {}
    report.identity = v.Identity(ident.get("user"), ident.get("thread"), bool(ident.get("principal")))
    report.segments = segments
    report.calls = _fold_calls(records)
    _label(report.calls, report.recoveries)
    report.pending = [dict(p) for p in latest.get("pending") or []]
    report.state = _state(latest)
    engine = latest.get("engine")
    report.engine = engine if isinstance(engine, str) else None
    if report.kind is RunKind.LOOP and not report.kept_from:  # (tool loops are never trimmed)
        report.messages, report.output = _messages(report.run_id, bodies), latest.get("output")
    report.error = latest.get("error")
    report.records = len(records)
    report.forked_from = _lineage(bodies[0])
    report.version = version_of(latest) if report.kind.versioned else None
    report.wake = wake_of(latest) if report.status == "paused" else None
    parent = latest.get("parent")
    report.parent = str(parent["run"]) if isinstance(parent, Mapping) and "run" in parent else None
    report.children = _children(bodies)


def _children(bodies: Sequence[Mapping[str, Any]]) -> list[str]:
    """The child runs the run waited for (its paused checkpoints' ``child`` waits), each once, in order."""
    found: list[str] = []
    for body in bodies:
        wake = body.get("wake")
        if isinstance(wake, Mapping) and wake.get("for") == "child":
            found += [str(r) for r in wake.get("runs", []) if str(r) not in found]
    return found


def _lineage(first: Mapping[str, Any]) -> v.Lineage | None:
    """Where a forked run came from, as its (checked) step 0 says."""
    source = first.get("forked_from")
    if not isinstance(source, Mapping):
        return None
    operator = source.get("operator")
    return v.Lineage(str(source.get("run")), int(source.get("step", 0)), str(operator) if operator else None)
