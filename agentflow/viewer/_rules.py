"""Which action fits which run, and why not: the run page and the POST read the same rules.

A rule has two parts. `Rule.fits` looks at the run's state alone (a failed run can be
retried, a paused one approved): an action that does not fit is not shown, and a POST of
it is a 409. `Rule.refusal` says why an action that fits cannot be taken here (no app, a
tool loop, a principal the viewer does not hold, a live holder): the page shows it
disabled with that reason, and a POST is a 409 with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from agentflow._errors import FlowError, RunHeld
from agentflow._run_types import RunStatus
from agentflow.exec.run.view import RunReport
from agentflow.viewer._settings import Viewer

#: The title of the answer to an action on a run a live worker holds.
HELD_TITLE: Final = "The run is held by a live worker"
#: What a corrupt run is told, whatever was asked.
CORRUPT: Final = "a run whose rows fail their check is not acted on here"


def needs_migration_text(report: RunReport, versions: list[str]) -> str:
    """Why nothing is done here to a run on a flow version the viewer's app lacks, and what to do instead."""
    return (
        f"the run is on version {report.version} of flow {report.flow!r}, which the viewer's app does not have "
        f"(it has {', '.join(versions)}): it needs migration (agentflow migrate {report.run_id} --to VERSION), "
        "or a process with that version"
    )


def held_text(report: RunReport) -> str | None:
    """Who holds the run and until when, if a live worker does."""
    lease = report.lease
    return str(RunHeld(report.run_id, lease.owner, lease.expires_at)) if lease is not None else None


@dataclass(frozen=True)
class Rule:
    """When one action fits a run, and what else may refuse it."""

    name: str
    """The action: its path segment (``/runs/{run_id}/{name}``) and its CSRF purpose."""
    verb: str
    """What it does, for messages ("Cannot cancel this run")."""
    fits: Callable[[RunReport], str | None]
    """None when the run's state fits the action; else why not (the page does not show it)."""
    principal_why: str | None
    """Why a run acting for a principal cannot get it here (None: it can; the action needs no principal)."""
    held_blocks: bool = True
    """Whether a live holder refuses it (else the action goes to the run's store and holder as it is)."""

    def refusal(self, viewer: Viewer, report: RunReport) -> str | None:
        """Why this action, which fits `report`, cannot be taken from here (None: it can)."""
        held = held_text(report) if self.held_blocks else None
        if held is not None:
            return held
        flows, runs = viewer.flows, viewer.runs
        if flows is None or runs is None:
            return "start the viewer with --app module:attr (or --workers module:attr) to act on runs from here"
        try:  # a flow run or a tool loop: the app's own runs of that name take the action, or say why not
            refused = runs.of(report.flow).refuses(self.name)
        except FlowError as exc:
            return f"the app given to the viewer cannot act on it: {exc}"
        if refused is not None:
            return refused
        if report.version is not None and not flows.has_version(report.flow, report.version):
            return needs_migration_text(report, flows.flow_versions(report.flow).versions)
        if self.principal_why is not None and report.identity is not None and report.identity.principal:
            return self.principal_why
        return None


def _paused(report: RunReport) -> str | None:
    ok = not report.corrupt and report.status == RunStatus.PAUSED
    return None if ok else "only a paused run whose rows all check can be resumed"


def _unfinished(report: RunReport) -> str | None:
    if report.corrupt:
        return CORRUPT
    if report.status in (RunStatus.RUNNING, RunStatus.PAUSED):
        return None
    return f"only a running, paused or stranded run can be cancelled; this one is {report.status}"


def _failed(report: RunReport) -> str | None:
    if report.corrupt:
        return CORRUPT
    return (
        None if report.status == RunStatus.FAILED else f"only a failed run can be retried; this one is {report.status}"
    )


def _in_doubt(report: RunReport) -> str | None:
    if report.corrupt:
        return CORRUPT
    if report.in_doubt and report.decision is None:
        return None
    return "only a run with calls in doubt, held by nobody and not decided yet, waits for this decision"


def _any(report: RunReport) -> str | None:
    return CORRUPT if report.corrupt else None


def _principal(what: str) -> str:
    return f"this run acts for a principal, which the viewer does not hold: {what} it from the application"


RESUME: Final = Rule("resume", "resume", _paused, _principal("resume"))
CANCEL: Final = Rule("cancel", "cancel", _unfinished, None, held_blocks=False)
RETRY: Final = Rule("retry", "retry", _failed, _principal("retry"))
DECIDE: Final = Rule("decide", "decide the calls in doubt of", _in_doubt, _principal("decide and recover"))
FORK: Final = Rule("fork", "fork", _any, _principal("fork"), held_blocks=False)
