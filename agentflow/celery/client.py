"""`FlowClient`: what a web app or script uses to start, watch and resume distributed runs.

It writes step 0 itself (so the message carries only ids), enqueues the first superstep,
and reads status and results from the checkpoint store, never from Celery results.
"""

from __future__ import annotations

__all__ = ["FlowClient", "RunView"]

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol, cast

from pydantic import BaseModel

from agentflow._app import LoopSpec
from agentflow._errors import CheckpointConflict, CheckpointStoreCorrupt, FlowError, RunHeld
from agentflow._identity import RunContext
from agentflow._run_types import DEFAULT_VERSION, RunKind
from agentflow.celery._task_states import ANSWERED, answered, settle
from agentflow.celery._tasks import AgentflowTasks
from agentflow.celery._view import RunView
from agentflow.exec import ApprovalRequest, LoopResult, LoopRunner
from agentflow.exec.checkpoints import SealedCheckpoint
from agentflow.exec.run.checks import checked_latest
from agentflow.exec.run.control import InDoubtDecision, control_of, parked
from agentflow.exec.run.cursor import RunOutcome
from agentflow.exec.run.events import RunEvent, follow_events
from agentflow.exec.run.lease import held_by
from agentflow.exec.run.markers import Markers
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer
from agentflow.flow import FlowRunner
from agentflow.models import Message
from agentflow.runs import Runs


class _StartsFromPrompt(Protocol):
    """A loop started from a prompt (a durable agent's runner)."""

    async def start(
        self,
        prompt: str,
        *,
        run_id: str | None = None,
        deps_data: Mapping[str, Any] | None = None,
        ctx: RunContext | None = None,
    ) -> RunOutcome: ...


