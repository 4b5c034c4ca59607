"""The run read model: what a person (or a program) is shown of a stored run.

Every surface reads runs through these records: ``agentflow runs`` and ``agentflow verify``,
the run viewer, `FlowClient.status` and the demo's narrator. `agentflow.exec.run.read`
fills them, and only from rows whose signatures and numbering checked.

Who did what: every checkpoint names the process that saved it (``by``, the lease holder)
and every claim that carried a decision names who decided (``operator``); a run a live
worker holds carries that worker's lease, and then no call of it is "in doubt": its calls
are running on that worker.

A call waiting for a slot of a shared limit has no record in the call log; a live run's
waits come from its event stream (`run.waits`), the one place that says so.

A run with any problem carries its problems and the position of each row, nothing else:
no state, no results, nothing decoded from a payload that failed its check. A principal is
never kept, not even its proof: `Identity.principal` only says whether the run has one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

from agentflow._display import when
from agentflow._run_types import RunKind, RunStatus
from agentflow.exec.checkpoints.records import Lease

#: Call states, as shown.
DONE: Final = "done"
REPLAYED: Final = "replayed"
IN_DOUBT: Final = "in doubt"
PENDING: Final = "pending"
FAILED: Final = "failed"
DENIED: Final = "denied"

#: Marks a run can carry in listings.
RECOVERED: Final = "recovered"
RESUMED: Final = "resumed"
PAUSED: Final = "paused"
CORRUPT: Final = "corrupt"
#: A live worker holds the run's lease: it is running there (its calls are not in doubt).
LIVE: Final = "live"
#: A worker parked the run on calls in doubt: it waits for an operator's decision.
WAITING: Final = "waiting for a decision"

#: The filter of a listing for the runs waiting for a decision (`WAITING`).
DECISION: Final = "decision"

#: What a listing can be filtered by: a run's status, ``decision`` (the runs waiting for a decision on
#: calls in doubt) or ``corrupt`` (the runs that failed their check).
STATUSES: Final = (*(str(s) for s in RunStatus), DECISION, CORRUPT)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a run acts for, without its credential."""

    user: str | None
    """The end user, if the run was started with one."""
    thread: str | None
    """The conversation thread, if any."""
    principal: bool
    """Whether the run acts for a principal (a credential); the credential is never stored."""


@dataclass(frozen=True, slots=True)
class CheckpointView:
    """One checkpoint row and whether it checked."""

    step: int
    """Its position in the run's history."""
    saved_at: float
    """When it was saved (seconds since the epoch; 0 when `problem` is set)."""
    status: str
    """``running``, ``paused``, ``done`` or ``failed`` (empty when `problem` is set)."""
    segment: int
    """The segment of the worker that saved it: the step at which that worker claimed the run."""
    superstep: int | None = None
    """Supersteps done (a tool loop's turn), from the checked body."""
    what: str = ""
    """``start``, ``superstep``, ``claim (<cause>)``, ``paused``, ``done`` or ``failed``."""
    problem: str | None = None
    """Why the row failed its check (then nothing else of it is shown)."""
    by: str | None = None
    """Who saved it: the lease holder's name (``<name>@<host>:<pid>``); None on rows older than leases."""
    operator: str | None = None
    """Who decided, on a claim that carries a decision (a resume, a rerun of calls in doubt)."""


@dataclass(frozen=True, slots=True)
class SegmentView:
    """One segment of a run: from its start or a claim up to the next claim.

    Distributed workers that hand a run over cleanly share a segment (no claim is made).
    """

    segment: int
    """Its number: the step at which the worker claimed the run (0: the worker that started it)."""
    how: str
    """Why it began: ``start``, or its claim's cause (``recovery``, ``resume``, ``handoff``, ``decision``, ...)."""
    first_step: int
    """The step of the claim (or 0)."""
    last_step: int
    """The last checkpoint saved in it."""
    since: float
    """When its first checkpoint was saved."""
    until: float
    """When its last checkpoint was saved."""
    records: int
    """How many call records it wrote."""
    owner: str | None = None
    """Who held it: the ``by`` of its first checkpoint (None on rows older than leases)."""
    operator: str | None = None
    """Who decided, when its claim carries a decision (at `since`)."""
    rerun: tuple[str, ...] = ()
    """The calls in doubt its claim's operator decided to run again."""
    awaiting: tuple[tuple[str, str], ...] = ()
    """The calls in doubt its claim parked the run on: ``(tool, why)``."""
    settled: tuple[tuple[str, str, Any], ...] = ()
    """The calls in doubt its claim's operator settled without a rerun: ``(call_id, word, what)``, the
    word ``happened`` with the result supplied, or ``did not happen`` with why."""


