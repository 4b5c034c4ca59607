"""The text of ``agentflow runs show``: history, segments, calls, recoveries, approvals, state.

Every string of the report comes from the store: each is written through `printable` (the
tables and `paint` do it for their cells), so none can break a line or reach the terminal
as a control sequence. The state is JSON, whose strings escape their control characters.
"""

from __future__ import annotations

import json

from agentflow._display import printable, short, when
from agentflow._run_types import RunKind
from agentflow.cli._text import paint, table
from agentflow.exec._run_view import RunReport


def _heading(title: str) -> list[str]:
    return ["", title]


def _indent(block: str) -> list[str]:
    return ["  " + line for line in block.splitlines()]


def corrupt_text(report: RunReport) -> str:
    """A run with rows that failed their check: the problems and each row's result, no data."""
    lines = [
        f"run {printable(report.run_id)}   {paint('CORRUPT')}: rows failed their check; nothing of this run is shown"
    ]
    lines += _heading("Problems")
    lines += [f"  - {printable(problem)}" for problem in report.problems]
    lines += _heading("Checkpoints")
    rows = [[str(c.step), "CORRUPT" if c.problem else "checks"] for c in report.checkpoints]
    lines += _indent(table(["step", "check"], rows, colour=1))
    return "\n".join(lines)


def _history(report: RunReport) -> list[str]:
    rows = [
        [str(c.step), c.status, str(c.superstep), str(c.segment), when(c.saved_at), c.what] for c in report.checkpoints
    ]
    return _heading("Checkpoints") + _indent(
        table(["step", "status", "superstep", "segment", "saved", "what"], rows, 1)
    )


def _segments(report: RunReport) -> list[str]:
    lines = _heading("Segments (who held the run)")
    for seg in report.segments:
        how = {
            "start": "started the run",
            "recovery": "claimed it (recovery)",
            "resume": "claimed it (resume)",
            "handoff": "took it over (the next superstep)",
        }
        began = how.get(seg.how, printable(seg.how))
        lines.append(
            f"  segment {seg.segment}: {began} at step {seg.first_step}, held it to step "
            f"{seg.last_step} ({when(seg.since)} to {when(seg.until)}), {seg.records} call records"
        )
    return lines


def _calls(report: RunReport) -> list[str]:
    if not report.calls:
        return [*_heading("Calls"), "  none"]
    rows = []
    for call in report.calls:
        outcome = short(call.result, 40) if call.kind == "done" else short(call.error or "", 40)
        segments = ",".join(str(s) for s in call.segments)
        rows.append([call.call_id, call.tool, call.node, call.state, segments, outcome, call.note])
    return _heading("Calls") + _indent(table(["call", "tool", "node", "state", "segment", "outcome", "note"], rows, 3))


def _recoveries(report: RunReport) -> list[str]:
    if not report.recoveries:
        return []
    lines = _heading("Recovered")
    for rec in report.recoveries:
        replayed = printable(", ".join(rec.replayed)) or "nothing"
        rerun = printable(", ".join(rec.rerun)) or "nothing"
        lines.append(f"  {printable(rec.how)} (checkpoint {rec.step}): replayed {replayed}; rerun {rerun}")
    return lines


def _pending(report: RunReport) -> list[str]:
    if not report.pending:
        return []
    lines = _heading("Waiting for approval")
    for p in report.pending:
        call, tool, node = (printable(str(p.get(k))) for k in ("call_id", "tool", "node"))
        lines.append(f"  {call}: {tool} {short(p.get('args'), 60)} (node {node})")
    run_id = printable(report.run_id)
    if report.kind is RunKind.LOOP:
        return [
            *lines,
            f"  decide with: run_tool_loop(..., run_id={printable(repr(report.run_id))}, approve=True or False)",
        ]
    return [*lines, f"  decide with: agentflow resume {run_id} --app module:attr --approve|--deny"]


def run_text(report: RunReport) -> str:
    """The whole report of a run whose rows all checked."""
    ident = report.identity
    marks = ", ".join(paint(m) for m in report.marks) or "none"
    run_id, flow = printable(report.run_id), printable(report.flow)
    lines = [
        f"run {run_id}   flow {flow}   status {paint(report.status)}   step {report.step}   "
        f"updated {when(report.saved_at)}",
        f"marks: {marks}",
    ]
    if ident is not None:
        principal = "set" if ident.principal else "none"
        user, thread = printable(ident.user or "-"), printable(ident.thread or "-")
        lines.append(f"identity: user {user}, thread {thread}, principal: {principal}")
    if report.error:
        lines.append(f"error: {printable(report.error)}")
    if report.in_doubt:
        tools = printable(", ".join(call.tool for call in report.in_doubt))
        then = f"agentflow recover {printable(report.flow)} --app ... --rerun-in-doubt"
        if report.kind is RunKind.LOOP:
            then = f"recover_tool_loop(..., run_id={printable(repr(report.run_id))}, rerun_in_doubt=True)"
        lines.append(f"in doubt: {tools}; check at their system, then: {then}")
    lines += _history(report) + _segments(report) + _calls(report) + _recoveries(report) + _pending(report)
    lines += _heading(f"State (checkpoint {report.step})")
    lines += _indent(json.dumps(report.state, indent=2, sort_keys=True, default=str))
    return "\n".join(lines)
