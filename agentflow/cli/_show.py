"""The text of ``agentflow runs show``: history, segments, calls, recoveries, approvals, state.

Every string of the report comes from the store: each is written through `printable` (the
tables and `paint` do it for their cells), so none can break a line or reach the terminal
as a control sequence. The state is JSON, whose strings escape their control characters.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from agentflow._app import FlowApp
from agentflow._display import printable, short, when
from agentflow._hints import decide_hint
from agentflow.cli._text import paint, table
from agentflow.exec.calls.read import started_where
from agentflow.exec.run.markers import Note
from agentflow.exec.run.trim import trimmed_text
from agentflow.exec.run.view import RunReport, StoreWait


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


def other_keys_text(reports: Sequence[RunReport], key_env: str, ours: Sequence[str]) -> str | None:
    """Which key ids the rows of `reports` name that the ring lacks, and which ones the ring holds (None: none).

    The rows' key ids come from the rows (`RunReport.other_keys`); the ring's from the keys
    given: never one named as the other.
    """
    other = [rep for rep in reports if rep.other_keys]
    if not other:
        return None
    kids = ", ".join(sorted({kid for rep in other for kid in rep.other_keys}))
    runs = f"run {other[0].run_id!r} is" if len(other) == 1 else f"{len(other)} runs are"
    return (
        f"{runs} signed with key id {kids}, which ${key_env} does not hold (${key_env} holds key id {', '.join(ours)})"
    )


def check_summary(reports: Sequence[RunReport], key_env: str, ours: Sequence[str]) -> str | None:
    """One line on the runs that fail their check, those signed with another key named (None: all check)."""
    bad = [rep for rep in reports if rep.corrupt]
    if not bad:
        return None
    text = f"{len(bad)} of {len(reports)} run(s) have rows that fail their check"
    other = other_keys_text(bad, key_env, ours)
    if other is not None:
        text += f"; {other}"
        if all(rep.other_keys for rep in reports):
            text += ": give the key the workers sign with"
    return text


def quarantine_text(run_id: str, mark: Note) -> str:
    """What a quarantine marker says: recover_all reported the run, and leaves it alone until it checks."""
    who = printable(str(mark.body.get("owner", "a worker")))
    return (
        f"QUARANTINED {printable(run_id)}: recover_all reported it at {when(mark.at)} ({who}) "
        "and neither enqueues it nor reports it again until its rows check (add the key that signed them to the "
        f"workers' ring) or it is deleted; the marker lapses at {when(mark.expires_at)}"
    )


#: How each segment began, as `runs show` says it.
BEGAN = {
    "start": "started the run",
    "recovery": "claimed it (recovery)",
    "resume": "claimed it (resume)",
    "handoff": "took it over (the next superstep)",
    "decision": "claimed it (a decision on calls in doubt)",
    "parked": "parked it (calls in doubt wait for a decision)",
    "trimmed": "held it (how it began was trimmed by retention)",
}


def _history(report: RunReport) -> list[str]:
    rows = [
        [str(c.step), c.status, str(c.superstep), str(c.segment), when(c.saved_at), c.what, c.by or "-"]
        for c in report.checkpoints
    ]
    trimmed = [f"  {trimmed_text(report.kept_from)}"] if report.kept_from else []
    return (
        _heading("Checkpoints")
        + trimmed
        + _indent(table(["step", "status", "superstep", "segment", "saved", "what", "by"], rows, 1))
    )


def _segments(report: RunReport) -> list[str]:
    lines = _heading("Segments (who held the run)")
    for seg in report.segments:
        began = BEGAN.get(seg.how, printable(seg.how))
        holder = f"held by {printable(seg.owner)}" if seg.owner else "held it"
        line = (
            f"  segment {seg.segment}: {began} at step {seg.first_step}, {holder} to step "
            f"{seg.last_step} ({when(seg.since)} to {when(seg.until)}), {seg.records} call records"
        )
        lines.append(line)
        if seg.operator:
            rerun = f": rerun {printable(', '.join(seg.rerun))}" if seg.rerun else ""
            lines.append(f"    decided by {printable(seg.operator)} at {when(seg.since)}{rerun}")
            for call_id, word, what in seg.settled:
                said = f"result {short(what, 60)}" if word == "happened" else printable(str(what))
                lines.append(f"      {printable(call_id)} {word}: {said}")
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
        who = f"; run by {printable(rec.by)}" if rec.by else ""
        who += f"; decided by {printable(rec.operator)}" if rec.operator else ""
        lines.append(f"  {printable(rec.how)} (checkpoint {rec.step}): replayed {replayed}; rerun {rerun}{who}")
    return lines


def _pending(report: RunReport) -> list[str]:
    if not report.pending:
        return []
    lines = _heading("Waiting for approval")
    for p in report.pending:
        call, tool, node = (printable(str(p.get(k))) for k in ("call_id", "tool", "node"))
        lines.append(f"  {call}: {tool} {short(p.get('args'), 60)} (node {node})")
    run_id = printable(report.run_id)
    return [*lines, f"  decide with: agentflow resume {run_id} --app module:attr --approve|--deny"]


def _rerun_command(report: RunReport, workers: str | None) -> str:
    """How an operator decides the run's calls in doubt, once checked at their systems (`decide_hint`)."""
    return printable(decide_hint(report.run_id, workers=workers))