@dataclass(slots=True)
class CallView:
    """One tool call, folded from its records."""

    call_id: str
    """The call's identity: ``superstep/node/ordinal/argument digest``."""
    tool: str
    """The tool it calls."""
    node: str
    """The node (or loop stage) that made it."""
    superstep: int
    """The superstep it belongs to."""
    kind: str
    """The kind of its deciding record: ``started``, ``pending``, ``done``, ``failed``, ..."""
    args: Any = None
    """Its arguments, as logged."""
    segments: list[int] = field(default_factory=list)
    """The segments that wrote its records."""
    result: Any = None
    """Its stored result (``done``)."""
    error: str | None = None
    """Why it failed, was denied, or could not be stored."""
    state: str = ""
    """As shown: ``done``, ``replayed``, ``in doubt``, ``pending``, ``failed`` or ``denied``."""
    note: str = ""
    """More about the state (``rerun after recovery``, ...)."""
    supplied_by: str | None = None
    """The operator whose decision gave its outcome (`Happened`, `DidNotHappen`), if one did."""
    started_on: str | None = None
    """Who logged its latest ``started`` (the worker it ran on), if the record says."""
    started_at: float | None = None
    """When, if the record says."""


@dataclass(frozen=True, slots=True)
class Recovery:
    """What the first checkpoint after a claim says was replayed and rerun."""

    step: int
    """The checkpoint that records it."""
    how: str
    """The claim's cause: ``recovery``, ``resume``, ``handoff`` or ``decision``."""
    replayed: list[str]
    """Calls whose stored results were used instead of running the tool."""
    rerun: list[str]
    """Calls in doubt that ran again."""
    by: str | None = None
    """Who ran the step (the segment's owner)."""
    operator: str | None = None
    """Who decided the claim it ran under, if it carried a decision."""


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where a forked run started: a checkpoint of another run (signed into the fork's step 0)."""

    run_id: str
    """The run it was forked from."""
    step: int
    """The checkpoint of that run it started from."""
    operator: str | None = None
    """Who forked it."""


@dataclass(frozen=True, slots=True)
class LimitWait:
    """A call of a live run waiting for a slot of a shared limit (from the run's event stream)."""

    call_id: str
    """The waiting call's identity (it has no record in the call log yet)."""
    tool: str
    """The tool it calls, or ``model <provider>`` for a tool loop's model call."""
    limit: str
    """The limit it waits for."""
    why: str
    """``concurrency`` (every slot is held), ``rate`` (the window is full) or ``closed`` (a 429's back-off)."""
    since: float
    """When the wait began (seconds since the epoch, the waiting worker's clock)."""


@dataclass(frozen=True, slots=True)
class StoreWait:
    """A run whose worker stopped because its store could not confirm a write as durable (`run.store_waits`)."""

    step: int
    """The step the superstep that stopped started from."""
    why: str
    """The store's message (`StoreNotDurable`): what was not acknowledged, and the setting."""
    since: float
    """When the worker stopped (seconds since the epoch, its clock)."""
    retry_at: float | None
    """When its task is tried again (None: its tries are spent, the next recover_all carries it on)."""


@dataclass(frozen=True, slots=True)
class WaitingCall:
    """A call a run waits on a person about: one in doubt (a decision), or one waiting for an approval."""

    call_id: str
    """The call's identity (what a decision or an approval names it by)."""
    tool: str
    """The tool it calls."""
    args: Any
    """Its arguments, as logged."""
    why: str
    """Why it waits: why a call in doubt may not run again on its own, or ``needs approval``."""


#: Why a call waiting for an approval waits (`WaitingCall.why`).
NEEDS_APPROVAL: Final = "needs approval"

#: What a run can wait for (`Waiting.what`).
WaitingFor = Literal["decision", "approval", "timer", "child", "durability"]


@dataclass(frozen=True, slots=True)
class Waiting:
    """What a run that stopped moving waits for, whatever its kind (`RunReport.waiting`)."""

    what: WaitingFor
    """``decision``: calls in doubt, on which a person says what happened (`decide_in_doubt`);
    ``approval``: calls a person allows or denies (`resume`); ``timer``: a time (nothing is held
    meanwhile); ``child``: child runs to end; ``durability``: its store to confirm writes as durable."""
    calls: tuple[WaitingCall, ...] = ()
    """The calls in doubt (``decision``) or waiting for approval (``approval``)."""
    until: float | None = None
    """When it moves on by itself (seconds since the epoch): the timer's time, an approval's deadline,
    the next look at child runs, the next try of a write; None: only a person moves it."""
    runs: tuple[str, ...] = ()
    """The child runs it waits for (``child``)."""

    @property
    def why(self) -> str:
        """The wait in one line, for a person."""
        calls = "; ".join(f"{c.tool} ({c.why})" for c in self.calls)
        due = f" (until {when(self.until)})" if self.until is not None else ""
        said = {
            "decision": f"a decision on calls in doubt: {calls}",
            "approval": f"an approval of {calls}{due}",
            "timer": f"its timer{due}",
            "child": f"its child run(s) {', '.join(self.runs)} to end",
            "durability": f"its store to confirm a write as durable{due}",
        }
        return said[self.what]


@dataclass(slots=True)
class RunReport:
    """Everything shown about one run."""

    run_id: str
    """The run's id."""
    flow: str
    """Its stored ``flow`` column: the flow's name, or ``loop:<name>`` for a tool loop."""
    kind: RunKind
    """Whether a flow or a tool loop drives it (see `name` for its name without the column's prefix)."""
    status: str
    """The status of its latest checkpoint."""
    step: int
    """Its latest step."""
    saved_at: float
    """When its latest checkpoint was saved."""
    problems: list[str] = field(default_factory=list)
    """Every row that failed its check, by name; a run with problems shows no data."""
    checkpoints: list[CheckpointView] = field(default_factory=list)
    """Its history, oldest first."""
    segments: list[SegmentView] = field(default_factory=list)
    """Who held the run when."""
    calls: list[CallView] = field(default_factory=list)
    """Its tool calls in log order."""
    recoveries: list[Recovery] = field(default_factory=list)
    """Each recovery and resume, with what it replayed and reran."""
    pending: list[dict[str, Any]] = field(default_factory=list)
    """Calls waiting for approval (a paused run), as stored: call_id, tool, args, node."""
    identity: Identity | None = None
    """Who it acts for."""
    state: Any = None
    """The state at the latest checkpoint, as stored (a tool loop: its stage and sizes)."""
    error: str | None = None
    """Why it failed."""
    records: int = 0
    """How many call records it has."""
    lease: Lease | None = None
    """The live lease on the run when it was read: a worker is running it (None: nobody holds it)."""
    awaiting: list[tuple[str, str]] = field(default_factory=list)
    """``(tool, why)`` of the calls in doubt a parked run waits for a decision about (its latest claim)."""
    forked_from: Lineage | None = None
    """The run and checkpoint this run was forked from (None: it was started afresh)."""
    version: str | None = None
    """The version of the flow the run is on (None: a tool loop, or a run whose rows did not all check)."""
    parent: str | None = None
    """The parent run that started this one as a child (its signed lineage; None: no parent)."""
    children: list[str] = field(default_factory=list)
    """The child runs this run waited for (a `Child` node's), in order."""
    wake: dict[str, Any] | None = None
    """A paused run's signed timer: ``{"at": seconds since the epoch, "for": "timer" or "approval"}``."""
    waiting_for_limit: list[LimitWait] = field(default_factory=list)
    """The calls of a run a live worker holds that wait for a slot of a shared limit, oldest wait first
    (read from the run's event stream, if the store keeps one; empty for a run nobody holds)."""
    waiting_for_store: StoreWait | None = None
    """Why the run waits for its store to confirm writes as durable, when its last superstep stopped on that."""
    kept_from: int = 0
    """The step its stored history starts at: 0, or the step of the ended checkpoint a retention trim kept
    (the checkpoints before it were deleted; its call records all stay). See `agentflow.exec.run.trim`."""
    other_keys: list[str] = field(default_factory=list)
    """The key ids its checkpoint rows name that no key of the ring holds (`SealedCheckpoint.kid`, as the
    rows carry them): the run was signed with another key. Empty for a run whose keys are all known."""
    engine: str | None = None
    """The agent framework that drives it (``pydantic-ai`` for a durable agent's run), as its checkpoints
    say; None for a flow run or a plain tool loop."""
    messages: list[Any] = field(default_factory=list)
    """A tool loop's or an agent's whole conversation up to its latest checkpoint, as stored (JSON, in the
    engine's own shape); empty for a flow run."""
    output: Any = None
    """An agent run's output as its ended checkpoint stores it (JSON), else None."""

    @property
    def name(self) -> str:
        """The flow's, the tool loop's or the agent's own name."""
        return RunKind.name_of(self.flow)

    @property
    def noun(self) -> str:
        """What the run is, for a person: ``flow``, ``tool loop`` or ``<engine> agent``."""
        return f"{self.engine} agent" if self.engine else self.kind.noun

    @property
    def waiting(self) -> Waiting | None:
        """What the run waits for now that it stopped moving; None while it moves, or once it ended.

        A run a live worker holds waits for nothing here: it is running there.
        """
        if self.corrupt or self.lease is not None:
            return None
        if self.status == RunStatus.RUNNING:
            if self.awaiting:
                return Waiting("decision", self._in_doubt_calls())
            if self.waiting_for_store is not None:
                return Waiting("durability", until=self.waiting_for_store.retry_at)
            return None
        if self.status != RunStatus.PAUSED:
            return None
        wake = self.wake or {}
        at = wake.get("at")
        if self.pending:
            calls = tuple(
                WaitingCall(str(p["call_id"]), str(p["tool"]), p.get("args"), NEEDS_APPROVAL) for p in self.pending
            )
            return Waiting("approval", calls, at if wake.get("for") == "approval" else None)
        if wake.get("for") == "child":
            return Waiting("child", until=at, runs=tuple(wake.get("runs", ())))
        return Waiting("timer", until=at) if wake.get("for") == "timer" else None

    def _in_doubt_calls(self) -> tuple[WaitingCall, ...]:
        """The calls a parked run waits for a decision on: each call in doubt, with why its claim parked it.

        The parked claim names ``(tool, why)`` pairs in the order the calls are in the log; a call
        in doubt takes the next reason given for its tool.
        """
        reasons: dict[str, list[str]] = {}
        for tool, why in self.awaiting:
            reasons.setdefault(tool, []).append(why)
        calls = []
        for call in self.in_doubt:
            given = reasons.get(call.tool) or [call.note]
            calls.append(WaitingCall(call.call_id, call.tool, call.args, given.pop(0)))
        return tuple(calls) or tuple(WaitingCall("", tool, None, why) for tool, why in self.awaiting)

    @property
    def corrupt(self) -> bool:
        """Whether any row failed its check."""
        return bool(self.problems)

    @property
    def running_on(self) -> str | None:
        """Who holds the run's lease (it is running there), or None."""
        return self.lease.owner if self.lease is not None else None

    @property
    def in_doubt(self) -> list[CallView]:
        """Calls in doubt in the superstep an unfinished run is at; none while a live worker holds the run.

        A call logged as started with no result is in doubt only when its worker is gone:
        while the run's lease is live, the call is running on that worker. A paused run's
        step may hold one too (it paused on an approval before the call could run again):
        it is decided like a running run's, and the run stays paused.
        """
        unfinished = self.status in (RunStatus.RUNNING, RunStatus.PAUSED)
        if self.corrupt or not unfinished or not self.checkpoints or self.lease is not None:
            return []
        current = self.checkpoints[-1].superstep
        return [c for c in self.calls if c.state == IN_DOUBT and c.superstep == current]

    @property
    def decision(self) -> SegmentView | None:
        """The latest segment if its claim is an operator's decision not spent yet.

        A running run waits for a worker to spend it; a paused one for its resume (or its timer).
        """
        if self.corrupt or self.status not in (RunStatus.RUNNING, RunStatus.PAUSED) or not self.segments:
            return None
        last = self.segments[-1]
        return last if last.how == "decision" and last.first_step == self.step else None

    @property
    def marks(self) -> list[str]:
        """The marks a listing shows: corrupt, recovered, resumed, live, in doubt, waiting for a decision, paused."""
        if self.corrupt:
            return [CORRUPT]
        hows = {s.how for s in self.segments}
        marks = [m for m, how in ((RECOVERED, "recovery"), (RESUMED, "resume")) if how in hows]
        if self.lease is not None:
            marks.append(LIVE)
        if self.in_doubt:
            marks.append(IN_DOUBT)
        if self.awaiting and self.lease is None:
            marks.append(WAITING)
        if self.status == PAUSED:
            marks.append(PAUSED)
        return marks

    def has_status(self, status: str | None) -> bool:
        """Whether the run passes a status filter (None: every run; ``corrupt``: the runs that failed their check)."""
        if status is None:
            return True
        if status == CORRUPT:
            return self.corrupt
        if status == DECISION:
            return WAITING in self.marks
        return not self.corrupt and self.status == status


@dataclass(frozen=True, slots=True)
class RunHead:
    """One run as a listing shows it: its latest checkpoint, checked, and nothing older.

    Its fields in clear (flow, status, step, time, segment) are the ones the checkpoint's
    signature covers; a head that fails its check carries only its id and the problem. A
    head says nothing about older rows or the call log: `read_run` checks those.
    """

    run_id: str
    """The run's id (as listed)."""
    flow: str
    """Its stored ``flow`` column (empty when `problem` is set)."""
    status: str
    """The status of its latest checkpoint (empty when `problem` is set)."""
    step: int
    """Its latest step."""
    saved_at: float
    """When its latest checkpoint was saved (0 when `problem` is set)."""
    segment: int
    """The step at which the worker holding it claimed it (0: never claimed; -1 when `problem` is set)."""
    problem: str | None = None
    """Why the latest checkpoint failed its check."""
    lease: Lease | None = None
    """The live lease on the run when it was listed (a worker is running it), or None."""
    other_key: str | None = None
    """The key id the latest checkpoint names when no key of the ring holds it (`SealedCheckpoint.kid`):
    the run was signed with another key."""
    waiting: bool = False
    """Whether a worker parked the run on calls in doubt: it waits for a person's decision (its latest
    checkpoint, checked, says so)."""

    @property
    def kind(self) -> RunKind:
        """Whether a flow or a tool loop drives it."""
        return RunKind.of(self.flow)

    @property
    def corrupt(self) -> bool:
        """Whether the latest checkpoint failed its check."""
        return self.problem is not None

    @property
    def running_on(self) -> str | None:
        """Who holds the run's lease (it is running there), or None."""
        return self.lease.owner if self.lease is not None else None

    @property
    def claimed(self) -> bool:
        """Whether a worker claimed the run after its start (a recovery or a resume; `read_run` says which)."""
        return not self.corrupt and self.segment > 0

    def has_status(self, status: str | None) -> bool:
        """Whether the run passes a status filter (None: every run; ``corrupt``: the heads that failed)."""
        if status is None:
            return True
        if status == CORRUPT:
            return self.corrupt
        if status == DECISION:
            return self.waiting
        return not self.corrupt and self.status == status