class FlowClient:
    """Starts and follows runs, flow runs and tool loops, that Celery workers carry out."""

    def __init__(self, tasks: AgentflowTasks, runner: FlowRunner | None = None) -> None:
        """Build a client.

        Args:
            tasks: the handles `register_tasks` returned (on the client's copy of the app).
            runner: a runner over the same store and key as the workers (it only saves
                step 0 and decisions; it never runs a superstep). Default: the one the
                registered tasks would use.
        """
        runner = runner or tasks.worker.runner
        if runner.checkpoints is None:
            raise ValueError("FlowClient needs a runner with the workers' checkpoint store")
        self.tasks = tasks
        self.runner = runner
        self.flow_app = tasks.worker.flow_app
        #: Every run's operations (flows and tool loops alike), held as the client's runner.
        self.runs = Runs(self.flow_app, runner)
        #: Checks every row `status` reads, under the workers' key ring.
        self.sealer = Sealer(tasks.worker.checkpoint_key)

    async def start(
        self,
        flow_name: str,
        state: BaseModel | Mapping[str, Any],
        *,
        run_id: str | None = None,
        ctx: RunContext | None = None,
    ) -> str:
        """Save the run's step 0 and enqueue its first superstep; return the run id.

        A start retried with the same `run_id`, flow, state and `ctx` (its first try raised,
        `StoreNotDurable` among the errors, or its answer was lost) attaches to the run the
        first try stored instead of starting a second (`RunProtocol.begin`), and sends its
        first superstep again (a worker that finds the run moved on does nothing).

        Raises:
            FlowError: unknown flow, or a state that does not fit.
            ValueError: `ctx` carries a principal (credentials never travel to workers).
            CheckpointConflict: the run id is taken by another run, or by one started with other input.
            StoreNotDurable: the store could not confirm step 0 in time: the run may exist and
                goes on if it does; retry with the same `run_id`.
        """
        if ctx is not None and ctx.principal is not None:
            raise ValueError("distributed runs cannot carry a principal: workers get ids only, never credentials")
        flows = self.flow_app.flow_versions(flow_name)
        result = await self.runner.start(flows, state, run_id=run_id, ctx=ctx)  # on the newest version
        await self._send(flow_name, result.run_id, 0, "start", result.version)
        return result.run_id

    async def _send(self, flow: str, run_id: str, step: int, cause: str, version: str | None = None) -> None:
        """Enqueue a superstep of the run (to its version's queue, when the version is known)."""
        await asyncio.to_thread(self.tasks.send_superstep, flow, run_id, step, cause, version=version)

    async def status(self, run_id: str) -> RunView:
        """Read the run from the store through the run read model (every row of it checked).

        Raises:
            CheckpointNotFound: unknown run.
            CheckpointStoreCorrupt: a row fails its check, or the state does not fit the flow.
            FlowError: the run is a tool loop (see `loop_status`), or its flow is not in the app.
        """
        assert self.runner.checkpoints is not None
        report = await read_run(self.runner.checkpoints, self.sealer, run_id)
        if report.corrupt:
            raise CheckpointStoreCorrupt("; ".join(report.problems))
        if report.kind is RunKind.LOOP:
            raise FlowError(f"run {run_id!r} is a tool loop: read it with loop_status({report.name!r}, {run_id!r})")
        version = report.version or DEFAULT_VERSION
        flow = self.flow_app.flow_versions(report.flow).get(version)
        try:
            state = report.state if flow is None else flow.state.model_validate(report.state)
            pending = [ApprovalRequest(p["call_id"], p["tool"], p["args"], p["node"]) for p in report.pending]
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointStoreCorrupt(
                f"run {run_id!r} is signed but does not fit flow {report.flow!r} version {version!r}: {exc}"
            ) from None
        waiting = "; ".join(f"{tool}: {why}" for tool, why in report.awaiting) or None
        return RunView(
            run_id,
            report.flow,
            report.status,
            report.step,
            state,
            pending,
            report.error,
            waiting,
            report.running_on,
            report.segments,
            version,
            flow is None,
            in_doubt=list(report.in_doubt),
        )

    async def events(self, run_id: str, after: str | None = None, *, poll_s: float = 0.2) -> AsyncIterator[RunEvent]:
        """Follow the run's event stream from any process: each event after cursor `after`, until the run ends.

        Each `RunEvent` carries its ``cursor``: give the last one seen as `after` to resume,
        after a disconnect, with the next event (none lost, none repeated). Events are
        checked under the workers' key; one that is not shows as a ``problem``, never as data.
        The store must keep event streams (every store agentflow ships does).

        Raises:
            ValueError: `after` is not a cursor of this store.
        """
        assert self.runner.checkpoints is not None
        async for event in follow_events(self.runner.checkpoints, self.sealer, run_id, after, poll_s=poll_s):
            yield event

    async def _awaiting(self, run_id: str) -> str | None:
        """What a parked run waits for a decision about (from its signed latest checkpoint), or None."""
        assert self.runner.checkpoints is not None
        _, body = await checked_latest(self.runner.checkpoints, self.sealer, run_id)
        awaiting = control_of(body).awaiting if parked(body) else ()
        return "; ".join(f"{tool}: {why}" for tool, why in awaiting) or None

    async def settle(self, run_id: str, *, timeout_s: float = 60.0, poll_s: float = 0.05) -> str:
        """Poll the store until the run, a flow run or a tool loop, settled; return its status then.

        Settled is what `wait` waits for: ended, paused, or parked waiting for a decision
        (then the status is ``running``). Each poll reads the run's newest row and checks it.

        Raises:
            TimeoutError: it did not settle in time.
            CheckpointNotFound: unknown run.
            CheckpointStoreCorrupt: its newest row fails its check.
        """
        store = self.runner.checkpoints
        assert store is not None
        deadline = time.monotonic() + timeout_s
        while True:
            row, body = await checked_latest(store, self.sealer, run_id)
            if row.status != "running" or parked(body):
                return row.status
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id!r} is still {row.status} at step {row.step} after {timeout_s}s")
            await asyncio.sleep(poll_s)

    async def wait(self, run_id: str, *, timeout_s: float = 60.0, poll_s: float = 0.05) -> RunView:
        """Poll the store until the run is settled (ended, paused, or waiting for a decision).

        Raises:
            TimeoutError: it did not settle in time.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            view = await self.status(run_id)
            if view.settled:
                return view
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id!r} is still {view.status} at step {view.step} after {timeout_s}s")
            await asyncio.sleep(poll_s)

    async def resume(
        self,
        run_id: str,
        *,
        approve: bool | Mapping[str, bool],
        note: str | None = None,
        ctx: RunContext | None = None,
        operator: str | None = None,
    ) -> int:
        """Store the decision on a paused run (one of racing resumes wins), then enqueue its superstep.

        The decision is a signed claim saved here, with `operator` (who decided); the
        message only points at it, and a worker spends it once.

        Raises:
            CheckpointConflict: the run is not paused, or another resume won.
        """
        column = await self.runs.column(run_id)
        result = await self.runs.of(column).resume(
            run_id, approve=approve, note=note, ctx=ctx, max_supersteps=0, operator=operator
        )
        assert result.step is not None
        await self._send(column, run_id, result.step, "resume", result.version)
        return result.step

    async def cancel(self, run_id: str, *, reason: str, operator: str | None = None) -> str:
        """Cancel a run (or tool loop); return its status as it stands after the request.

        A run no live worker holds is cancelled here: a signed claim (see `FlowRunner.cancel`),
        and the result is ``cancelled``; no message is needed (the run is final, and any
        message still queued for it finds it ended). A run a worker is moving gets a signed
        cancel request instead: the result is its status now (``running``), and that worker
        ends it ``cancelled`` before its next call (`wait` for it).

        Raises:
            CheckpointConflict: the run already ended.
        """
        assert self.runner.checkpoints is not None
        run = await self.runs.open(run_id)
        status = str((await run.cancel(run_id, reason=reason, operator=operator)).status)
        if status == "cancelled":  # the task that asked a person about the run (if one did) is answered
            asking = await answered(Markers(self.runner.checkpoints, self.sealer), run_id)
            result = {"run_id": run_id, "answered_by": "cancel"}
            await asyncio.to_thread(settle, self.tasks.superstep.app, asking, ANSWERED, result)
        return status

    async def retry(self, run_id: str, *, operator: str | None = None) -> int:
        """Retry a failed flow run from the superstep that failed; a worker runs it. Returns the retry's step.

        The retry's claim is saved here, signed with `operator` (see `FlowRunner.retry`);
        the message that follows only points at it.

        Raises:
            CheckpointConflict: the run did not fail (`RunHeld`: a live worker holds it).
            RecoveryNeedsDecision: a call of that superstep is in doubt and may not rerun.
            FlowError: the run is a tool loop (not retried through the client yet).
        """
        column = await self.runs.column(run_id)
        result = await self.runs.of(column).retry(run_id, operator=operator, max_supersteps=0)
        assert result.step is not None
        await self._send(column, run_id, result.step, "retry", result.version)
        return result.step

    async def migrate(
        self,
        run_id: str,
        *,
        to_version: str | None = None,
        state: Callable[[dict[str, Any]], BaseModel | Mapping[str, Any]] | None = None,
        at: str | None = None,
        operator: str | None = None,
    ) -> int:
        """Move an unfinished run onto another version of its flow (default: the newest); a worker carries it on.

        See `FlowRunner.migrate`: the state is mapped by `state` and validated against the
        target version, the run goes on from `at` (or where it was), and the move is a signed
        claim naming `operator`, saved here. The message that follows goes to the target
        version's queue and only points at the claim. Returns the claim's step.

        Raises:
            FlowError: the version is not in the client's app, the state or node does not fit,
                or calls finished in the step the run would go on with.
            CheckpointConflict: the run ended (`RunHeld`: a live worker holds it).
        """
        column = await self.runs.column(run_id)
        result = await self.runs.of(column).migrate(
            run_id, to_version=to_version, state=state, at=at, operator=operator, max_supersteps=0
        )
        assert result.step is not None
        await self._send(column, run_id, result.step, "migrate", result.version)
        return result.step

    async def fork(
        self,
        run_id: str,
        *,
        at_step: int,
        new_run_id: str | None = None,
        patch: Mapping[str, Any] | None = None,
        operator: str | None = None,
    ) -> str:
        """Start a new run from checkpoint `at_step` of `run_id`, its state patched; a worker runs it.

        See `FlowRunner.fork`. Step 0 of the new run is saved here; the message carries ids only.
        Returns the new run's id.
        """
        column = await self.runs.column(run_id)
        result = await self.runs.of(column).fork(
            run_id, at_step=at_step, new_run_id=new_run_id, patch=patch, operator=operator, max_supersteps=0
        )
        await self._send(column, result.run_id, 0, "start", result.version)
        return result.run_id

    async def recover(self, run_id: str, *, rerun_in_doubt: bool = False, operator: str | None = None) -> int | None:
        """Enqueue the recovery of a run (or tool loop) that no live worker holds; a worker carries it on.

        The message grants nothing (cause ``recover``): the worker replays the finished calls
        and reruns a call in doubt only if its tool is idempotent or a signed decision covers
        it, else it parks the run for a decision. With `rerun_in_doubt`, that decision is
        saved here first, as `decide_in_doubt` without `calls` saves it (every call in doubt
        reruns; a signed claim naming `operator`), and the message (cause ``rerun``) only
        points at it; a run with no call in doubt is recovered as without it.

        Returns:
            The step the worker starts from, or None when nothing was enqueued because the
            run is paused (it waits for an approval: `resume` it).

        Raises:
            CheckpointNotFound: unknown run.
            RunHeld: a live worker holds the run: it is running there, and is not touched.
            CheckpointConflict: the run already ended.
            CheckpointStoreCorrupt: its latest checkpoint fails its check.
        """
        row = await self._unheld(run_id)
        if row is None:
            return None
        if rerun_in_doubt:
            try:
                step = await self.runs.of(row.flow).decide_in_doubt(run_id, operator=operator)
            except RunHeld:
                raise
            except CheckpointConflict:  # no call in doubt (or the run moved since): a plain recovery
                row = await self._unheld(run_id)
                if row is None:
                    return None
            else:
                await self._send(row.flow, run_id, step, "rerun")
                return step
        await self._send(row.flow, run_id, row.step, "recover")
        return row.step

    async def _unheld(self, run_id: str) -> SealedCheckpoint | None:
        """The run's latest checkpoint (checked) if it is running and nobody holds it; None if it is paused.

        Raises:
            RunHeld: a live worker holds the run.
            CheckpointConflict: the run already ended.
        """
        assert self.runner.checkpoints is not None
        store = self.runner.checkpoints
        row, _ = await checked_latest(store, self.sealer, run_id)  # its flow column and status, checked
        lease = (await held_by(store, [run_id])).get(run_id)
        if lease is not None:
            raise RunHeld(run_id, lease.owner, lease.expires_at)
        if row.status == "paused":
            return None
        if row.status != "running":
            raise CheckpointConflict(f"run {run_id!r} already ended ({row.status}); there is nothing to recover")
        return row

    async def decide_in_doubt(
        self,
        run_id: str,
        *,
        calls: Mapping[str, InDoubtDecision] | None = None,
        operator: str | None = None,
    ) -> int:
        """After checking the calls in doubt at their systems, say what happened and let the run go on.

        Per call id: `Rerun()`, `Happened(result)` or `DidNotHappen(reason)` (see
        `FlowRunner.decide_in_doubt`); without `calls`, every call in doubt reruns. The
        decision is a signed claim saved here, naming `operator`; the message that follows
        only points at it, and a worker spends it. Returns the decision's step.

        Raises:
            CheckpointConflict: the run is not running or has no call in doubt (`RunHeld`:
                a live worker holds it: its calls are running, not in doubt).
            ValueError: `calls` does not decide exactly the calls in doubt, or a result
                does not fit its tool's return type.
        """
        column = await self.runs.column(run_id)
        step = await self.runs.of(column).decide_in_doubt(run_id, calls=calls, operator=operator)
        await self._send(column, run_id, step, "rerun")
        return step

    async def start_loop(
        self, name: str, messages: Sequence[Message], *, run_id: str | None = None, ctx: RunContext | None = None
    ) -> str:
        """Save a tool loop's step 0 (its messages) and enqueue its first stage; return the run id.

        A start retried with the same `run_id`, messages and `ctx` attaches to the loop the
        first try stored and sends its first stage again, as `start` does for a flow run.

        Raises:
            FlowError: no loop has that name.
            ValueError: `ctx` carries a principal.
            CheckpointConflict: the run id is taken by another run, or by a loop started with other input.
            StoreNotDurable: the store could not confirm step 0 in time: retry with the same `run_id`.
        """
        if ctx is not None and ctx.principal is not None:
            raise ValueError("distributed runs cannot carry a principal: workers get ids only, never credentials")
        spec = self.runs.app.loops.get(name)
        loop = self._loop_runner(name)
        max_steps = spec.max_steps if isinstance(spec, LoopSpec) else 10
        started = await loop.start(messages, run_id=run_id, max_steps=max_steps, ctx=ctx)
        await asyncio.to_thread(self.tasks.send_superstep, RunKind.LOOP.column(name), started.run_id, 0, "start")
        return started.run_id

    async def loop_status(self, name: str, run_id: str) -> LoopResult:
        """Read a tool loop from the store (history checked).

        Raises:
            FlowError: no loop has that name.
            CheckpointNotFound: unknown run.
            CheckpointStoreCorrupt: a checkpoint or the history chain fails its check.
        """
        return await self._loop_runner(name).read(run_id)

    async def start_agent(
        self,
        name: str,
        prompt: str,
        *,
        run_id: str | None = None,
        deps_data: Mapping[str, Any] | None = None,
        ctx: RunContext | None = None,
    ) -> str:
        """Save a durable agent's step 0 (its prompt) and enqueue its first stage; return the run id.

        The agent is a loop the app registers (``FlowApp(loops={"support": DurableAgent(...)})``,
        `agentflow.integrations.pydantic_ai`). Follow it with `settle` or `events`, read it
        with `agent_result`. A start retried with the same `run_id`, prompt, `deps_data` and
        `ctx` attaches to the run the first try stored and sends its first stage again, as
        `start` does for a flow run.

        Raises:
            FlowError: no loop has that name, or it is a tool loop (see `start_loop`).
            ValueError: no prompt, `deps_data` is not JSON, or `ctx` carries a principal.
            CheckpointConflict: the run id is taken by another run, or by one started with other input.
            StoreNotDurable: the store could not confirm step 0 in time: retry with the same `run_id`.
        """
        if ctx is not None and ctx.principal is not None:
            raise ValueError("distributed runs cannot carry a principal: workers get ids only, never credentials")
        runner = self.runs.loop(name)
        if isinstance(runner, LoopRunner):
            raise FlowError(f"loop {name!r} is a tool loop started from messages: start it with start_loop")
        starts = cast(_StartsFromPrompt, runner)
        started = await starts.start(prompt, run_id=run_id, deps_data=deps_data, ctx=ctx)
        await asyncio.to_thread(self.tasks.send_superstep, RunKind.LOOP.column(name), started.run_id, 0, "start")
        return started.run_id

    async def agent_result(self, name: str, run_id: str) -> RunOutcome:
        """Read a durable agent's run from the store (an `AgentResult`: messages, usage, output; history checked).

        Raises:
            FlowError: no loop has that name.
            CheckpointNotFound: unknown run.
            CheckpointStoreCorrupt: a checkpoint or the history chain fails its check.
        """
        result: RunOutcome = await self.runs.loop(name).read(run_id)
        return result

    def _loop_runner(self, name: str) -> LoopRunner:
        """The `LoopRunner` of loop `name`; a loop another engine drives (an agent) is refused with what to use."""
        runner = self.runs.loop(name)
        if not isinstance(runner, LoopRunner):
            raise FlowError(
                f"loop {name!r} is a {runner.noun}, not a tool loop started from messages: "
                "start it with start_agent and read it with agent_result"
            )
        return runner

    async def wait_loop(self, name: str, run_id: str, *, timeout_s: float = 60.0, poll_s: float = 0.05) -> LoopResult:
        """Poll until the loop ended, paused, or waits for a decision.

        Raises:
            TimeoutError: it did not settle in time.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            result = await self.loop_status(name, run_id)
            if result.status != "running" or await self._awaiting(run_id):
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"loop {run_id!r} is still running after {timeout_s}s")
            await asyncio.sleep(poll_s)

    async def resume_loop(
        self,
        name: str,
        run_id: str,
        *,
        approve: bool | Mapping[str, bool],
        note: str | None = None,
        ctx: RunContext | None = None,
        operator: str | None = None,
    ) -> int:
        """Store the decision on a tool loop paused for approval, then enqueue its next stage.

        Returns the step the loop goes on from. The decision is a compare-and-set save: of
        racing decisions one wins, and a worker spends it (an approved call runs once).

        Raises:
            FlowError: no loop has that name.
            CheckpointConflict: the loop is not paused, or another decision won.
            ValueError: `approve` maps call ids and leaves a pending call undecided.
        """
        decided = await self.runs.loop(name).resume(
            run_id, approve=approve, note=note, ctx=ctx, max_supersteps=0, operator=operator
        )
        step = decided.step
        assert isinstance(step, int)
        await asyncio.to_thread(self.tasks.send_superstep, RunKind.LOOP.column(name), run_id, step, "resume")
        return step
