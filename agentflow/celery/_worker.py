"""What a worker does for each task, as plain async code (the Celery wiring is in `_tasks`).

- `superstep`: take the run's lease (a live holder means: do nothing; the run's checkpoint
  and call log are read meanwhile), claim the run with a new segment unless it was handed
  over cleanly (`FlowRunner.advance`), run or replay one superstep, save, release the
  lease (and the decision marker with it). The caller enqueues the next superstep after
  that. A duplicate or late message finds the run at another step (`Stale`) or leased,
  and does nothing.
- `recover_all`: under a lock, find every unfinished run that nobody holds, that is not
  paused or waiting for a decision, and whose last save is older than `stale_after_s`;
  return them so the caller enqueues a superstep for each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentflow._app import FlowApp, LoopSpec
from agentflow._errors import CheckpointConflict, FlowError, RecoveryNeedsDecision, Stale
from agentflow._identity import RunContext
from agentflow._run_types import RunKind
from agentflow.celery._lease import Leases
from agentflow.exec._durable_loop import LoopResult, advance_tool_loop, decide_tool_loop
from agentflow.exec._durable_read import read_head
from agentflow.exec._run_sweep import relist_forgotten
from agentflow.exec.checkpoints._protocol import CheckpointStore
from agentflow.flow._runner import FlowRunner
from agentflow.models._protocol import Model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSettings:
    """How distributed runs are paced and guarded."""

    lease_s: float = 30.0
    """A run's lease lapses this long after its worker stopped renewing it."""
    stale_after_s: float = 10.0
    """recover_all leaves runs saved more recently than this alone (a handoff in flight)."""
    recover_lock_s: float = 60.0
    """How long one recover_all may hold the lock (a dead holder blocks recovery this long)."""
    recover_interval_s: float | None = 60.0
    """Beat period of recover_all (None: no beat entry)."""
    time_limit_s: int = 900
    """Hard time limit of one superstep task."""
    soft_time_limit_s: int = 840
    """Soft time limit of one superstep task."""
    queue: str = "agentflow"
    """Queue of the superstep tasks."""
    max_retries: int = 3
    """Retries of a task whose pool process died."""
    sweep_forgotten: bool = False
    """recover_all also scans the stored rows for runs the listing index forgot, and lists them again.

    The index is unsigned: someone who can write to the store can delete a run's entry and
    strand it silently. The scan reads every run id of the store (a Redis SCAN, a SQL
    ``SELECT DISTINCT``), so turn it on where that is cheap enough at the beat's interval.
    """

    def __post_init__(self) -> None:
        if self.soft_time_limit_s >= self.time_limit_s:
            raise ValueError("soft_time_limit_s must be below time_limit_s")
        if self.lease_s >= self.time_limit_s:
            raise ValueError("lease_s must be below time_limit_s (the lease is renewed while a superstep runs)")


@dataclass
class Outcome:
    """What a superstep task did (returned as the task's result, so Flower shows it)."""

    run_id: str
    flow: str
    done: str
    """``ran``, ``skipped``, ``decision`` (calls in doubt) or ``conflict``."""
    status: str | None = None
    step: int | None = None
    replayed: list[str] = field(default_factory=list)
    rerun: list[str] = field(default_factory=list)
    why: str | None = None

    @property
    def next_step(self) -> int | None:
        """The step the next superstep starts from, if the run goes on."""
        return self.step if self.done == "ran" and self.status == "running" else None

    def cut_off(self, cause: str) -> bool:
        """Whether this superstep, sent with `cause`, found a cut-off one (it replayed or reran calls).

        After a resume, replays are the paused superstep's finished calls, not a sign of
        one; a rerun always is.
        """
        return bool(self.rerun) or (bool(self.replayed) and cause != "resume")

    def as_dict(self) -> dict[str, Any]:
        """JSON form (the task's result)."""
        return {k: v for k, v in self.__dict__.items() if v not in (None, [])}