#: The mark of a run on a flow version the deployment's app lacks.
NEEDS_MIGRATION = "needs migration"


def needs_migration(report: RunReport, app: FlowApp | None) -> bool:
    """Whether `report` is an unfinished flow run on a version `app` lacks (False without an app)."""
    return (
        app is not None
        and report.version is not None
        and report.status in ("running", "paused")
        and report.flow in app.versions
        and not app.has_version(report.flow, report.version)
    )


def _migration(report: RunReport, app: FlowApp) -> list[str]:
    here = ", ".join(app.flow_versions(report.flow).versions)
    run_id, version = printable(report.run_id), printable(report.version or "?")
    return [
        f"{NEEDS_MIGRATION}: version {version} of its flow is not in the app (versions there: {here}); "
        "no worker of this app carries it on",
        f"  move it with: agentflow migrate {run_id} --to VERSION [--state MODULE:FUNCTION] [--at NODE] --app ...",
    ]


def _limit_waits(report: RunReport) -> list[str]:
    """A line per call of the run waiting for a slot of a shared limit (it has not started: nothing is in doubt)."""
    return [
        f"  waiting for limit {printable(wait.limit)} ({printable(wait.why)}) since {when(wait.since)}: "
        f"{printable(wait.tool)} (call {printable(wait.call_id)}), not started yet"
        for wait in report.waiting_for_limit
    ]


def _store_wait(wait: StoreWait) -> list[str]:
    """What a run whose worker stopped on its store's durability waits for (`agentflow.exec.run.store_waits`)."""
    then = (
        f"its worker tries again at {when(wait.retry_at)}"
        if wait.retry_at is not None
        else "its worker's tries are spent: recover_all carries it on unless it waits for a decision"
    )
    return [
        f"waiting for its store's durability since {when(wait.since)} (step {wait.step}): {printable(wait.why)}",
        f"  {then}; nothing that needed the write ran",
    ]


def _now(report: RunReport, workers: str | None = None) -> list[str]:
    """What the run is doing now (`_doing`), after why it waits for its store's durability, if it does."""
    waits = report.waiting_for_store
    return [*(_store_wait(waits) if waits is not None and report.lease is None else []), *_doing(report, workers)]


