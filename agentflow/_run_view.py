"""`RunView`: one stored run as a program reads it, whatever its kind (`Runs.status`, `FlowClient.status`).

A view is built from the run read model (`agentflow.exec.run.read.read_run`: every row
checked first) and adds what only the app knows: a flow run's state validated against the
flow version it is on, a tool loop's or an agent's conversation and output as the kind's own
types (`RunDriver.typed`). Where the app lacks the run's flow, flow version or loop, the view
keeps the stored JSON (and says a version is missing: `needs_migration`).

Every kind gives the same fields: what it is (`kind`, `name`), where it stands (`status`,
`step`, `running_on`), what it waits for (`waiting`: one `Waiting`), what it holds (`state`, or
`messages`), what it produced (`output`, once done), and who held and decided it (`segments`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from agentflow._errors import CheckpointStoreCorrupt, FlowError
from agentflow._run_types import DEFAULT_VERSION, RunKind, RunStatus
from agentflow.exec import ApprovalRequest
from agentflow.exec.run.view import CallView, RunReport, SegmentView, Waiting

if TYPE_CHECKING:
    from agentflow.runs import Runs

__all__ = ["RunView", "view_of"]

#: What a run is, as a view says it.
ViewKind = Literal["flow", "loop", "agent"]
#: The statuses of a run that stopped moving on its own (besides one waiting for a decision).
_SETTLED = (RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.PAUSED)


@dataclass
class RunView:
    """A run as its latest checkpoint shows it: the same fields for a flow run, a tool loop and an agent run."""

    run_id: str
    flow: str
    """Its stored column: the flow's name, or ``loop:<name>`` for a tool loop or an agent (see `name`)."""
    status: str
    """``running``, ``paused``, ``done``, ``failed`` or ``cancelled``."""
    step: int
    state: BaseModel | dict[str, Any]
    """A flow run's state at the latest checkpoint, validated against its flow version's model (the stored
    JSON when the app lacks that version: see `needs_migration`). A tool loop's or an agent's: where it
    stands (``stage``, ``turn``, ``model_calls``, ``max_steps``, ``messages``: how many); see `messages`."""
    pending: list[ApprovalRequest] = field(default_factory=list)
    """The calls waiting for an approval (a paused run)."""
    error: str | None = None
    """Why it failed (or who cancelled it, and why)."""
    running_on: str | None = None
    """The worker that holds the run's lease right now (``<name>@<host>:<pid>``), or None."""
    segments: list[SegmentView] = field(default_factory=list)
    """Who held the run when, and who decided each claim (`SegmentView.owner`, `.operator`)."""
    version: str | None = DEFAULT_VERSION
    """The version of the flow a flow run is on (None: a tool loop or an agent, which have none)."""
    needs_migration: bool = False
    """The app lacks the flow run's version (then `state` is the stored JSON, a dict): a worker with that
    version can carry it on, else `FlowClient.migrate` moves it to one that is deployed."""
    in_doubt: list[CallView] = field(default_factory=list)
    """The calls in doubt, each with its id, tool, arguments and the worker it started on: what a
    decision (`decide_in_doubt`, per call id) is made of."""
    kind: ViewKind = "flow"
    """``flow``, ``loop`` (a tool loop) or ``agent`` (an agent framework's agent, see `engine`)."""
    name: str = ""
    """The flow's, the tool loop's or the agent's name."""
    engine: str | None = None
    """The framework that drives an agent run (``pydantic-ai``), else None."""
    waiting: Waiting | None = None
    """What the run waits for now that it stopped moving (a decision on calls in doubt, an approval, a
    timer, child runs, its store's durability), whatever its kind; None while it moves or once it ended."""
    messages: list[Any] = field(default_factory=list)
    """A tool loop's or an agent's whole conversation (`agentflow.models.Message`s, or the framework's
    messages; the stored JSON when the app lacks the loop); empty for a flow run."""
    output: Any = None
    """What the run produced, once it is done: a flow run's final state, a tool loop's last answer (its
    text), an agent's output (of its output type where the app has the agent); None until then."""

    @property
    def waiting_for_decision(self) -> str | None:
        """The calls in doubt a parked run waits for a decision about, as ``tool: why; tool: why`` (else None)."""
        if self.waiting is None or self.waiting.what != "decision":
            return None
        return "; ".join(f"{call.tool}: {call.why}" for call in self.waiting.calls)

    @property
    def settled(self) -> bool:
        """Whether the run stopped moving on its own: it ended, is paused, or waits for a decision."""
        return self.status in _SETTLED or self.waiting_for_decision is not None


def view_of(report: RunReport, runs: Runs) -> RunView:
    """The view of a run whose rows all checked (`report`), with what `runs`' app knows of its kind.

    Raises:
        CheckpointStoreCorrupt: the run's rows failed their check, or its signed state, messages or
            pending calls do not fit the flow or loop the app has under its name.
    """
    if report.corrupt:
        raise CheckpointStoreCorrupt("; ".join(report.problems))
    view = RunView(
        report.run_id,
        report.flow,
        report.status,
        report.step,
        report.state,
        error=report.error,
        running_on=report.running_on,
        segments=report.segments,
        version=report.version,
        in_doubt=list(report.in_doubt),
        kind="agent" if report.engine else "loop" if report.kind is RunKind.LOOP else "flow",
        name=report.name,
        engine=report.engine,
        waiting=report.waiting,
    )
    try:
        view.pending = [ApprovalRequest(p["call_id"], p["tool"], p["args"], p["node"]) for p in report.pending]
        if report.kind is RunKind.FLOW:
            _flow_state(view, report, runs)
        else:
            _conversation(view, report, runs)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointStoreCorrupt(
            f"run {report.run_id!r} is signed but does not fit {report.noun} {report.name!r}: {exc}"
        ) from None
    return view


def _flow_state(view: RunView, report: RunReport, runs: Runs) -> None:
    """A flow run's state, validated against its version (kept as JSON when the app lacks the version or the flow)."""
    view.version = report.version or DEFAULT_VERSION
    if report.flow in runs.app.versions:
        flow = runs.app.flow_versions(report.flow).get(view.version)
        view.needs_migration = flow is None
        if flow is not None:
            view.state = flow.state.model_validate(report.state)
    if report.status == RunStatus.DONE:
        view.output = view.state


def _conversation(view: RunView, report: RunReport, runs: Runs) -> None:
    """A loop's or an agent's messages and output as its kind's types (kept as JSON when the app lacks it)."""
    try:
        driver = runs.of(report.flow).protocol.driver
    except FlowError:  # the app has no loop of that name: what is stored, unchecked against a schema
        messages, output = list(report.messages), report.output
    else:
        messages, output = driver.typed(list(report.messages), report.output)
    view.messages = messages
    if report.status == RunStatus.DONE:
        view.output = output
