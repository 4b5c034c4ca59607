"""One run's operations whatever its kind, and the one place a run's kind is decided.

A stored run is a flow run or a tool loop: its ``flow`` column holds the flow's name, or
``loop:<name>`` (`RunKind`). Everything that acts on a stored run (the workers and the
client, the CLI, the viewer, the simulation's operator) asks `Runs` for the run's
`RunOps` and calls it, without asking which kind it is:

- `Runs.of(column)` picks by the column: a flow run gets `FlowOps` (a `FlowRunner` bound to
  every version of the flow the app has), a tool loop gets the loop's `LoopRunner`, built
  beside the flow runner (one store, key ring, hold, event hub and tracer for both).
  All of them are `exec.driven.DrivenRunner`s: the operations every kind shares are
  written once there, over the kind's protocol, and `RunOps` names that shape.
- `Runs.open(run_id)` reads the run's newest row, checks it, and then picks by its column:
  a forged column is never trusted.

What one kind cannot do is refused by that kind's operation with a `FlowError` that says
why (a tool loop is not retried; only a flow run is migrated: the others have no versions).
A loop's model is made on its first use (`agentflow._app.LazyModel`): an operator who only
cancels or decides never builds it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from agentflow._app import FlowApp
from agentflow._errors import FlowError
from agentflow._run_types import RunKind
from agentflow.exec.driven import DrivenRunner
from agentflow.exec.run.checks import checked_latest
from agentflow.exec.run.cursor import RunOutcome
from agentflow.flow import FlowRunner, FlowVersions, RunResult

__all__ = ["FlowOps", "RunOps", "Runs"]


class FlowOps(DrivenRunner[Any, RunResult[Any]]):
    """The operations on the runs of one flow: a `FlowRunner` bound to every version of it the app has.

    What every kind of run shares (advance, recover, resume, wake, decide_in_doubt, retry,
    fork, read) is `DrivenRunner`'s, over the flow's protocol; what only a flow run has goes
    through the runner: a cancel that takes the child runs the run waits for along, and
    migrate.
    """

    noun = "flow run"

    def __init__(self, runner: FlowRunner, flows: FlowVersions[Any]) -> None:
        self.runner, self.flows = runner, flows
        self.checkpoints = runner.checkpoints
        self.protocol = runner.protocol(flows)

    async def cancel(self, run_id: str, *, reason: str, operator: str | None = None) -> RunResult[Any]:
        """See `FlowRunner.cancel`."""
        return await self.runner.cancel(self.flows, run_id, reason=reason, operator=operator)

    def fresh_run_id(self) -> str:
        """A new unguessable run id (`FlowRunner.fresh_run_id`)."""
        return self.runner.fresh_run_id()

    async def migrate(
        self,
        run_id: str,
        *,
        to_version: str | None = None,
        state: Callable[[dict[str, Any]], BaseModel | Mapping[str, Any]] | None = None,
        at: str | None = None,
        operator: str | None = None,
        max_supersteps: int | None = None,
    ) -> RunResult[Any]:
        """See `FlowRunner.migrate`."""
        return await self.runner.migrate(
            self.flows,
            run_id,
            to_version=to_version,
            state=state,
            at=at,
            operator=operator,
            max_supersteps=max_supersteps,
        )


#: What can be done to a stored run of any kind (a flow's `FlowOps`, a loop's `LoopRunner`, an agent's runner).
RunOps = DrivenRunner[Any, RunOutcome]


class Runs:
    """The runs of one app over `runner`'s store: each run's operations, picked by its kind in one place."""

    def __init__(self, app: FlowApp, runner: FlowRunner) -> None:
        """Act on `app`'s flows with `runner`, and on its tool loops beside it (same store, key ring and hold)."""
        self.app, self.runner = app, runner
        self._loops: dict[str, DrivenRunner[Any, Any]] = {}

    def of(self, column: str) -> RunOps:
        """The operations on runs stored under `column` (a flow's name, or ``loop:<name>``).

        Raises:
            FlowError: the app has no such flow or tool loop (the message lists the ones it has).
        """
        if RunKind.of(column) is RunKind.LOOP:
            return self.loop(RunKind.name_of(column))
        return FlowOps(self.runner, self.app.flow_versions(column))

    def loop(self, name: str) -> DrivenRunner[Any, Any]:
        """The runner of the tool loop `name` (a `LoopRunner`, or a durable agent's), built on first use.

        Raises:
            FlowError: the app has no tool loop `name`.
        """
        if name not in self._loops:
            spec = self.app.loops.get(name)
            if spec is None:
                known = ", ".join(sorted(self.app.loops)) or "none"
                raise FlowError(f"unknown tool loop {name!r} (this app has: {known})")
            self._loops[name] = spec.runner_beside(self.runner, name)
        return self._loops[name]

    async def column(self, run_id: str) -> str:
        """The run's stored column, trusted only once its newest row checks.

        Raises:
            ValueError: the runner has no store.
            CheckpointNotFound: unknown run.
            CheckpointStoreCorrupt: its newest row fails its check.
        """
        store, sealer = self.runner.checkpoints, self.runner.sealer
        if store is None or sealer is None:
            raise ValueError("acting on stored runs needs a runner with a checkpoint store")
        row, _ = await checked_latest(store, sealer, run_id)
        return row.flow

    async def open(self, run_id: str) -> RunOps:
        """The operations on the stored run `run_id`, picked by its checked newest row.

        Raises:
            CheckpointNotFound, CheckpointStoreCorrupt: as `column`.
            FlowError: the app has no flow or tool loop of that name.
        """
        return self.of(await self.column(run_id))
