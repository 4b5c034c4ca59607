"""`ThroughWorkers`: an `Operator` that stores each decision here and leaves the tools to the workers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentflow._errors import FlowError
from agentflow.exec.run.control import InDoubtDecision
from agentflow.exec.run.lease import process_owner
from agentflow.operate._operator import Acted, Operator

if TYPE_CHECKING:
    from agentflow.celery import AgentflowTasks, FlowClient

__all__ = ["ThroughWorkers"]


class ThroughWorkers(Operator):
    """Saves each signed decision in this process and sends the message a worker spends it on (`FlowClient`)."""

    distributed = True

    def __init__(self, tasks: AgentflowTasks, *, name: str = "operator") -> None:
        """Act through the deployment whose tasks are `tasks` (its store, key ring, flows and queue).

        Args:
            tasks: what the workers registered (``workers.celery_app:tasks`` in the runnable deployment).
            name: names this process in the leases and checkpoints it saves (``<name>@<host>:<pid>``).
        """
        from agentflow.celery import FlowClient  # lazily: the celery extra is optional

        worker = tasks.worker
        runner = worker.flow_app.runner(
            worker.store, worker.checkpoint_key, lease_s=worker.settings.lease_s, owner=process_owner(name)
        )
        #: The client every action goes through.
        self.client: FlowClient = FlowClient(tasks, runner)
        self.runs = self.client.runs

    async def resume(
        self, run_id: str, *, approve: bool | Mapping[str, bool], note: str | None = None, operator: str | None = None
    ) -> Acted:
        """See `Operator.resume`: a worker runs the approved calls."""
        step = await self.client.resume(run_id, approve=approve, note=note, operator=operator)
        return Acted(run_id, "running", step)

    async def cancel(self, run_id: str, *, reason: str, operator: str | None = None) -> Acted:
        """See `Operator.cancel`."""
        status = await self.client.cancel(run_id, reason=reason, operator=operator)
        return Acted(run_id, status, None)

    async def retry(self, run_id: str, *, operator: str | None = None) -> Acted:
        """See `Operator.retry`: a worker runs the failed superstep again."""
        step = await self.client.retry(run_id, operator=operator)
        return Acted(run_id, "running", step)

    async def decide(
        self,
        run_id: str,
        *,
        calls: Mapping[str, InDoubtDecision] | None = None,
        operator: str | None = None,
        carry_on: bool = True,
    ) -> int:
        """See `Operator.decide`: a worker spends the decision (the message is sent either way).

        Raises:
            FlowError: not `carry_on` (through the workers, a stored decision is always spent at once).
        """
        if not carry_on:
            raise FlowError("through the workers a decision is always carried on: a worker spends it at once")
        return await self.client.decide_in_doubt(run_id, calls=calls, operator=operator)

    async def recover(self, run_id: str, *, rerun_in_doubt: bool = False, operator: str | None = None) -> Acted | None:
        """See `Operator.recover`: a worker carries the run on."""
        step = await self.client.recover(run_id, rerun_in_doubt=rerun_in_doubt, operator=operator)
        return None if step is None else Acted(run_id, "running", step)

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
        """See `Operator.fork`: a worker runs the new run (`run` False is refused: a worker always does).

        Raises:
            FlowError: not `run`.
        """
        if not run:
            raise FlowError("through the workers a forked run is always carried on by a worker")
        new_id = await self.client.fork(run_id, at_step=at_step, new_run_id=new_run_id, patch=patch, operator=operator)
        return Acted(new_id, "running", 0)

    async def aclose(self) -> None:
        """Close this event loop's connection of the workers' store."""
        store = self.client.runner.checkpoints
        if store is not None:
            await store.aclose()
