"""`FlowClient`: what a web app or script uses to start, watch and resume distributed runs.

It writes step 0 itself (so the message carries only ids), enqueues the first superstep,
and reads status and results from the checkpoint store, never from Celery results.
"""

from __future__ import annotations

__all__ = ["FlowClient", "RunView"]

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol, cast

from pydantic import BaseModel

from agentflow._app import LoopSpec
from agentflow._errors import CheckpointConflict, FlowError, RunHeld
from agentflow._identity import RunContext
from agentflow._run_types import RunKind
from agentflow._run_view import RunView
from agentflow.celery._task_states import ASKED
from agentflow.celery._tasks import AgentflowTasks
from agentflow.exec import LoopRunner
from agentflow.exec.checkpoints import SealedCheckpoint
from agentflow.exec.run.checks import checked_latest
from agentflow.exec.run.control import InDoubtDecision
from agentflow.exec.run.cursor import RunOutcome
from agentflow.exec.run.events import RunEvent, follow_events
from agentflow.exec.run.lease import held_by, process_owner
from agentflow.exec.run.markers import Markers
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
    """Starts, follows and acts on the runs Celery workers carry out: flow runs, tool loops and agent runs alike.

    Only the starts differ by kind (`start`, `start_loop`, `start_agent`: a state, messages or
    a prompt); every other verb takes a run id and works for any kind.
    """

    def __init__(self, tasks: AgentflowTasks, runner: FlowRunner | None = None, *, name: str | None = None) -> None:
        """Build a client.

        Args:
            tasks: the handles `register_tasks` returned (on the client's copy of the app).
            runner: a runner over the same store and key as the workers (it only saves
                step 0 and decisions; it never runs a superstep). Default: the one the
                registered tasks would use.
            name: instead of `runner`, hold runs and sign decisions as ``<name>@<host>:<pid>``
                (a runner of the client's own over the workers' store and key ring: what the
                CLI and the viewer use).
        """
        if runner is None and name is not None:
            worker = tasks.worker
            runner = worker.flow_app.runner(
                worker.store, worker.checkpoint_key, lease_s=worker.settings.lease_s, owner=process_owner(name)
            )
        runner = runner or tasks.worker.runner
        if runner.checkpoints is None:
            raise ValueError("FlowClient needs a runner with the workers' checkpoint store")
        self.tasks = tasks
        self.runner = runner
        self.flow_app = tasks.worker.flow_app
        #: Every run's operations and reads (flow runs, tool loops and agents alike), held as the client's runner.
        self.runs = Runs(self.flow_app, runner)
        #: Checks the rows the client reads itself (events, a recovery's head), under the workers' key ring.
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

    async def aclose(self) -> None:
        """Close this event loop's connection of the workers' store."""
        store = self.runner.checkpoints
        if store is not None:
            await store.aclose()

    async def _send(self, flow: str, run_id: str, step: int, cause: str, version: str | None = None) -> None:
        """Enqueue a superstep of the run (to its version's queue, when the version is known)."""
        await asyncio.to_thread(self.tasks.send_superstep, flow, run_id, step, cause, version=version)

    async def status(self, run_id: str) -> RunView:
        """Read the run from the store (every row of it checked): the same view for any kind of run.

        A flow run, a tool loop and an agent run alike say what they are (`RunView.kind`,
        `name`), where they stand, what they wait for (`RunView.waiting`: a decision on calls in
        doubt, an approval, a timer, child runs, the store's durability), what they hold (a
        flow's state, a loop's or an agent's messages) and, once done, their output. See
        `agentflow.runs.Runs.status`.

        Raises:
            CheckpointNotFound: unknown run.
            CheckpointStoreCorrupt: a row fails its check, or the run does not fit the flow or loop
                the client's app has under its name.
        """
        return await self.runs.status(run_id)

    async def settle(self, run_id: str, *, timeout_s: float = 60.0, poll_s: float = 0.05) -> RunView:
        """Wait until the run, of any kind, settled (ended, paused, or parked waiting for a decision); its view then.

        Each poll reads the run's newest row and checks it (see `agentflow.runs.Runs.settle`).

        Raises:
            TimeoutError: it did not settle in time.
            CheckpointNotFound: unknown run.
            CheckpointStoreCorrupt: a row fails its check.
        """
        return await self.runs.settle(run_id, timeout_s=timeout_s, poll_s=poll_s)

    async def result(self, run_id: str) -> Any:
        """What the run produced: a flow run's final state, a tool loop's last answer, an agent's output.

        It does not wait (`settle` first); see `agentflow.runs.Runs.result`.

        Raises:
            RunFailed: the run ended failed.
            RunNotDone: it is not done; the message says what it waits for (or that it was cancelled).
        """
        return await self.runs.result(run_id)

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
        and the result is ``cancelled``; no superstep is needed (the run is final, and any
        message still queued for it finds it ended), only, when the run waited for a person,
        a ``mark_answered`` message for Flower's sake. A run a worker is moving gets a signed
        cancel request instead: the result is its status now (``running``), and that worker
        ends it ``cancelled`` before its next call (`wait` for it).

        Raises:
            CheckpointConflict: the run already ended.
        """
        assert self.runner.checkpoints is not None
        status = str((await self.runs.cancel(run_id, reason=reason, operator=operator)).status)
        if status == "cancelled" and await Markers(self.runner.checkpoints, self.sealer).peek(ASKED, [run_id]):
            # the task that asked a person about the run is answered: a worker says so in Flower (`_task_states`)
            await asyncio.to_thread(self.tasks.send_mark_answered, run_id)
        return status

    async def retry(self, run_id: str, *, operator: str | None = None) -> int:
        """Retry a failed run from the superstep (stage) that failed; a worker runs it. Returns the retry's step.

        The retry's claim is saved here, signed with `operator` (see `FlowRunner.retry`);
        the message that follows only points at it.

        Raises:
            CheckpointConflict: the run did not fail (`RunHeld`: a live worker holds it).
            RecoveryNeedsDecision: a call of that superstep is in doubt and may not rerun.
            FlowError: the run is a tool loop (a loop fails only at its step budget, which a retry would reach again).
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
        """Start a new run from checkpoint `at_step` of `run_id`, with the history up to it; a worker runs it.

        Any kind of run forks (see `DrivenRunner.fork`): a flow run from that checkpoint's state
        (with `patch`), a tool loop or an agent run from that stage's messages. Step 0 of the new
        run is saved here; the message carries ids only. Returns the new run's id.

        Raises:
            CheckpointNotFound: the run has no checkpoint at that step.
            FlowError: the patch does not fit (a loop or an agent takes none).
            CheckpointConflict: `new_run_id` is taken.
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
        `agentflow.integrations.pydantic_ai`). Follow it with `settle` or `events`, and read
        it as any run (`status`, `result`). A start retried with the same `run_id`, prompt, `deps_data` and
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

    def _loop_runner(self, name: str) -> LoopRunner:
        """The `LoopRunner` of loop `name`; a loop another engine drives (an agent) is refused with what to use."""
        runner = self.runs.loop(name)
        if not isinstance(runner, LoopRunner):
            raise FlowError(
                f"loop {name!r} is a {runner.protocol.driver.noun}, not a tool loop started from messages: "
                "start it with start_agent"
            )
        return runner
