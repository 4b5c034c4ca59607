"""`Runs`: the in-process transport of every verb, on a run of any kind named by its id.

A stored run is a flow run, a tool loop or an agent run: its ``flow`` column holds the
flow's name, or ``loop:<name>`` (`RunKind`). Everything that acts on a stored run by its id
in this process (the workers, the client, the CLI, the viewer, the simulation's operator)
goes through `Runs`, without asking which kind it is:

- `Runs.open(run_id)` reads the run's newest row, checks it, and picks by its column
  (`Runs.of`): a forged column is never trusted. A flow run gets its flow's protocol over
  every version the app has; a loop or an agent gets its runner, built beside the flow
  runner (one store, key ring, hold, event hub and tracer for all).
- The verbs (`Runs.cancel(run_id, ...)` and the rest) are `exec.driven.DrivenRunner`'s,
  written once for every kind, on the protocol `open` picked.
- `Runs.status`, `settle` and `result` read any run the same way (`RunView`: what it is,
  where it stands, what it waits for, what it holds and produced); the kind adds only the
  types its conversation is read as (`RunDriver.typed`).

What one kind cannot do is refused by the protocol with a `FlowError` that says why, from
the kind's driver (`RunDriver.refused`: a tool loop is not retried; only a flow run is
migrated). A loop's model is made on its first use (`agentflow._app.LazyModel`): an
operator who only cancels or decides never builds it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agentflow._app import FlowApp
from agentflow._errors import FlowError, RunFailed, RunNotDone
from agentflow._run_types import RunKind, RunStatus
from agentflow._run_view import RunView, view_of
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.driven import DrivenRunner, ProtocolRunner
from agentflow.exec.run.checks import checked_latest
from agentflow.exec.run.control import parked
from agentflow.exec.run.cursor import RunOutcome
from agentflow.exec.run.protocol import RunProtocol
from agentflow.exec.run.read import read_run
from agentflow.exec.run.view import Waiting, WaitingCall
from agentflow.exec.seal import Sealer
from agentflow.flow import FlowRunner

__all__ = ["RunView", "Runs", "Waiting", "WaitingCall"]


class Runs(DrivenRunner[Any, RunOutcome, str]):
    """The runs of one app over `runner`'s store, each named by its id: the in-process transport of every verb.

    The verbs (recover, resume, wake, decide_in_doubt, retry, cancel, fork, migrate, advance,
    read) are `DrivenRunner`'s, on the protocol of the run's kind, picked from its checked
    newest row (`open`); status, settle and result read any run the same way.
    """

    def __init__(self, app: FlowApp, runner: FlowRunner) -> None:
        """Act on `app`'s flows with `runner`, and on its tool loops beside it (same store, key ring and hold)."""
        self.app, self.runner = app, runner
        self.checkpoints = runner.checkpoints
        self._loops: dict[str, ProtocolRunner[Any, Any]] = {}

    async def _target(self, run_id: str) -> tuple[RunProtocol[Any, RunOutcome], str]:
        return (await self.open(run_id)).protocol, run_id

    def of(self, column: str) -> ProtocolRunner[Any, RunOutcome]:
        """The runs stored under `column` (a flow's name, or ``loop:<name>``): that kind's verbs, by run id.

        Raises:
            FlowError: the app has no such flow or tool loop (the message lists the ones it has).
        """
        if RunKind.of(column) is RunKind.LOOP:
            return self.loop(RunKind.name_of(column))
        flow: ProtocolRunner[Any, Any] = ProtocolRunner(self.runner.protocol(self.app.flow_versions(column)))
        return flow

    def loop(self, name: str) -> ProtocolRunner[Any, Any]:
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

    def _stores(self) -> tuple[CheckpointStore, Sealer]:
        store, sealer = self.runner.checkpoints, self.runner.sealer
        if store is None or sealer is None:
            raise ValueError("acting on stored runs needs a runner with a checkpoint store")
        return store, sealer

    async def column(self, run_id: str) -> str:
        """The run's stored column, trusted only once its newest row checks.

        Raises:
            ValueError: the runner has no store.
            CheckpointNotFound: unknown run.
            CheckpointStoreCorrupt: its newest row fails its check.
        """
        row, _ = await checked_latest(*self._stores(), run_id)
        return row.flow

    # -- reading a run, whatever its kind ------------------------------------------------------

    async def status(self, run_id: str) -> RunView:
        """The run as its checked rows show it (`RunView`): the same view for a flow run, a tool loop and an agent.

        Raises:
            CheckpointNotFound: unknown run.
            CheckpointStoreCorrupt: a row fails its check, or the run does not fit the flow or loop
                the app has under its name.
        """
        return view_of(await read_run(*self._stores(), run_id), self)

    async def settle(self, run_id: str, *, timeout_s: float = 60.0, poll_s: float = 0.05) -> RunView:
        """Wait until the run stopped moving on its own, and return its view then (`RunView.settled`).

        Settled is: ended (done, failed, cancelled), paused (an approval, a timer, child runs), or
        parked on calls in doubt, waiting for a decision. Each poll reads and checks the run's
        newest row only; the whole run is read once that row says it may have settled.

        Raises:
            TimeoutError: it did not settle in `timeout_s` (the message says where it stands).
            CheckpointNotFound: unknown run.
            CheckpointStoreCorrupt: a row fails its check.
        """
        store, sealer = self._stores()
        deadline = time.monotonic() + timeout_s
        while True:
            row, body = await checked_latest(store, sealer, run_id)
            if row.status != RunStatus.RUNNING or parked(body):
                view = await self.status(run_id)
                if view.settled:
                    return view
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id!r} is still {row.status} at step {row.step} after {timeout_s}s")
            await asyncio.sleep(poll_s)

    async def result(self, run_id: str) -> Any:
        """What the run produced: a flow run's final state, a tool loop's last answer, an agent's output.

        It does not wait: `settle` first.

        Raises:
            RunFailed: the run ended failed (`error` says why).
            RunNotDone: the run is not done: it is running, waits for something (the message
                says what: a decision on calls in doubt, an approval, ...), or was cancelled.
            CheckpointNotFound, CheckpointStoreCorrupt: as `status`.
        """
        view = await self.status(run_id)
        if view.status == RunStatus.DONE:
            return view.output
        if view.status == RunStatus.FAILED:
            raise RunFailed(run_id, view.error or "the run ended failed (no error was recorded)")
        if view.waiting is not None:
            why = f"waiting for {view.waiting.why}"
        elif view.status == RunStatus.CANCELLED:
            why = view.error or "cancelled"
        else:
            where = f" on {view.running_on}" if view.running_on else ""
            why = f"at step {view.step}{where}: settle it first"
        raise RunNotDone(run_id, view.status, why)

    async def open(self, run_id: str) -> ProtocolRunner[Any, RunOutcome]:
        """The verbs on the stored run `run_id`'s kind (`of`), picked by its checked newest row.

        Raises:
            CheckpointNotFound, CheckpointStoreCorrupt: as `column`.
            FlowError: the app has no flow or tool loop of that name.
        """
        return self.of(await self.column(run_id))
