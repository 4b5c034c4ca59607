"""`LoopOperations`: the tool-loop half of `FlowClient` (start, read, wait for and resume a loop on the workers).

As for flows, the client saves each decision itself, signed, and the message that follows
carries ids only; a worker spends the decision once. Tool loops have no versions: their
messages go to the deployment's queue.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from agentflow._identity import RunContext
from agentflow._run_types import RunKind
from agentflow._runs import Runs
from agentflow.celery._tasks import AgentflowTasks
from agentflow.exec import LoopResult
from agentflow.models import Message


class LoopOperations(ABC):
    """Tool loops through the workers (a mixin of `FlowClient`, which provides `tasks`, `runs` and `_awaiting`)."""

    tasks: AgentflowTasks
    runs: Runs

    @abstractmethod
    async def _awaiting(self, run_id: str) -> str | None:
        """What a parked run waits for a decision about, or None."""

    async def start_loop(
        self, name: str, messages: Sequence[Message], *, run_id: str | None = None, ctx: RunContext | None = None
    ) -> str:
        """Save a tool loop's step 0 (its messages) and enqueue its first stage; return the run id.

        Raises:
            FlowError: no loop has that name.
            ValueError: `ctx` carries a principal.
        """
        if ctx is not None and ctx.principal is not None:
            raise ValueError("distributed runs cannot carry a principal: workers get ids only, never credentials")
        loop = self.runs.loop(name)
        max_steps = self.runs.app.loops[name].max_steps
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
        return await self.runs.loop(name).read(run_id)

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
        assert decided.step is not None
        await asyncio.to_thread(self.tasks.send_superstep, RunKind.LOOP.column(name), run_id, decided.step, "resume")
        return decided.step
