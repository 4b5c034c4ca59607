"""Who carries out an action taken in the viewer: this process (`Here`) or the deployment's workers (`Workers`).

`Here` acts as ``agentflow resume``, ``cancel``, ``retry``, ``decide`` + ``recover`` and
``fork --run`` do: with the app's flows, holding the run's lease as ``viewer@<host>:<pid>``,
running the tools that follow in this process. `Workers` stores the same signed decisions
through `agentflow.celery.FlowClient` and leaves every tool call to the workers, so none
runs in the viewer (`ViewerSettings.workers`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentflow import InDoubtDecision
from agentflow._app import FlowApp
from agentflow._errors import CheckpointConflict
from agentflow._events import Events
from agentflow._run_types import RunKind
from agentflow.exec._durable_loop import cancel_tool_loop
from agentflow.exec._run_lease import process_owner
from agentflow.exec._run_view import RunReport
from agentflow.exec.checkpoints._protocol import CheckpointStore
from agentflow.flow._runner import FlowRunner

if TYPE_CHECKING:
    from agentflow.celery import AgentflowTasks, FlowClient


class Operator(ABC):
    """Carries out the viewer's actions on a run; every decision is signed with `operator`.

    Raises (every method): what the runner raises, `RunHeld` and `CheckpointConflict` first.
    """

    #: Whether the tools run elsewhere (the page then says a worker carries the run on).
    distributed = False

    @abstractmethod
    async def resume(self, report: RunReport, *, approve: bool, note: str | None, operator: str) -> None:
        """Approve or deny the paused run's pending calls."""

    @abstractmethod
    async def cancel(self, report: RunReport, *, reason: str, operator: str) -> str:
        """Cancel the run; return its status (``cancelled``, or ``running`` while its holder is asked to stop)."""

    @abstractmethod
    async def retry(self, report: RunReport, *, operator: str) -> None:
        """Retry the failed run from the superstep that failed."""

    @abstractmethod
    async def decide(self, report: RunReport, *, calls: Mapping[str, InDoubtDecision], operator: str) -> None:
        """Store the operator's word on the calls in doubt, then let the run go on."""

    @abstractmethod
    async def fork(self, report: RunReport, *, at_step: int, patch: dict[str, Any] | None, operator: str) -> str:
        """Start a new run from checkpoint `at_step`, its state patched; return the new run's id."""

    async def aclose(self) -> None:  # noqa: B027 - nothing to close unless an operator opened something
        """Close what this operator opened."""


class Here(Operator):
    """Acts in the viewer's own process, with the app's flows, as ``viewer@<host>:<pid>``."""

    def __init__(self, store: CheckpointStore, keys: Sequence[bytes], flows: FlowApp) -> None:
        self.store, self.keys, self.flows = store, list(keys), flows

    def _runner(self) -> FlowRunner:
        # It acts on stored runs the live page may be following: their events go into the runs' streams.
        return self.flows.runner(self.store, self.keys, owner=process_owner("viewer"), events=Events(record=True))

    async def resume(self, report: RunReport, *, approve: bool, note: str | None, operator: str) -> None:
        """See `Operator.resume`: the approved tools run here."""
        await self._runner().resume(
            self.flows.flow(report.flow), report.run_id, approve=approve, note=note, operator=operator
        )

    async def cancel(self, report: RunReport, *, reason: str, operator: str) -> str:
        """See `Operator.cancel` (a tool loop too)."""
        runner = self._runner()
        if report.kind is RunKind.LOOP:
            loop = await cancel_tool_loop(
                report.run_id,
                reason=reason,
                checkpoints=self.store,
                checkpoint_key=self.keys,
                operator=operator,
                name=report.name,
                owner=runner.ownership.owner,
            )
            return str(loop.status)
        result = await runner.cancel(self.flows.flow(report.flow), report.run_id, reason=reason, operator=operator)
        return str(result.status)

    async def retry(self, report: RunReport, *, operator: str) -> None:
        """See `Operator.retry`: the failed calls run again here."""
        await self._runner().retry(self.flows.flow(report.flow), report.run_id, operator=operator)

    async def decide(self, report: RunReport, *, calls: Mapping[str, InDoubtDecision], operator: str) -> None:
        """See `Operator.decide`: the decision is stored, then the run is recovered here (``decide`` + ``recover``)."""
        runner, flow = self._runner(), self.flows.flow(report.flow)
        await runner.decide_in_doubt(flow, report.run_id, calls=calls, operator=operator)
        try:
            await runner.recover(flow, report.run_id, operator=operator)
        except CheckpointConflict:
            pass  # a worker took the run since (or a rival recovered it): the stored decision is theirs to spend

    async def fork(self, report: RunReport, *, at_step: int, patch: dict[str, Any] | None, operator: str) -> str:
        """See `Operator.fork`: the new run runs here, up to its end or a pause."""
        runner = self._runner()
        result = await runner.fork(
            self.flows.flow(report.flow), report.run_id, at_step=at_step, patch=patch, operator=operator
        )
        return result.run_id


class Workers(Operator):
    """Stores each decision in this process and leaves the tools to the deployment's workers (`FlowClient`)."""

    distributed = True

    def __init__(self, tasks: AgentflowTasks) -> None:
        from agentflow.celery import FlowClient  # lazily: the celery extra is optional

        worker = tasks.worker
        # The client's own runner, so that what it saves here names the viewer as its holder.
        runner = worker.flow_app.runner(
            worker.store, worker.checkpoint_key, lease_s=worker.settings.lease_s, owner=process_owner("viewer")
        )
        self.client: FlowClient = FlowClient(tasks, runner)

    async def resume(self, report: RunReport, *, approve: bool, note: str | None, operator: str) -> None:
        """See `Operator.resume`: a worker runs the approved calls."""
        await self.client.resume(report.run_id, approve=approve, note=note, operator=operator)

    async def cancel(self, report: RunReport, *, reason: str, operator: str) -> str:
        """See `Operator.cancel`."""
        return await self.client.cancel(report.run_id, reason=reason, operator=operator)

    async def retry(self, report: RunReport, *, operator: str) -> None:
        """See `Operator.retry`: a worker runs the failed superstep again."""
        await self.client.retry(report.run_id, operator=operator)

    async def decide(self, report: RunReport, *, calls: Mapping[str, InDoubtDecision], operator: str) -> None:
        """See `Operator.decide`: the client enqueues the worker that spends the decision."""
        await self.client.decide_in_doubt(report.run_id, calls=calls, operator=operator)

    async def fork(self, report: RunReport, *, at_step: int, patch: dict[str, Any] | None, operator: str) -> str:
        """See `Operator.fork`: a worker runs the new run."""
        return await self.client.fork(report.run_id, at_step=at_step, patch=patch, operator=operator)

    async def aclose(self) -> None:
        """Close this event loop's connection of the workers' store."""
        store = self.client.runner.checkpoints
        if store is not None:
            await store.aclose()
