"""`InProcess`: an `Operator` that acts in this process, with the app's flows and tool loops."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentflow._app import FlowApp
from agentflow._errors import CheckpointConflict
from agentflow._events import Events
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.run.control import InDoubtDecision
from agentflow.exec.run.lease import process_owner
from agentflow.operate._operator import Acted, Operator
from agentflow.runs import Runs

__all__ = ["InProcess"]


class InProcess(Operator):
    """Acts here: holds each run as ``<name>@<host>:<pid>`` and runs what follows the action in this process."""

    def __init__(
        self,
        app: FlowApp,
        store: CheckpointStore,
        keys: bytes | Sequence[bytes],
        *,
        name: str = "operator",
        events: Events | None = None,
    ) -> None:
        """Act on `app`'s runs in `store`, signed with `keys` (newest first).

        Args:
            app: the deployment's flows, tool loops and tools.
            store: the checkpoint store the runs are in.
            keys: the key ring (newest first) the runs are signed with.
            name: names this process in leases and checkpoints (``<name>@<host>:<pid>``).
            events: the hub the runs report to (default: one that records into each run's
                stream, so that whoever follows a run sees what this process did to it).
        """
        self.events = events if events is not None else Events(record=True)
        self.runner = app.runner(store, keys, owner=process_owner(name), events=self.events)
        self.runs = Runs(app, self.runner)

    async def resume(
        self, run_id: str, *, approve: bool | Mapping[str, bool], note: str | None = None, operator: str | None = None
    ) -> Acted:
        """See `Operator.resume`: the approved calls run here."""
        run = await self.runs.open(run_id)
        return Acted.of(await run.resume(run_id, approve=approve, note=note, operator=operator))

    async def cancel(self, run_id: str, *, reason: str, operator: str | None = None) -> Acted:
        """See `Operator.cancel`."""
        run = await self.runs.open(run_id)
        return Acted.of(await run.cancel(run_id, reason=reason, operator=operator))

    async def retry(self, run_id: str, *, operator: str | None = None) -> Acted:
        """See `Operator.retry`: the failed calls run again here."""
        run = await self.runs.open(run_id)
        return Acted.of(await run.retry(run_id, operator=operator))

    async def decide(
        self,
        run_id: str,
        *,
        calls: Mapping[str, InDoubtDecision] | None = None,
        operator: str | None = None,
        carry_on: bool = True,
    ) -> int:
        """See `Operator.decide`: with `carry_on`, the run is then recovered here."""
        run = await self.runs.open(run_id)
        step = await run.decide_in_doubt(run_id, calls=calls, operator=operator)
        if carry_on:
            try:
                await run.recover(run_id, operator=operator)
            except CheckpointConflict:
                pass  # a worker took the run since (or a rival recovered it): the stored decision is theirs to spend
        return step

    async def recover(self, run_id: str, *, rerun_in_doubt: bool = False, operator: str | None = None) -> Acted:
        """See `Operator.recover`: the run goes on here."""
        run = await self.runs.open(run_id)
        return Acted.of(await run.recover(run_id, rerun_in_doubt=rerun_in_doubt, operator=operator))

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
        """See `Operator.fork`: with `run`, the new run runs here to its end or first pause."""
        ops = await self.runs.open(run_id)
        forked = await ops.fork(
            run_id,
            at_step=at_step,
            new_run_id=new_run_id,
            patch=patch,
            operator=operator,
            max_supersteps=None if run else 0,
        )
        return Acted.of(forked)
