"""`FlowRunner`: runs flows superstep by superstep, with or without a checkpoint store.

Without a store a run lives only in this process. With one, step 0 is saved before the
first superstep and a checkpoint after each superstep; every tool call goes through the
call log. Every rule of the durable sequence (claim, checks, replay, decisions) lives in
the run protocol (`agentflow.exec.run.protocol`); a flow plugs in `FlowDriver`.

A runner runs runs (run, start, advance, recover, resume, wake) and carries an operator's
actions on them (decide_in_doubt, retry, cancel, fork, migrate): each holds the run's lease
(`RunHeld` when a live worker has it), signs what it decides with the operator's name, and
lives once in the run protocol or, for `fork`, in `agentflow.flow._fork`. Its methods are
thin: the file is long for their docstrings, which are the API's reference.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from agentflow._errors import CheckpointConflict, FlowError
from agentflow._identity import RunContext, identity_body
from agentflow.exec import Executor
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.run.control import InDoubtDecision
from agentflow.exec.run.keys import sealer_for
from agentflow.exec.run.lease import DEFAULT_LEASE_S, Ownership
from agentflow.exec.run.protocol import MAX_CHECKPOINT_BYTES, RunProtocol
from agentflow.flow import _fork, _recover, _timers
from agentflow.flow._driver import Cursor, FlowDriver, FlowProtocol, Migration
from agentflow.flow._fork import Patch
from agentflow.flow._graph import Flow
from agentflow.flow._result import RunResult
from agentflow.flow._versions import FlowLike, as_versions
from agentflow.flow.children import ChildRuns, InlineChildren, waiting_children

S = TypeVar("S", bound=BaseModel)


def new_run_id() -> str:
    """An unguessable run id (a run id is the only key a shared store has)."""
    return "run-" + secrets.token_urlsafe(16)


class FlowRunner:
    """Runs flows; with `checkpoints`, every run survives the death of its worker."""

    def __init__(
        self,
        executor: Executor,
        *,
        checkpoints: CheckpointStore | None = None,
        checkpoint_key: bytes | Sequence[bytes] | None = None,
        recover_concurrency: int = 8,
        max_checkpoint_bytes: int = MAX_CHECKPOINT_BYTES,
        lease_s: float = DEFAULT_LEASE_S,
        owner: str | None = None,
        identity: str | None = None,
    ) -> None:
        """Build a runner.

        Args:
            executor: runs the tool calls (its `events` hub and its `tracer` are the runner's too).
            checkpoints: a checkpoint store; None runs without durability.
            checkpoint_key: the signing key (32+ bytes), or a list for rotation (newest
                first). Required with any store but the memory one.
            recover_concurrency: how many runs `recover_all` recovers at once.
            max_checkpoint_bytes: the largest checkpoint (encoded) a run may save; a bigger
                one raises `CheckpointTooLarge` and nothing is stored. A tool result over it
                is not stored either: its call is then in doubt (``unrecordable``).
            lease_s: how long the runner's hold on a run lasts unless renewed (it renews
                every third of it while it works). Nothing else acts on a run while its
                lease is live; a holder that died is taken over this long after.
            owner: names this runner in leases and checkpoints (default
                ``runner@<host>:<pid>``).
            identity: instead of `owner`, a name this process keeps across its restarts
                (one live process per identity, e.g. ``billing-api-0``). Its leases are
                held as ``<identity>#<start>``, and after a crash the restarted process
                takes over the runs its earlier life held at once, instead of waiting
                `lease_s` for its own leases to lapse (docs/operating.md).

        Raises:
            ValueError, TypeError: a missing or short key, a `lease_s` that is not positive,
                or both `owner` and `identity`.
        """
        self.executor = executor
        self.events = executor.events
        self.checkpoints = checkpoints
        self.sealer = sealer_for(checkpoints, checkpoint_key)
        self.recover_concurrency = recover_concurrency
        if max_checkpoint_bytes < 1024:
            raise ValueError(f"max_checkpoint_bytes must be at least 1024, not {max_checkpoint_bytes}")
        self.max_checkpoint_bytes = max_checkpoint_bytes
        self.ownership = Ownership.chosen(owner, identity, lease_s)
        #: How `Child` nodes carry their child runs on: here, to their end or first pause (a distributed
        #: deployment starts them and leaves them to its workers).
        self.children: ChildRuns = InlineChildren()

    def protocol(self, flow: FlowLike[Any], migration: Migration | None = None) -> FlowProtocol:
        """The run protocol for runs of `flow` (one version, or several) on this runner's store.

        Raises:
            FlowError: a version of the flow is invalid for this runner's registry.
        """
        flows = as_versions(flow)
        for version in flows:
            version.validate(self.executor.registry)
        if migration is not None:
            migration.to.validate(self.executor.registry)
        driver = FlowDriver(flows, self.executor, migration, self)
        return RunProtocol(
            driver,
            self.checkpoints,
            self.sealer,
            self.executor.registry,
            self.events,
            self.max_checkpoint_bytes,
            self.ownership,
            self.executor.tracer,
        )

    def fresh_run_id(self) -> str:
        """A new unguessable run id (`new_run_id`)."""
        return new_run_id()

    async def run(
        self,
        flow: FlowLike[S],
        state: S | Mapping[str, Any],
        *,
        run_id: str | None = None,
        ctx: RunContext | None = None,
        max_supersteps: int | None = None,
    ) -> RunResult[S]:
        """Start a run and drive it until it ends or pauses.

        Args:
            flow: the flow to run (given several versions, the newest).
            state: its initial state (a model instance or a dict).
            run_id: the run's id; unguessable by default.
            ctx: who the run acts for.
            max_supersteps: stop after this many supersteps, leaving the run ``running``
                for another worker (0: only save step 0).

        Raises:
            FlowError: the flow is invalid, the state does not fit, or the run cannot go on.
            CheckpointConflict: the run id is taken, or another worker took the run over
                (`RunHeld`: a live holder has the run id).
        """
        proto = self.protocol(flow)
        newest: Flow[S] = as_versions(flow).newest
        start = _coerce_state(newest, state)
        rid = run_id if run_id is not None else new_run_id()
        if not rid or not isinstance(rid, str):
            raise ValueError("run_id must be a non-empty string")
        cur = Cursor(rid, identity_body(self.sealer, rid, ctx), ctx, newest, start, [newest.entry], {}, 0)
        result: RunResult[S] = await proto.begin(cur, max_supersteps)
        return result

    async def start(
        self,
        flow: FlowLike[S],
        state: S | Mapping[str, Any],
        *,
        run_id: str | None = None,
        ctx: RunContext | None = None,
    ) -> RunResult[S]:
        """Save a new run's step 0 without running it (a worker then advances it).

        Raises:
            ValueError: the runner has no store.
            CheckpointConflict: the run id is taken.
        """
        if self.checkpoints is None:
            raise ValueError("start needs a FlowRunner with a checkpoint store")
        return await self.run(flow, state, run_id=run_id, ctx=ctx, max_supersteps=0)

    async def advance(
        self,
        flow: FlowLike[S],
        run_id: str,
        *,
        expected_step: int | None = None,
        rerun_in_doubt: bool = False,
        handoff: bool = False,
        park: bool = False,
        spend: str | None = None,
    ) -> RunResult[S]:
        """Claim a run and run exactly one superstep of it (what a distributed worker does).

        Args:
            flow: the run's flow.
            run_id: the run.
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
        result: RunResult[S] = await self.protocol(flow).advance(
            run_id,
            expected_step=expected_step,
            rerun_in_doubt=rerun_in_doubt,
            handoff=handoff,
            park=park,
            spend=spend,
        )
        return result

    async def recover(
        self,
        flow: FlowLike[S],
        run_id: str,
        *,
        rerun_in_doubt: bool = False,
        ctx: RunContext | None = None,
        operator: str | None = None,
    ) -> RunResult[S]:
        """Continue a run whose worker died, from its latest checkpoint.

        Finished calls of the cut-off superstep replay from the log; calls in doubt rerun
        if their tool is idempotent (or `rerun_in_doubt`, or an operator's signed decision
        stored with `decide_in_doubt`), else nothing runs. The run's lease must be free:
        a live worker's run is never taken over.

        Args:
            flow: the run's flow.
            run_id: the run.
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
        result: RunResult[S] = await self.protocol(flow).recover(
            run_id, rerun_in_doubt=rerun_in_doubt, ctx=ctx, operator=operator
        )
        return result

    async def recover_all(
        self, flow: FlowLike[S], *, rerun_in_doubt: bool = False, sweep: bool = False
    ) -> dict[str, RunResult[S] | BaseException]:
        """Recover every unfinished run of `flow`: each run id maps to its result or its error.

        A run a live worker holds maps to `RunHeld` (naming the holder and when its lease
        ends) and is not touched. A run held by an earlier life of this runner's `identity`
        is recovered at once, its lease taken over, as `recover` does.

        Args:
            flow: the flow whose runs to recover.
            rerun_in_doubt: rerun calls in doubt even if their tools are not idempotent.
            sweep: first look for runs the store's listing index forgot (someone deleted
                their entry; their rows remain), by scanning the stored rows themselves.
                Each one whose newest checkpoint checks is listed again and recovered; one
                that fails its check is reported as `CheckpointStoreCorrupt`. Every run
                found this way is reported with a ``run.unlisted`` event. A scan reads
                every run id of the store: use it on start-up or on a slow schedule.
        """
        return await _recover.recover_all(self, flow, rerun_in_doubt=rerun_in_doubt, sweep=sweep)

    async def resume(
        self,
        flow: FlowLike[S],
        run_id: str,
        *,
        approve: bool | Mapping[str, bool] = True,
        ctx: RunContext | None = None,
        note: str | None = None,
        max_supersteps: int | None = None,
        operator: str | None = None,
    ) -> RunResult[S]:
        """Decide a paused run's pending approvals and carry the run on.

        Args:
            flow: the run's flow.
            run_id: the paused run.
            approve: one decision for every pending call, or one per call id.
            ctx: who resumes (checked against the run's identity).
            note: a note stored with the decision.
            max_supersteps: stop after this many supersteps (0: only store the decision,
                and let a worker spend it).
            operator: who decided, signed into the decision (default: this runner's owner name).

        Raises:
            CheckpointConflict: the run is not paused, or another resume won.
            IdentityMismatch: `ctx` is for someone else, or the run's principal is missing.
        """
        result: RunResult[S] = await self.protocol(flow).resume(
            run_id, approve=approve, note=note, ctx=ctx, limit=max_supersteps, operator=operator
        )
        return result

    async def wake(
        self,
        flow: FlowLike[S],
        run_id: str,
        *,
        expected_step: int | None = None,
        ctx: RunContext | None = None,
        now: float | None = None,
        max_supersteps: int | None = None,
    ) -> RunResult[S]:
        """Wake a paused run whose timer is due (a `Wait`, or an approval's deadline), and carry it on.

        The sweepers call this (`wake_due`, `run_timers`, a Celery worker's recover_all);
        call it yourself to wake one run. Of two wakes, one wins.

        Raises:
            NotDue: the run's timer is not due yet (nothing is done).
            CheckpointConflict: the run is not waiting on a timer, or someone woke or resumed it first.
        """
        result: RunResult[S] = await self.protocol(flow).wake(
            run_id, limit=max_supersteps, expected_step=expected_step, ctx=ctx, now=now
        )
        return result

    async def wake_due(self, flow: FlowLike[Any], *, now: float | None = None) -> dict[str, Any]:
        """Wake every paused run of `flow` whose timer is due (one pass); each maps to its result or its error."""
        return await _timers.wake_due(self, flow, now=now)

    async def run_timers(self, flow: FlowLike[Any], *, every_s: float = 1.0) -> None:
        """Wake `flow`'s due runs every `every_s` seconds until cancelled (the in-process sweeper).

        Run it as a task beside your runner (``asyncio.create_task(runner.run_timers(flow))``);
        a run then wakes at most `every_s` after its time.
        """
        await _timers.run_timers(self, flow, every_s=every_s)

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
        children = await waiting_children(self, flow, run_id)
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


def _coerce_state(flow: Flow[S], state: S | Mapping[str, Any]) -> S:
    if isinstance(state, flow.state):
        return state.model_copy(deep=True)
    if isinstance(state, Mapping):
        try:
            return flow.state.model_validate(dict(state))
        except ValidationError as exc:
            raise FlowError(
                f"flow {flow.name!r}: the initial state does not fit {flow.state.__name__}: {exc}"
            ) from None
    raise FlowError(
        f"flow {flow.name!r}: the state must be a {flow.state.__name__} or a dict, not {type(state).__name__}"
    )