def _doing(report: RunReport, workers: str | None = None) -> list[str]:
    """What the run is doing now: running on a live worker, waiting for a decision, or stuck on calls in doubt.

    A run on a live worker also says which of its calls wait there for a slot of a shared limit.
    `workers`: the deployment's ``--workers`` when the operator acts through the workers (the
    hints then never name a command that would run a tool here).
    """
    if report.lease is not None:
        owner, until = printable(report.lease.owner), when(report.lease.expires_at)
        return [
            f"running on {owner} until {until} (its lease, renewed while it works): its calls are under way "
            "there, not in doubt; nothing else may act on the run meanwhile",
            *_limit_waits(report),
        ]
    if report.awaiting:
        calls = printable("; ".join(f"{tool} ({why})" for tool, why in report.awaiting))
        return [
            f"waiting for a decision about calls in doubt: {calls}",
            f"  check each at its system, then decide: {_rerun_command(report, workers)}",
        ]
    if report.wake is not None:
        at = when(report.wake["at"])
        if report.wake["for"] == "timer":
            return [f"waiting until {at} (a Wait node): a sweeper wakes it then; nothing is held meanwhile"]
        if report.wake["for"] == "child":
            runs = printable(", ".join(report.wake["runs"]))
            return [f"waiting for its child run(s) {runs} to end: then it goes on (nothing is held meanwhile)"]
        return [f"the approval's deadline is {at}: then each pending call's on_timeout decides it"]
    decided = report.decision
    if decided is not None:
        who = printable(decided.operator or "someone")
        calls = printable(", ".join(decided.rerun)) or "nothing"
        spends = "its resume spends it" if report.status == "paused" else "the next worker to take the run spends it"
        return [f"decided by {who} at {when(decided.since)}: rerun {calls}; {spends}"]
    if report.in_doubt:
        tools = printable(", ".join(call.tool for call in report.in_doubt))
        lines = [f"in doubt: {tools}; check at their system, then: {_rerun_command(report, workers)}"]
        for call in report.in_doubt:
            where = started_where(call.started_on, call.started_at)
            lines.append(printable(f"  {call.tool} (call {call.call_id}) was started{where} and has no result"))
        return lines
    return []


def run_text(report: RunReport, app: FlowApp | None = None, workers: str | None = None) -> str:
    """The whole report of a run whose rows all checked (given the deployment's `app`: whether it needs migration).

    `workers`: the deployment's ``--workers``, when the operator acts through the workers (see `_now`).
    """
    ident = report.identity
    marks = ", ".join(paint(m) for m in [*report.marks, *([NEEDS_MIGRATION] if needs_migration(report, app) else [])])
    run_id, what = printable(report.run_id), printable(f"{report.noun} {report.name}")
    version = "" if report.version is None else f"   version {printable(report.version)}"
    lines = [
        f"run {run_id}   {what}{version}   status {paint(report.status)}   step {report.step}   "
        f"updated {when(report.saved_at)}",
        f"marks: {marks or 'none'}",
    ]
    if app is not None and needs_migration(report, app):
        lines += _migration(report, app)
    if report.forked_from is not None:
        source = report.forked_from
        by = f" by {printable(source.operator)}" if source.operator else ""
        lines.append(f"forked from {printable(source.run_id)} at step {source.step}{by}")
    if report.parent is not None:
        lines.append(f"a child run of {printable(report.parent)}")
    if report.children:
        lines.append(f"child runs: {printable(', '.join(report.children))}")
    if ident is not None:
        principal = "set" if ident.principal else "none"
        user, thread = printable(ident.user or "-"), printable(ident.thread or "-")
        lines.append(f"identity: user {user}, thread {thread}, principal: {principal}")
    if report.error:
        lines.append(f"error: {printable(report.error)}")
    lines += _now(report, workers)
    lines += _history(report) + _segments(report) + _calls(report) + _recoveries(report) + _pending(report)
    lines += _heading(f"State (checkpoint {report.step})")
    lines += _indent(json.dumps(report.state, indent=2, sort_keys=True, default=str))
    return "\n".join(lines)
