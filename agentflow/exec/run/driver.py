"""What a kind of run plugs into the run protocol: its state codec and how it drives a step.

`RunProtocol` (in `run.protocol`) owns the sequence every run follows (open, check, claim,
spend a decision, save); a `RunDriver` owns only what differs between flows and loops:
- how its checkpoint body is read and written (`read`, `cursor`, `fields`, `after_save`),
  after `owns` refused a body that is not one of its runs,
- where it stands (`superstep`) and which of the log's calls belong to that point (`seeds`),
- how it runs steps (`drive`) and what it returns (`result`);
- for a kind that can move to another definition (a flow's version), the driver that reads
  its runs onto the new one (`migrating`) and what a move records (`migration_record`);
- the child runs a paused run waits for (`children`: a flow's `Child` nodes), which a
  cancel takes along;
- what its runs cannot do and why (`refused`), how a message names them (`noun`), and a
  new run's id (`fresh_run_id`);
- how a fork copies a checkpoint of one of its runs into a new run (`forked`): a flow its
  state (patched), a loop or an agent its messages;
- what types a stored conversation and output are read as (`typed`).
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from agentflow._errors import CheckpointConflict, FlowError
from agentflow._identity import RunContext
from agentflow._run_types import RunKind, RunStatus
from agentflow.exec.calls.read import CallState, LoggedRecord, analyze
from agentflow.exec.checkpoints import CheckpointStore, SealedCheckpoint
from agentflow.exec.run.cursor import RunCursor, RunOutcome
from agentflow.exec.seal import Sealer

if TYPE_CHECKING:
    from agentflow.exec.run.protocol import RunProtocol
    from agentflow.exec.run.steps import RunSteps

C = TypeVar("C", bound=RunCursor)
R = TypeVar("R", bound=RunOutcome)


class RunDriver(ABC, Generic[C, R]):
    """One kind of run (a flow, a tool loop), as the run protocol sees it."""

    kind: ClassVar[RunKind]
    #: What a checkpoint body names as the engine that writes it (None: the kind's own).
    engine: ClassVar[str | None] = None
    #: What runs of this kind cannot do (``retry``, ``migrate``), and why: the one statement of each reason.
    refused: ClassVar[Mapping[str, str]] = {}
    #: How a message names a run of this kind ("flow run", "tool loop", "pydantic-ai agent").
    noun: ClassVar[str] = "run"
    #: How a new run id of this kind starts (``run-``, ``loop-``, ``agent-``).
    id_prefix: ClassVar[str] = "run-"

    def refusal(self, run_id: str, action: str) -> FlowError | None:
        """The error refusing `action` (``retry``, ``migrate``) on run `run_id`, when its kind refuses it."""
        why = self.refused.get(action)
        return None if why is None else FlowError(f"run {run_id!r} is a {self.noun}: {why}")

    def fresh_run_id(self) -> str:
        """A new unguessable id for a run of this kind (a fork's, when none is given)."""
        return self.id_prefix + secrets.token_urlsafe(16)

    @property
    @abstractmethod
    def column(self) -> str:
        """The ``flow`` column this driver's runs are stored under."""

    def owns(self, run_id: str, row: SealedCheckpoint, body: Mapping[str, Any]) -> None:
        """Refuse a checked checkpoint that is not one of this driver's runs.

        A run is this driver's when its body says this kind and engine and its row is stored
        under this driver's column: a flow's runs are not a loop's, nor one flow's another's.

        Raises:
            CheckpointConflict: another kind of run's checkpoint, another flow's or loop's,
                or one another engine writes (a pydantic-ai agent's run is not a plain loop's).
        """
        kind, engine = body.get("kind"), body.get("engine")
        if kind == self.kind and engine == self.engine and row.flow == self.column:
            return
        found, wanted = _described(kind, engine, row.flow), _described(self.kind, self.engine, self.column)
        hint = ": act on it through its agent" if engine is not None and self.engine is None else ""
        raise CheckpointConflict(f"run {run_id!r} is {found}, not {wanted}{hint}")

    @abstractmethod
    async def read(
        self, store: CheckpointStore, sealer: Sealer, run_id: str, row: SealedCheckpoint | None
    ) -> tuple[SealedCheckpoint, dict[str, Any]]:
        """Load (unless `row` was read already) and check the run's latest checkpoint.

        Raises:
            CheckpointNotFound: nothing is stored for the run.
            CheckpointStoreCorrupt: a row fails its check.
            CheckpointConflict: the run is another flow's, or another kind of run.
            FlowError: the flow changed since the checkpoint.
        """

    @abstractmethod
    def cursor(self, row: SealedCheckpoint, body: dict[str, Any], ctx: RunContext | None) -> C:
        """Rebuild a cursor from a checked checkpoint (the envelope fields are filled in by the caller).

        Raises:
            CheckpointStoreCorrupt: the body does not fit this kind of run.
        """

    @abstractmethod
    def fields(self, cur: C) -> dict[str, Any]:
        """The kind's own fields of the next checkpoint body (the envelope is added by the protocol)."""

    def after_save(self, cur: C, body: Mapping[str, Any]) -> None:
        """Note what the saved body made durable (a tool loop: its history chain)."""

    @abstractmethod
    def event_fields(self, cur: C) -> dict[str, Any]:
        """What ``checkpoint.saved`` reports besides kind, step and status (``flow``, or ``loop`` and ``stage``)."""

    @abstractmethod
    def superstep(self, cur: C) -> int:
        """The superstep (a tool loop's turn) the cursor stands at."""

    def migrating(self, to_version: str | None, state: Any, at: str | None) -> RunDriver[C, R]:
        """A driver that reads this kind's runs onto version `to_version` (None: the newest), for `migrate`.

        Raises:
            FlowError: this kind has no versions (the default), or the version is not at hand.
        """
        raise FlowError(f"a {self.kind.value} run cannot be migrated")

    async def children(self, steps: RunSteps[C, R], run_id: str) -> list[tuple[RunProtocol[Any, Any], str]]:
        """The child runs the run `run_id` waits for, each with its protocol (a kind without any: none, unread)."""
        return []

    def migration_record(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """What a ``migrate`` claim records of the move from the definition `body` was saved on.

        Raises:
            FlowError: this driver was not made to migrate runs (the default: a kind that cannot).
        """
        raise FlowError(f"a {self.kind.value} run cannot be migrated")

    def forked(self, source: C, run_id: str, identity: dict[str, Any], ctx: RunContext | None, patch: Any) -> C:
        """A new run `run_id` that goes on from `source` (a checkpoint of another run), its state copied.

        The new cursor carries what the source had done (a flow's state, frontier and visits; a
        loop's messages and stage) and nothing of its log or decisions: its calls are new calls.
        `patch` (None: none) changes what is copied, as the kind allows.

        Raises:
            FlowError: `patch` does not fit (or this kind takes none).
        """
        raise FlowError(f"a {self.kind.value} run cannot be forked")

    def typed(self, messages: list[Any], output: Any) -> tuple[list[Any], Any]:
        """A run's stored conversation and output (JSON: `RunReport.messages`, `.output`) as this kind's types.

        A flow run has neither (it keeps its state); a tool loop and an agent say what theirs are.

        Raises:
            ValueError: they do not fit this kind's types.
        """
        return messages, output

    def woken(self, cur: C, wake: Mapping[str, Any]) -> dict[str, Any]:
        """Apply what a due timer decides to the paused cursor; return what to record of it in the ``wake`` claim.

        A plain timer (``for: timer``) decides nothing. An approval's deadline is the
        kind's to settle (a flow decides each pending call by its node's ``on_timeout``).

        Raises:
            FlowError: this kind cannot settle an approval's deadline.
        """
        if wake.get("for") == "approval":
            raise FlowError(f"a {self.kind.value} run has no approval deadlines to settle")
        return {}  # a timer, or a child that ended: the step runs again and finds what it waited for

    def seeds(self, cur: C, records: Sequence[LoggedRecord]) -> dict[str, CallState]:
        """The call states of the step a worker goes on with: what replays, what is in doubt."""
        return analyze(records, self.superstep(cur))

    @abstractmethod
    async def drive(
        self,
        proto: RunSteps[C, R],
        cur: C,
        seeds: Mapping[str, CallState],
        *,
        limit: int | None,
        recovering: bool,
    ) -> R:
        """Run steps from the cursor until the run ends, pauses, or `limit` steps ran.

        Args:
            proto: the protocol the driver saves its checkpoints through.
            cur: the run, held by this worker (claimed, or continued after a clean handoff).
            seeds: the call states of the step being continued (replay and reruns).
            limit: stop after this many steps (the result is then ``running``).
            recovering: the first step continues one a dead worker cut short: it is
                reported with ``run.recovered`` and marked in its checkpoint.
        """

    @abstractmethod
    def result(self, cur: C, status: RunStatus) -> R:
        """The run as it stands, without running anything."""


def _described(kind: Any, engine: Any, column: str) -> str:
    """What a run is, for an error: ``a tool loop named 'refunds'``, ``a run of pydantic-ai agent 'orders'``."""
    name = RunKind.name_of(column)
    if engine is not None:
        return f"a run of {engine} agent {name!r}"
    if kind in tuple(RunKind):
        return f"a {RunKind(kind).noun} named {name!r}"
    return f"a run of unknown kind {kind!r} stored as {column!r}"