class Worker:
    """The state one worker process keeps: its runner, store and leases."""

    def __init__(
        self,
        flow_app: FlowApp,
        store_factory: Callable[[], CheckpointStore],
        checkpoint_key: bytes | Sequence[bytes],
        leases: Leases,
        settings: WorkerSettings,
    ) -> None:
        self.flow_app = flow_app
        self.loops = flow_app.loops
        self._models: dict[str, Model] = {}
        self.leases = leases
        self.settings = settings
        self._store_factory = store_factory
        self.checkpoint_key = checkpoint_key
        self._runner: FlowRunner | None = None

    @property
    def runner(self) -> FlowRunner:
        """This process's runner (made on first use, in the process that uses it)."""
        if self._runner is None:
            self._runner = self.flow_app.runner(self._store_factory(), self.checkpoint_key)
        return self._runner

    @property
    def store(self) -> CheckpointStore:
        """This process's store."""
        store = self.runner.checkpoints
        assert store is not None
        return store

    def loop(self, name: str) -> LoopSpec:
        """The tool loop called `name`.

        Raises:
            FlowError: no loop has that name.
        """
        try:
            return self.loops[name]
        except KeyError:
            known = ", ".join(sorted(self.loops)) or "none"
            raise FlowError(f"unknown tool loop {name!r} (registered: {known})") from None

    def _model(self, name: str) -> Model:
        if name not in self._models:
            self._models[name] = self.loop(name).model_factory()
        return self._models[name]

    async def decide_loop(
        self,
        name: str,
        run_id: str,
        approve: bool | Mapping[str, bool],
        note: str | None = None,
        ctx: RunContext | None = None,
    ) -> LoopResult:
        """Store the decision on the tool loop `name` paused for approval (see `decide_tool_loop`)."""
        return await decide_tool_loop(
            self.loop(name).registry,
            run_id,
            approve=approve,
            note=note,
            checkpoints=self.store,
            checkpoint_key=self.checkpoint_key,
            ctx=ctx,
            name=name,
        )

    async def superstep(self, flow_name: str, run_id: str, step: int, *, handoff: bool) -> Outcome:
        """Run one superstep of the run (one stage of a loop) under its lease.

        Calls in doubt rerun only when their tools are idempotent, or when an operator's
        decision to rerun them is recorded for this step (`Leases.allow_rerun`); whichever
        message next advances the run spends it. A message alone grants nothing.
        """
        head: asyncio.Future[Any] | None = None
        if RunKind.of(flow_name) is RunKind.LOOP:
            name = RunKind.name_of(flow_name)

            def advance(granted: bool) -> Coroutine[Any, Any, Any]:
                return advance_tool_loop(
                    self._model(name),
                    self.loop(name).registry,
                    run_id,
                    checkpoints=self.store,
                    checkpoint_key=self.checkpoint_key,
                    expected_step=step,
                    handoff=handoff,
                    rerun_in_doubt=granted,
                    name=name,
                )

        else:
            flow = self.flow_app.flow(flow_name)
            # Read the run's head while the lease is being taken: two round trips in flight at
            # once. Read before the lease is held, the head may be a step behind; then the
            # first record (its position is taken) or the save (its step is taken) is refused.
            head = asyncio.ensure_future(read_head(self.store, run_id))

            def advance(granted: bool) -> Coroutine[Any, Any, Any]:
                return self.runner.advance(
                    flow, run_id, expected_step=step, rerun_in_doubt=granted, handoff=handoff, head=head
                )

        try:
            return await self._under_lease(flow_name, run_id, step, advance)
        finally:
            if head is not None and not head.done():
                head.cancel()
            elif head is not None and not head.cancelled():
                head.exception()  # retrieved, so an unused failure is not reported as lost

    async def _under_lease(
        self, flow_name: str, run_id: str, step: int, advance: Callable[[bool], Coroutine[Any, Any, Any]]
    ) -> Outcome:
        async with self.leases.hold(run_id) as held:
            if held is None:
                return Outcome(run_id, flow_name, "skipped", why="another worker holds the run's lease")
            try:
                try:
                    result = await advance(False)
                except RecoveryNeedsDecision as exc:
                    # Raised before anything was written: with a recorded decision, go again rerunning.
                    if not await self.leases.take_rerun(run_id, step):
                        await self.leases.mark_decision(run_id, exc.calls)
                        return Outcome(run_id, flow_name, "decision", why=str(exc))
                    result = await advance(True)
            except Stale as exc:
                return Outcome(run_id, flow_name, "skipped", why=str(exc))
            except CheckpointConflict as exc:
                return Outcome(run_id, flow_name, "conflict", why=str(exc))
            held.clear_decision = True  # it moved on: no decision is awaited any more
        return Outcome(
            run_id, flow_name, "ran", str(result.status), result.step, result.replayed, result.rerun, result.error
        )

    async def stranded(self) -> list[tuple[str, str, int]] | None:
        """Unfinished runs nobody works on, as ``(flow, run_id, step)``; None if another recover_all runs."""
        async with self.leases.lock("recover_all", self.settings.recover_lock_s) as got:
            if not got:
                return None
            found: list[tuple[str, str, int]] = []
            now = time.time()
            columns = [*self.flow_app.flows, *(RunKind.LOOP.column(n) for n in self.loops)]
            if self.settings.sweep_forgotten and self.runner.sealer is not None:
                for lost in await relist_forgotten(self.store, self.runner.sealer, columns):
                    log.warning("run %s was missing from the store's listing index: %s", lost.run_id, lost.why)
            for name in columns:
                run_ids = list(await self.store.list_unfinished(name))
                busy = await self.leases.leased(run_ids)
                for run_id in run_ids:
                    if run_id in busy:
                        continue
                    row = await self.store.latest(run_id)
                    if row.status == "running" and now - row.saved_at >= self.settings.stale_after_s:
                        found.append((name, run_id, row.step))
            return found
