"""`Operator`: what a person does to one stored run, in this process or through the workers.

Every surface an operator works from (the CLI's acting commands, the viewer's buttons,
a script) acts through one of two operators, and never asks what kind of run it acts on
(a flow run or a tool loop: `agentflow.runs` decides that, once, from the run's checked
newest row):

- `InProcess` acts here, with the app's flows, loops and tools over the store, holding the
  run's lease as ``<name>@<host>:<pid>``: what follows an action (the approved calls, the
  retried superstep, the forked run) runs in this process, to the run's end or next pause.
- `ThroughWorkers` saves the same signed decisions here and sends a message that only
  points at them; a worker spends each one and runs the tools (`agentflow.celery.FlowClient`).

Both sign the operator's name into every decision and refuse what the run protocol refuses
(`RunHeld`, `CheckpointConflict`, `RecoveryNeedsDecision`, `FlowError` for what a kind of
run cannot do), with the run left as it was. An `Acted` says where the run stands afterwards
as this process saw it: through the workers, the run is usually still ``running`` (a worker
carries it on): `Operator.settle` waits for it.

Reading a run is the same through both: `status`, `settle` and `result` read the store
(`agentflow.runs.Runs`), whatever the run's kind and wherever it moves.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentflow.exec import ApprovalRequest
from agentflow.exec.run.control import InDoubtDecision
from agentflow.exec.run.cursor import RunOutcome
from agentflow.runs import Runs, RunView

__all__ = ["Acted", "Operator"]


@dataclass(frozen=True)
class Acted:
    """Where a run stands after an operator's action, as the acting process saw it."""

    run_id: str
    """The run acted on (for `Operator.fork`, the new run)."""
    status: str
    """Its status then: ``running`` when a worker carries it on, or where this process left it."""
    step: int | None
    """The step of its newest checkpoint then (the decision's own step through the workers)."""
    error: str | None = None
    """Why it failed, when it ended ``failed``."""
    pending: tuple[ApprovalRequest, ...] = ()
    """The calls it waits for approval of, when this process left it ``paused``."""

    @classmethod
    def of(cls, outcome: RunOutcome) -> Acted:
        """What a run's outcome says of it."""
        return cls(outcome.run_id, str(outcome.status), outcome.step, outcome.error, tuple(outcome.pending))


class Operator(ABC):
    """Acts on stored runs of any kind; every decision is signed with `operator` (None: the acting process)."""

    #: Whether the tools run elsewhere (on the workers) rather than in this process.
    distributed = False
    #: The runs it acts on, each's operations picked by its kind (`agentflow.runs`): what the
    #: surfaces ask whether an action fits a run before they offer it.
    runs: Runs

    @abstractmethod
    async def resume(
        self, run_id: str, *, approve: bool | Mapping[str, bool], note: str | None = None, operator: str | None = None
    ) -> Acted:
        """Approve or deny a paused run's pending calls (one word for all, or one per call id), and go on.

        Raises:
            CheckpointConflict: the run is not paused, or another decision won.
            ValueError: `approve` is a mapping that leaves a pending call undecided.
        """

    @abstractmethod
    async def cancel(self, run_id: str, *, reason: str, operator: str | None = None) -> Acted:
        """Cancel a run: ``cancelled`` at once, or ``running`` while its live holder is asked to stop.

        Raises:
            CheckpointConflict: the run already ended.
            ValueError: `reason` is empty.
        """

    @abstractmethod
    async def retry(self, run_id: str, *, operator: str | None = None) -> Acted:
        """Run a failed run again from the superstep that failed.

        Raises:
            CheckpointConflict: the run did not fail (`RunHeld`: a live worker holds it).
            RecoveryNeedsDecision: a call of that superstep is in doubt and may not rerun.
            FlowError: the run is a tool loop (a loop fails only at its step budget).
        """

    @abstractmethod
    async def decide(
        self,
        run_id: str,
        *,
        calls: Mapping[str, InDoubtDecision] | None = None,
        operator: str | None = None,
        carry_on: bool = True,
    ) -> int:
        """Store the word on a run's calls in doubt (without `calls`, every one reruns); return its step.

        With `carry_on`, the run goes on with the decision (here: recovered in this process,
        unless someone took it since; through the workers: a worker spends it). Without it,
        the decision waits for the next recovery.

        Raises:
            CheckpointConflict: the run is not running or has no call in doubt (`RunHeld`: a live
                worker holds it).
            ValueError: `calls` does not decide exactly the calls in doubt, or a result does not
                fit its tool's return type.
        """

    @abstractmethod
    async def recover(self, run_id: str, *, rerun_in_doubt: bool = False, operator: str | None = None) -> Acted | None:
        """Carry on a run no live worker holds, from its newest checkpoint (None: nothing to do, it is paused).

        Raises:
            CheckpointNotFound: unknown run.
            RunHeld: a live worker holds it.
            CheckpointConflict: the run already ended.
            RecoveryNeedsDecision: (here) a call is in doubt and its tool is not idempotent.
        """

    @abstractmethod
    async def fork(
        self,
        run_id: str,
        *,
        at_step: int,
        patch: Mapping[str, Any] | None = None,
        new_run_id: str | None = None,
        operator: str | None = None,
        run: bool = True,
    ) -> Acted:
        """Start a new run from checkpoint `at_step` of `run_id`, with the history up to it; the old run is not touched.

        `run`: carry the new run on (here, in this process; through the workers, always a
        worker); else only its step 0 is saved, for a worker to pick up.

        Any kind of run forks: a flow run from that checkpoint's state (patched), a tool loop
        or an agent run from that stage's messages (no patch).

        Raises:
            FlowError: the patch does not fit (a loop or an agent takes none).
        """

    async def status(self, run_id: str) -> RunView:
        """The run as its checked rows show it, whatever its kind (`agentflow.runs.Runs.status`)."""
        return await self.runs.status(run_id)

    async def settle(self, run_id: str, *, timeout_s: float = 60.0, poll_s: float = 0.05) -> RunView:
        """Wait until the run settled (ended, paused, or waiting for a decision); its view then (`Runs.settle`)."""
        return await self.runs.settle(run_id, timeout_s=timeout_s, poll_s=poll_s)

    async def result(self, run_id: str) -> Any:
        """What the run produced: a flow's final state, a loop's answer, an agent's output (`Runs.result`)."""
        return await self.runs.result(run_id)

    async def aclose(self) -> None:  # noqa: B027 - nothing to close unless an operator opened something
        """Close what this operator opened."""
