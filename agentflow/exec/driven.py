"""`DrivenRunner`: the operations on stored runs of one driver, whatever drives its steps.

A tool loop and a pydantic-ai agent (`agentflow.integrations.pydantic_ai`) are both runs
of one `RunDriver` held by one `RunProtocol`; what they add is how a new run starts (its
messages, or a prompt). Everything else an operator or a worker does to a stored run
(advance, recover, resume, wake, decide_in_doubt, cancel, retry, fork, read) is the
protocol's, and lives here once. What a kind cannot do (a tool loop is not retried; only a
flow is migrated) is the subclass's `refused` mapping: the one statement of each reason.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from agentflow._errors import CheckpointNotFound, FlowError
from agentflow._identity import RunContext
from agentflow._run_types import RunStatus
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.run.control import InDoubtDecision
from agentflow.exec.run.cursor import RunCursor, RunOutcome
from agentflow.exec.run.protocol import RunProtocol

__all__ = ["DrivenRunner"]

C = TypeVar("C", bound=RunCursor)
R = TypeVar("R", bound=RunOutcome, covariant=True)


class DrivenRunner(Generic[C, R]):
    """What every runner of one driver offers: the operations on its stored runs."""

    #: What runs of this kind cannot do (``retry``, ``migrate``), and why.
    refused: ClassVar[Mapping[str, str]] = {}
    #: How a message names a run of this kind ("tool loop", "agent").
    noun: ClassVar[str] = "run"
    protocol: RunProtocol[C, R]
    checkpoints: CheckpointStore | None

    async def _exists(self, run_id: str) -> bool:
        assert self.checkpoints is not None
        try:
            await self.checkpoints.latest(run_id)
        except CheckpointNotFound:
            return False
        return True

    async def advance(
        self,
        run_id: str,
        *,
        expected_step: int | None = None,
        rerun_in_doubt: bool = False,
        handoff: bool = False,
        park: bool = False,
        spend: str | None = None,
    ) -> R:
        """Claim a run and run exactly one stage of it (a model call, or one round of tools).

        The arguments are `FlowRunner.advance`'s.

        Raises:
            Stale: the latest step is not `expected_step` (a late or duplicate message).
            CheckpointConflict: the run ended or is paused, or another worker claimed it first.
            RecoveryNeedsDecision: a tool call is in doubt and its tool is not idempotent.
            ControlRefused: `spend` names a decision the run does not carry.
        """
        return await self.protocol.advance(
            run_id, expected_step=expected_step, rerun_in_doubt=rerun_in_doubt, handoff=handoff, park=park, spend=spend
        )

    async def recover(
        self,
        run_id: str,
        *,
        rerun_in_doubt: bool = False,
        ctx: RunContext | None = None,
        operator: str | None = None,
    ) -> R:
        """Continue a run whose worker died, from its latest checkpoint (see `FlowRunner.recover`).

        Raises:
            CheckpointNotFound: nothing is stored for the run.
            CheckpointConflict: the run ended, or another worker claimed it first.
            CheckpointStoreCorrupt: a checkpoint, the history chain or a call record fails its check.
            RecoveryNeedsDecision: a tool call is in doubt and its tool is not idempotent.
            IdentityMismatch: `ctx` is for someone else, or the run's principal is missing.
        """
        return await self.protocol.recover(run_id, rerun_in_doubt=rerun_in_doubt, ctx=ctx, operator=operator)

    async def resume(
        self,
        run_id: str,
        *,
        approve: bool | Mapping[str, bool] = True,
        note: str | None = None,
        ctx: RunContext | None = None,
        max_supersteps: int | None = None,
        operator: str | None = None,
    ) -> R:
        """Decide a paused run's pending approvals and carry it on (`max_supersteps` 0: only store the decision).

        A superstep here is one stage: a model call, or one round of tools. The decision is
        saved as the run's next checkpoint (compare-and-set: of two racing decisions one
        wins); with `max_supersteps` 0 the result's `step` is the step a worker advances from.

        Raises:
            CheckpointConflict: the run is not paused, or another decision won.
            ValueError: `approve` is a mapping that leaves a pending call undecided.
        """
        return await self.protocol.resume(
            run_id, approve=approve, note=note, ctx=ctx, limit=max_supersteps, operator=operator
        )

    async def wake(
        self,
        run_id: str,
        *,
        expected_step: int | None = None,
        ctx: RunContext | None = None,
        now: float | None = None,
        max_supersteps: int | None = None,
    ) -> R:
        """Wake a run that waits until a time (a tool loop's waiting tool), and carry it on.

        Raises:
            NotDue: its time has not come (nothing is done).
            CheckpointConflict: the run is not waiting, or someone else woke it first.
        """
        return await self.protocol.wake(run_id, limit=max_supersteps, expected_step=expected_step, ctx=ctx, now=now)

    async def decide_in_doubt(
        self,
        run_id: str,
        *,
        calls: Mapping[str, InDoubtDecision] | None = None,
        operator: str | None = None,
        ctx: RunContext | None = None,
    ) -> int:
        """Store an operator's word on a run's calls in doubt; return the decision's step.

        See `FlowRunner.decide_in_doubt`: per call id `Rerun()`, `Happened(result)` (checked
        against the tool's return type, from this runner's registry) or `DidNotHappen(reason)`;
        without `calls`, every call in doubt reruns.

        Raises:
            CheckpointConflict: the run is not running or has no call in doubt (`RunHeld`: a
                live worker holds it).
            ValueError: `calls` does not decide exactly the calls in doubt, or a result does not
                fit its tool's return type.
        """
        return await self.protocol.decide_in_doubt(run_id, operator=operator, ctx=ctx, calls=calls)

    def refuses(self, action: str) -> str | None:
        """Why runs of this kind cannot take `action` (``retry``, ``migrate``); None when they can."""
        return self.refused.get(action)

    def _refuse(self, run_id: str, action: str) -> FlowError:
        return FlowError(f"run {run_id!r} is a {self.noun}: {self.refused[action]}")

    async def retry(self, run_id: str, *, operator: str | None = None, max_supersteps: int | None = None) -> R:
        """Run a failed run again from the stage that failed (see `FlowRunner.retry`), unless its kind refuses.

        Raises:
            FlowError: runs of this kind are not retried (the message says why).
            CheckpointConflict: the run did not fail.
            RecoveryNeedsDecision: a call of that stage is in doubt and may not rerun.
        """
        if "retry" in self.refused:
            raise self._refuse(run_id, "retry")
        return await self.protocol.retry(run_id, operator=operator, limit=max_supersteps)

    def fresh_run_id(self) -> str:
        """A new unguessable id for a run of this kind."""
        return "run-" + secrets.token_urlsafe(16)

    async def fork(
        self,
        run_id: str,
        *,
        at_step: int,
        new_run_id: str | None = None,
        patch: Any = None,
        operator: str | None = None,
        max_supersteps: int | None = None,
    ) -> R:
        """Start a new run from checkpoint `at_step` of `run_id`, with the history up to it (see `RunProtocol.fork`).

        The kind copies the checkpoint into the new run: a flow run its state (with `patch`, a
        mapping of fields or a function of the state), a tool loop or an agent run its
        messages (it takes no patch). `max_supersteps` 0 only saves the new run's step 0.

        Raises:
            CheckpointNotFound: the run has no checkpoint at that step.
            FlowError: the patch does not fit (a loop or an agent takes none).
            CheckpointConflict: `new_run_id` is taken.
        """
        rid = new_run_id if new_run_id is not None else self.fresh_run_id()
        return await self.protocol.fork(
            run_id, at_step=at_step, new_run_id=rid, patch=patch, operator=operator, limit=max_supersteps
        )

    async def migrate(
        self,
        run_id: str,
        *,
        to_version: str | None = None,
        state: Callable[[dict[str, Any]], BaseModel | Mapping[str, Any]] | None = None,
        at: str | None = None,
        operator: str | None = None,
        max_supersteps: int | None = None,
    ) -> R:
        """Refused: only flows have versions to move between.

        Raises:
            FlowError: always.
        """
        raise self._refuse(run_id, "migrate")

    async def cancel(self, run_id: str, *, reason: str, operator: str | None = None) -> R:
        """Cancel a run (see `FlowRunner.cancel`).

        A run nobody holds is cancelled at once; one a live worker holds gets a signed
        request its holder honours before its next model or tool call (the result is then
        the run as it stands, ``running``).

        Raises:
            CheckpointConflict: the run already ended.
            ValueError: `reason` is empty.
        """
        return await self.protocol.cancel(run_id, reason=reason, operator=operator)

    async def read(self, run_id: str) -> R:
        """A run as its checkpoints show it (history checked), without touching it.

        Raises:
            CheckpointNotFound: unknown run.
            CheckpointStoreCorrupt: a checkpoint or the history chain fails its check.
        """
        opened = await self.protocol.steps.open(run_id, None, identity=False)
        return self.protocol.driver.result(opened.cur, RunStatus(opened.status))
