"""`DrivenRunner`: the verbs on stored runs, in process: each one written once, for every kind of run.

Every runner is one: `FlowRunner` names a run by its flow and id, `LoopRunner` and a
pydantic-ai agent's `AgentRunner` (`ProtocolRunner`s: one protocol each) by its id, and
`agentflow.runs.Runs` by the id of a run of any kind (it reads the run's checked newest
row for its kind). How a runner names a run is its `_target`, which hands back the run
protocol (`run.protocol`) of that run's kind and the run id; the verbs (advance, recover,
resume, wake, decide_in_doubt, retry, cancel, fork, migrate, read) live here once, over
it. What a kind cannot do (a tool loop is not retried; only a flow run is migrated) the
kind's driver says (`RunDriver.refused`), and the protocol refuses it with the reason.

A superstep here is one stage of a tool loop or an agent run (a model call, or one round
of tools). `max_supersteps` 0 only stores what the verb decided: a worker goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, TypeVarTuple

from pydantic import BaseModel

from agentflow._errors import CheckpointNotFound
from agentflow._identity import RunContext
from agentflow._run_types import RunStatus
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.run.control import InDoubtDecision
from agentflow.exec.run.cursor import RunCursor, RunOutcome
from agentflow.exec.run.protocol import RunProtocol

__all__ = ["DrivenRunner", "ProtocolRunner"]

C = TypeVar("C", bound=RunCursor)
R = TypeVar("R", bound=RunOutcome)
#: How a runner names one of its runs: ``(flow, run_id)`` for a `FlowRunner`, ``(run_id,)`` otherwise.
At = TypeVarTuple("At")


class DrivenRunner(Generic[C, R, *At]):
    """The verbs on stored runs, in this process: each is the run protocol's, on the run `_target` names."""

    checkpoints: CheckpointStore | None

    async def _target(self, *run: *At) -> tuple[RunProtocol[C, R], str]:
        """The protocol of the run `run` names, and its id.

        Raises:
            CheckpointNotFound, CheckpointStoreCorrupt: (a runner that reads the run to find its kind).
            FlowError: its kind is not one this runner has.
        """
        raise NotImplementedError

    async def advance(
        self,
        *run: *At,
        expected_step: int | None = None,
        rerun_in_doubt: bool = False,
        handoff: bool = False,
        park: bool = False,
        spend: str | None = None,
    ) -> R:
        """Claim a run and run exactly one superstep of it (what a distributed worker does).

        Args:
            run: the run (``flow, run_id`` on a `FlowRunner`, else ``run_id``).
            expected_step: the step the caller saw; if the latest differs, nothing happens
                and `Stale` is raised (a duplicate or late message).
            rerun_in_doubt: rerun calls in doubt even if their tools are not idempotent.
            handoff: the previous superstep ended cleanly and handed the run over; the
                superstep is then not reported as a recovery unless it finds calls to replay.
            park: when a call in doubt needs a decision, park the run first (a signed
                claim that says what it waits for, so sweeps leave it alone).
            spend: the caller was sent to spend a decision (``resume`` or ``decision``):
                unless the latest checkpoint is a signed claim of that kind, nothing
                happens and `ControlRefused` is raised.

        Raises:
            Stale: the latest step is not `expected_step`.
            CheckpointConflict: the run ended, is paused, or another worker claimed it first.
            RecoveryNeedsDecision: a call is in doubt (as for `recover`).
            CheckpointStoreCorrupt: a row fails its check (as for `recover`).
            ControlRefused: `spend` names a decision the run does not carry.
        """
        proto, run_id = await self._target(*run)
        return await proto.advance(
            run_id, expected_step=expected_step, rerun_in_doubt=rerun_in_doubt, handoff=handoff, park=park, spend=spend
        )

    async def recover(
        self,
        *run: *At,
        rerun_in_doubt: bool = False,
        ctx: RunContext | None = None,
        operator: str | None = None,
    ) -> R:
        """Continue a run whose worker died, from its latest checkpoint.

        Finished calls of the cut-off superstep replay from the log; calls in doubt rerun
        if their tool is idempotent (or `rerun_in_doubt`, or an operator's signed decision
        stored with `decide_in_doubt`), else nothing runs. The run's lease must be free:
        a live worker's run is never taken over. A paused run is returned as it stands.

        Args:
            run: the run (``flow, run_id`` on a `FlowRunner`, else ``run_id``).
            rerun_in_doubt: rerun calls in doubt even if their tools are not idempotent
                (the decision is signed into the claim, with `operator`).
            ctx: who the run acts for (checked against its identity).
            operator: who decided (default: this runner's owner name).

        Raises:
            CheckpointNotFound: nothing is stored for the run.
            CheckpointConflict: the run ended, or another worker claimed it first
                (`RunHeld`: a live worker holds it; the message names it and when its lease ends).
            CheckpointStoreCorrupt: a checkpoint or call record fails its check.
            RecoveryNeedsDecision: a call is in doubt and its tool is not idempotent.
            IdentityMismatch: `ctx` is for someone else, or the run's principal is missing.
            FlowError: the flow's graph changed since the checkpoint.
            VersionNotDeployed: the run is on a version of the flow not given here
                (nothing is touched; it needs that version, or `migrate`).
        """
        proto, run_id = await self._target(*run)
        return await proto.recover(run_id, rerun_in_doubt=rerun_in_doubt, ctx=ctx, operator=operator)

    async def resume(
        self,
        *run: *At,
        approve: bool | Mapping[str, bool] = True,
        note: str | None = None,
        ctx: RunContext | None = None,
        max_supersteps: int | None = None,
        operator: str | None = None,
    ) -> R:
        """Decide a paused run's pending approvals and carry the run on.

        The decision is saved as the run's next checkpoint (compare-and-set: of two racing
        decisions one wins).

        Args:
            run: the paused run (``flow, run_id`` on a `FlowRunner`, else ``run_id``).
            approve: one decision for every pending call, or one per call id.
            note: a note stored with the decision.
            ctx: who resumes (checked against the run's identity).
            max_supersteps: stop after this many supersteps (0: only store the decision,
                and let a worker spend it; the result's `step` is the one it advances from).
            operator: who decided, signed into the decision (default: this runner's owner name).

        Raises:
            CheckpointConflict: the run is not paused, or another resume won.
            ValueError: `approve` is a mapping that leaves a pending call undecided.
            IdentityMismatch: `ctx` is for someone else, or the run's principal is missing.
        """
        proto, run_id = await self._target(*run)
        return await proto.resume(run_id, approve=approve, note=note, ctx=ctx, limit=max_supersteps, operator=operator)

    async def wake(
        self,
        *run: *At,
        expected_step: int | None = None,
        ctx: RunContext | None = None,
        now: float | None = None,
        max_supersteps: int | None = None,
    ) -> R:
        """Wake a paused run whose timer is due (a `Wait`, an approval's deadline, a waiting tool), and carry it on.

        The sweepers call this (`FlowRunner.wake_due`, `run_timers`, a Celery worker's
        recover_all); call it yourself to wake one run. Of two wakes, one wins.

        Raises:
            NotDue: the run's timer is not due yet (nothing is done).
            CheckpointConflict: the run is not waiting on a timer, or someone woke or resumed it first.
        """
        proto, run_id = await self._target(*run)
        return await proto.wake(run_id, limit=max_supersteps, expected_step=expected_step, ctx=ctx, now=now)

    async def decide_in_doubt(
        self,
        *run: *At,
        calls: Mapping[str, InDoubtDecision] | None = None,
        operator: str | None = None,
        ctx: RunContext | None = None,
    ) -> int:
        """Store an operator's word on the run's calls in doubt; return the decision's step.

        Check each call at its system first (did the mail go out? was the card charged?),
        then say, per call id, `Rerun()` (it had no effect: run it again), `Happened(result)`
        (it had its effect and returned `result`, checked against the tool's return type:
        never run it again) or `DidNotHappen(reason)` (it had no effect and must not run: the
        call fails with `reason`). Without `calls`, every call in doubt reruns. The decision
        is a signed claim naming `operator`; the next `advance` or `recover` of the run
        spends it, once.

        Raises:
            CheckpointConflict: the run is not running or has no call in doubt (`RunHeld`:
                a live worker holds it, and its calls are not in doubt but running).
            ValueError: `calls` does not decide exactly the calls in doubt, or a result
                does not fit its tool's return type.
        """
        proto, run_id = await self._target(*run)
        return await proto.decide_in_doubt(run_id, operator=operator, ctx=ctx, calls=calls)

    async def retry(
        self,
        *run: *At,
        operator: str | None = None,
        ctx: RunContext | None = None,
        max_supersteps: int | None = None,
    ) -> R:
        """Run a failed run again from the superstep that failed, and on to its end.

        The failed superstep's finished calls replay from the log, its failed calls run
        again, and calls in doubt follow the usual rules. The retry is a claim (cause
        ``retry``) naming `operator`, so a worker that lost the run is fenced. With
        `max_supersteps` 0 only the claim is stored, for a worker to spend.

        Raises:
            FlowError: runs of this kind are not retried (a tool loop: the message says why).
            CheckpointConflict: the run did not fail (`RunHeld`: a live worker holds it).
            RecoveryNeedsDecision: a call of that superstep is in doubt and may not rerun.
        """
        proto, run_id = await self._target(*run)
        return await proto.retry(run_id, operator=operator, ctx=ctx, limit=max_supersteps)

    async def cancel(self, *run: *At, reason: str, operator: str | None = None) -> R:
        """Cancel a run: it becomes ``cancelled`` (final, never recovered).

        A signed claim records `reason` and `operator`; a paused run's pending calls are
        dropped, and a worker that lost the run is fenced. A run nobody holds is cancelled
        here and the result says ``cancelled``. A run a live worker holds gets a signed
        cancel request instead, and the result is the run as it stands (``running``): that
        worker starts no call after it sees the request, lets the calls in flight finish
        and be logged, then saves the same claim (see docs/operating.md). The child runs a
        paused run waits for are cancelled with it.

        Raises:
            CheckpointConflict: the run already ended.
            ValueError: `reason` is empty.
        """
        proto, run_id = await self._target(*run)
        return await proto.cancel(run_id, reason=reason, operator=operator)

    async def fork(
        self,
        *run: *At,
        at_step: int,
        new_run_id: str | None = None,
        patch: Any = None,
        ctx: RunContext | None = None,
        operator: str | None = None,
        max_supersteps: int | None = None,
    ) -> R:
        """Start a new run from checkpoint `at_step` of a run (any status), with the history up to it.

        The checkpoint is checked like any other, and the kind copies it into the new run:
        a flow run its state, with `patch` applied (a mapping of fields, or a function that
        returns or changes a copy of the state) and validated against the flow's state
        model; a tool loop or an agent run its messages (it takes no patch). The new run
        goes on from there. Nothing of the old call log carries over: the new run's calls
        are new calls, with new idempotency keys, so they all run. The source run and step
        (and `operator`) are signed into the new run's step 0 as ``forked_from``. The old
        run is not touched.

        Args:
            run: the source run (``flow, run_id`` on a `FlowRunner`, else ``run_id``).
            at_step: the checkpoint to start from.
            new_run_id: the new run's id (an unguessable one of the kind's by default).
            patch: a flow run's fields to change, or a function of its state.
            ctx: who the new run acts for.
            operator: who forked it.
            max_supersteps: as for `run` (0: save step 0 only, and let a worker go on).

        Raises:
            CheckpointNotFound: the run has no checkpoint at that step.
            CheckpointStoreCorrupt: that checkpoint fails its check.
            FlowError: the flow changed since, or the patch does not fit (a loop or an agent takes none).
            CheckpointConflict: `new_run_id` is taken.
        """
        proto, run_id = await self._target(*run)
        return await proto.fork(
            run_id,
            at_step=at_step,
            new_run_id=new_run_id,
            patch=patch,
            ctx=ctx,
            operator=operator,
            limit=max_supersteps,
        )

    async def migrate(
        self,
        *run: *At,
        to_version: str | None = None,
        state: Callable[[dict[str, Any]], BaseModel | Mapping[str, Any]] | None = None,
        at: str | None = None,
        operator: str | None = None,
        ctx: RunContext | None = None,
        max_supersteps: int | None = None,
    ) -> R:
        """Move an unfinished flow run onto another version of its flow, and carry it on there.

        For a run whose version is no longer deployed (it `needs migration`), or one an
        operator moves on purpose. The run's state (its JSON form) goes through `state`,
        and what it returns is validated against the target version's state model; the run
        goes on from node `at`, or from the nodes it would have run next (each must
        exist in the target). The move is a signed ``migrate`` claim naming `operator` and
        both versions; the old checkpoints stay in the run's history. It is allowed only at
        a step boundary (no call logged in the step the run would go on with), and drops
        pending approvals (the new version asks again).

        Args:
            run: the run (``flow, run_id`` on a `FlowRunner`, where the flow's versions at
                hand hold the target; else ``run_id``).
            to_version: the version to move to (default: the newest at hand).
            state: the new state from the old one's JSON form (default: the old state as it is).
            at: the node to go on from.
            operator: who moved it (default: this runner's owner name).
            ctx: who the run acts for (checked against its identity).
            max_supersteps: as for `run` (0: only store the move; a worker goes on).

        Raises:
            FlowError: the run is not a flow run (only flows have versions), the version is
                not at hand, the state or node does not fit, or calls were logged in the
                step the run would go on with.
            CheckpointConflict: the run ended (`RunHeld`: a live worker holds it).
        """
        proto, run_id = await self._target(*run)
        return await proto.migrate(
            run_id, to_version=to_version, state=state, at=at, operator=operator, ctx=ctx, limit=max_supersteps
        )

    async def read(self, *run: *At) -> R:
        """A run as its checkpoints show it (history checked), without touching it.

        Raises:
            CheckpointNotFound: unknown run.
            CheckpointStoreCorrupt: a checkpoint or the history chain fails its check.
        """
        proto, run_id = await self._target(*run)
        opened = await proto.steps.open(run_id, None, identity=False)
        return proto.driver.result(opened.cur, RunStatus(opened.status))


class ProtocolRunner(DrivenRunner[C, R, str]):
    """The runs of one protocol (one tool loop, one agent, one flow's versions), each named by its id."""

    protocol: RunProtocol[C, R]

    def __init__(self, protocol: RunProtocol[C, R]) -> None:
        self.protocol = protocol
        self.checkpoints = protocol.store

    async def _target(self, run_id: str) -> tuple[RunProtocol[C, R], str]:
        return self.protocol, run_id

    def refuses(self, action: str) -> str | None:
        """Why runs of this kind cannot take `action` (``retry``, ``migrate``); None when they can."""
        return self.protocol.driver.refused.get(action)

    def fresh_run_id(self) -> str:
        """A new unguessable id for a run of this kind."""
        return self.protocol.driver.fresh_run_id()

    async def _exists(self, run_id: str) -> bool:
        assert self.checkpoints is not None
        try:
            await self.checkpoints.latest(run_id)
        except CheckpointNotFound:
            return False
        return True
