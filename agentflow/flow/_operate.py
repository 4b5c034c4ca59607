"""`RunOperations`: what an operator does to a stored flow run (a mixin of `FlowRunner`).

Each action holds the run's lease (`RunHeld` when a live worker has it), signs what it
decides with the operator's name, and lives once in the run protocol
(`agentflow.exec._run_protocol`) or, for `fork`, in `agentflow.flow._fork`:
- `decide_in_doubt`: the operator's word on each call in doubt;
- `retry`: a failed run again from the superstep that failed;
- `cancel`: a paused or stranded run ends ``cancelled``;
- `fork`: a new run from any checkpoint, its state patched;
- `migrate`: an unfinished run moved onto another version of its flow.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from agentflow._errors import CheckpointConflict, FlowError
from agentflow._identity import RunContext
from agentflow.exec._run_control import InDoubtDecision
from agentflow.flow import _fork
from agentflow.flow._children import waiting_children
from agentflow.flow._durable import Migration
from agentflow.flow._fork import Patch
from agentflow.flow._result import RunResult
from agentflow.flow._versions import FlowLike, as_versions

if TYPE_CHECKING:
    from agentflow.flow._durable import FlowProtocol

S = TypeVar("S", bound=BaseModel)


class RunOperations(ABC):
    """Operator actions on stored runs, over the run protocol a subclass (`FlowRunner`) provides."""

    @abstractmethod
    def protocol(self, flow: FlowLike[Any], migration: Migration | None = None) -> FlowProtocol:
        """The run protocol for runs of `flow`."""

    @abstractmethod
    def fresh_run_id(self) -> str:
        """A new unguessable run id."""

    async def decide_in_doubt(
        self,
        flow: FlowLike[S],
        run_id: str,
        *,
        calls: Mapping[str, InDoubtDecision] | None = None,
        operator: str | None = None,
        ctx: RunContext | None = None,
    ) -> int:
        """Store an operator's word on the run's calls in doubt; return the decision's step.

        Check each call at its system first (did the mail go out? was the card charged?),
        then say, per call id, `Rerun()` (it had no effect: run it again), `Happened(result)`
        (it had its effect and returned `result`: never run it again) or
        `DidNotHappen(reason)` (it had no effect and must not run: the call fails with
        `reason`). Without `calls`, every call in doubt reruns. The decision is a signed
        claim naming `operator`; the next `advance` or `recover` of the run spends it, once.

        Raises:
            CheckpointConflict: the run is not running or has no call in doubt (`RunHeld`:
                a live worker holds it, and its calls are not in doubt but running).
            ValueError: `calls` does not decide exactly the calls in doubt, or a result
                does not fit its tool's return type.
        """
        return await self.protocol(flow).decide_in_doubt(run_id, operator=operator, ctx=ctx, calls=calls)

    async def retry(
        self,
        flow: FlowLike[S],
        run_id: str,
        *,
        operator: str | None = None,
        ctx: RunContext | None = None,
        max_supersteps: int | None = None,
    ) -> RunResult[S]:
        """Run a failed run again from the superstep that failed, and on to its end.

        The failed superstep's finished calls replay from the log, its failed calls run
        again, and calls in doubt follow the usual rules. The retry is a claim (cause
        ``retry``) naming `operator`, so a worker that lost the run is fenced. With
        `max_supersteps` 0 only the claim is stored, for a worker to spend.

        Raises:
            CheckpointConflict: the run did not fail (`RunHeld`: a live worker holds it).
            RecoveryNeedsDecision: a call of that superstep is in doubt and may not rerun.
        """
        result: RunResult[S] = await self.protocol(flow).retry(run_id, operator=operator, ctx=ctx, limit=max_supersteps)
        return result

    async def cancel(self, flow: FlowLike[S], run_id: str, *, reason: str, operator: str | None = None) -> RunResult[S]:
        """Cancel a run: it becomes ``cancelled`` (final, never recovered).

        A signed claim records `reason` and `operator`; a paused run's pending calls are
        dropped, and a worker that lost the run is fenced. A run nobody holds is cancelled
        here and the result says ``cancelled``. A run a live worker holds gets a signed
        cancel request instead, and the result is the run as it stands (``running``): that
        worker starts no call after it sees the request, lets the calls in flight finish
        and be logged, then saves the same claim (see docs/operating.md).

        Raises:
            CheckpointConflict: the run already ended.
            ValueError: `reason` is empty.
        """
        children = await waiting_children(self, flow, run_id)  # type: ignore[arg-type]
        result: RunResult[S] = await self.protocol(flow).cancel(run_id, reason=reason, operator=operator)
        for child, child_id in children:  # what the parent waits for goes with it
            with contextlib.suppress(CheckpointConflict):  # it ended meanwhile
                why = f"its parent run {run_id} was cancelled: {reason}"
                await self.cancel(child.flow, child_id, reason=why, operator=operator)
        return result

    async def fork(
        self,
        flow: FlowLike[S],
        run_id: str,
        *,
        at_step: int,
        new_run_id: str | None = None,
        patch: Patch | None = None,
        ctx: RunContext | None = None,
        operator: str | None = None,
        max_supersteps: int | None = None,
    ) -> RunResult[S]:
        """Start a new run from checkpoint `at_step` of `run_id` (any status), its state patched.

        The checkpoint is checked like any other; its state, with `patch` applied (a
        mapping of fields, or a function that returns or changes a copy of the state), is
        validated against the flow's state model, and the new run goes on from that
        checkpoint's next superstep. Nothing of the old call log carries over: the new
        run's calls are new calls, with new idempotency keys, so they all run. The source
        run and step (and `operator`) are signed into the new run's step 0 as
        ``forked_from``. The old run is not touched.

        Args:
            flow: the source run's flow (the graph must not have changed since).
            run_id: the source run.
            at_step: the checkpoint to start from.
            new_run_id: the new run's id (unguessable by default).
            patch: fields to change, or a function of the state.
            ctx: who the new run acts for.
            operator: who forked it.
            max_supersteps: as for `run` (0: save step 0 only, and let a worker go on).

        Raises:
            CheckpointNotFound: the run has no checkpoint at that step.
            CheckpointStoreCorrupt: that checkpoint fails its check.
            FlowError: the flow changed since, or the patched state does not fit.
            CheckpointConflict: `new_run_id` is taken.
        """
        rid = new_run_id if new_run_id is not None else self.fresh_run_id()
        result: RunResult[S] = await _fork.fork(
            self.protocol(flow),
            run_id,
            at_step=at_step,
            new_run_id=rid,
            patch=patch,
            ctx=ctx,
            operator=operator,
            limit=max_supersteps,
        )
        return result

    async def migrate(
        self,
        flow: FlowLike[Any],
        run_id: str,
        *,
        to_version: str | None = None,
        state: Callable[[dict[str, Any]], BaseModel | Mapping[str, Any]] | None = None,
        at: str | None = None,
        operator: str | None = None,
        ctx: RunContext | None = None,
        max_supersteps: int | None = None,
    ) -> RunResult[Any]:
        """Move an unfinished run onto another version of its flow, and carry it on there.

        For a run whose version is no longer deployed (it `needs migration`), or one an
        operator moves on purpose. The run's state (its JSON form) goes through `state`,
        and what it returns is validated against the target version's state model; the run
        goes on from node `at`, or from the nodes it would have run next (each must exist in
        the target). The move is a signed ``migrate`` claim naming `operator` and both
        versions; the old checkpoints stay in the run's history. It is allowed only at a
        step boundary (no call logged in the step the run would go on with), and drops
        pending approvals (the new version asks again).

        Args:
            flow: the versions at hand (a `FlowVersions`, or one `Flow`); the target is among them.
            run_id: the run.
            to_version: the version to move to (default: the newest at hand).
            state: the new state from the old one's JSON form (default: the old state as it is).
            at: the node to go on from.
            operator: who moved it (default: this runner's owner name).
            ctx: who the run acts for (checked against its identity).
            max_supersteps: as for `run` (0: only store the move; a worker goes on).

        Raises:
            FlowError: the version is not at hand, the state or node does not fit, or calls
                were logged in the step the run would go on with.
            CheckpointConflict: the run ended (`RunHeld`: a live worker holds it).
        """
        flows = as_versions(flow)
        target = flows.newest if to_version is None else flows.get(to_version)
        if target is None:
            raise FlowError(
                f"flow {flows.name!r} has no version {to_version!r} here (versions: {', '.join(flows.versions)})"
            )
        proto = self.protocol(flows, Migration(target, state, at))
        result: RunResult[Any] = await proto.migrate(run_id, operator=operator, ctx=ctx, limit=max_supersteps)
        return result
