"""What a worker does for each task, as plain async code (the Celery wiring is in `_tasks`).

- `superstep`: advance the run by one superstep through the run protocol
  (`FlowRunner.advance`), which holds the run's lease in the checkpoint store while it
  works: a live holder means nothing happens (`RunHeld`; the outcome says when that lease
  ends, so the caller can look again then). Unless it was handed over cleanly the run is
  claimed with a new segment. A run whose calls in doubt need a decision is parked with
  a signed claim. The caller enqueues the next superstep. A duplicate or late message
  finds the run at another step (`Stale`) or held, and does nothing. A worker that could
  not confirm its lease before a tool (`LeaseLost`: it stalled past it) ran nothing more,
  and its outcome asks for a recheck at once: the run may be nobody's now.
- A message that may be all that is left of a worker that died (a ``recheck``, or one
  delivered again after its worker was lost) and finds the run moved on, running, not
  parked and held by nobody, asks for a ``recover`` for when the run counts as stranded
  (`Outcome.stranded_at`): the worker that saved that step may have died before it sent the
  next message (a pool process killed between the save and the send). The run's next
  message, if it went out, moves it first and that recover finds it moved on: it sends
  nothing more, so no chain of messages follows a run.
- Control messages grant nothing: a superstep sent to spend a resume or an operator's
  decision (causes ``resume`` and ``rerun``) runs only if the run's latest checkpoint is
  a signed claim of that kind. Anything else (a forged message, a decision signed with
  another key) is refused: logged at WARNING, emitted as a ``control.refused`` event,
  and the run is left as it was.
- A message about a run on a flow version this worker lacks touches nothing: the outcome
  (``elsewhere``) names the version, and the caller sends the message on to that version's
  queue (`_routing`).
- `stranded`: under the recover_all lease, sort every unfinished run (`_sweep`): the ones
  nobody holds, that are running (not paused, not parked), whose latest checkpoint checks,
  and whose last save is older than `stale_after_s`, are to be recovered; on a worker's
  start, also the runs held by someone, with the time each lease ends, so each is looked
  at again right then; runs on a flow version this worker lacks are listed as needing
  migration; a run sent a recovery that did not move since waits out a back-off
  (`_resends`). A run whose latest checkpoint fails its check, and a stranded run of a flow
  the app does not know, are reported once (WARNING, an event, the task's result) and
  marked in the store (`agentflow.exec.run.quarantine`); a run that checks again loses
  its marker.
- `prune`: one tick of the retention beat (`retention.prune_tick`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentflow._app import FlowApp
from agentflow._errors import (
    CheckpointConflict,
    CheckpointError,
    CheckpointNotFound,
    CheckpointStoreCorrupt,
    ControlRefused,
    LeaseLost,
    RecoveryNeedsDecision,
    RunHeld,
    Stale,
    StoreNotDurable,
    StoreRefused,
    VersionNotDeployed,
)
from agentflow._events import Events
from agentflow._run_types import version_of
from agentflow.celery._children import QueuedChildren, Send
from agentflow.celery._markers import LOCK, worker_markers
from agentflow.celery._rechecks import first_to_watch
from agentflow.celery._resends import Resends, base_of
from agentflow.celery._retention import prune_tick
from agentflow.celery._settings import WorkerSettings
from agentflow.celery._store_waits import ttl_s as store_wait_ttl_s
from agentflow.celery._stranded import Stranded
from agentflow.celery._sweep import sweep
from agentflow.celery._task_states import answered, asked, lost_tasks
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.forwarding import ForwardingStore, StoreHook
from agentflow.exec.context import delivering
from agentflow.exec.run.checks import checked_latest
from agentflow.exec.run.control import parked
from agentflow.exec.run.lease import held_by
from agentflow.exec.run.markers import MarkerBusy, Markers
from agentflow.exec.run.store_waits import clear_store_wait, note_store_wait
from agentflow.exec.seal import Sealer
from agentflow.exec.tracing import NO_TRACING, Tracer
from agentflow.flow import FlowRunner
from agentflow.runs import Runs

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What a superstep task did (returned as the task's result, so Flower shows it)."""

    run_id: str
    flow: str
    done: str
    """``ran``, ``skipped``, ``decision`` (calls in doubt), ``conflict``, ``refused`` (a control
    message no signed decision backs, or a row that fails its check), ``elsewhere`` (the
    run's flow version is not here: the message goes on to a worker that has it) or
    ``not_durable`` (the store could not confirm a write the superstep needed: `StoreNotDurable`;
    the superstep stopped before what needed it, and its task is sent again after a back-off)."""
    status: str | None = None
    step: int | None = None
    replayed: list[str] = field(default_factory=list)
    rerun: list[str] = field(default_factory=list)
    why: str | None = None
    held_until: float | None = None
    """When the lease of the live holder that kept this superstep from running ends."""
    version: str | None = None
    """The version of the run's flow (None: a tool loop, or not read): its messages go to that version's queue."""
    parent: str | None = None
    """The parent run that started this one as a child (its end wakes the parent)."""
    in_doubt: list[str] = field(default_factory=list)
    """The calls in doubt a ``decision`` outcome parked the run on (their ids)."""
    stranded_at: float | None = None
    """When the run, found moved on to `step` and at rest with nobody holding it, counts as stranded: a
    ``recover`` is due then (set only for a message that may be all that is left of a worker that died)."""

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


#: The marker that lets one of many concurrent recover_alls do the work: ``lock/recover_all``.
RECOVER_ALL_LOCK = (LOCK, "recover_all")

#: What each control cause must find signed in the run's latest checkpoint.
SPENDS = {"resume": "resume", "rerun": "decision", "retry": "retry", "migrate": "migrate"}


class Worker:
    """The state one worker process keeps: its runner and store."""

    def __init__(
        self,
        flow_app: FlowApp,
        store_factory: Callable[[], CheckpointStore],
        checkpoint_key: bytes | Sequence[bytes],
        settings: WorkerSettings,
    ) -> None:
        self.flow_app = flow_app
        self.loops = flow_app.loops
        self.settings = settings
        #: Makes the store, never hooked: the runner's store gets the hooks, and the prune tick opens one of its own.
        self._store_factory = store_factory
        #: What runs around each operation of this process's store (timing, tracing; `hook_store`).
        self._store_hooks: list[StoreHook] = []
        self.checkpoint_key = checkpoint_key
        self._runner: FlowRunner | None = None
        self._runs: Runs | None = None
        #: Every run this process drives reports here (made before the pool forks: see agentflow.observe).
        self.events = Events(record=True)  # any process can follow a run the workers move
        #: Where its runs report spans (off; `agentflow.observe.celery.trace_worker` sets one before the first task).
        self.tracer: Tracer = NO_TRACING
        #: The Celery node name (``name@host``) the tasks run under, set by the first task.
        self.node = f"agentflow@{socket.gethostname()}"
        #: Enqueues a superstep (`AgentflowTasks.send_superstep`, set when the tasks are registered).
        self.send: Send | None = None
        #: When the recover_all lock that kept this process's last sweep out lapses unless renewed (None: it ran).
        self.sweep_locked_until: float | None = None

    @property
    def owner(self) -> str:
        """This process's name in leases and checkpoints: ``<node>:<pid>``."""
        return f"{self.node}:{os.getpid()}"

    @property
    def runner(self) -> FlowRunner:
        """This process's runner (made on first use, in the process that uses it)."""
        if self._runner is None:
            store = self._store_factory()
            self._runner = self.flow_app.runner(
                ForwardingStore(store, self._store_hooks) if self._store_hooks else store,
                self.checkpoint_key,
                lease_s=self.settings.lease_s,
                owner=self.owner,
                events=self.events,
                tracer=self.tracer,
            )
            if self.send is not None:  # a `Child` node's run is left to the queue, never driven inside a superstep
                self._runner.children = QueuedChildren(self.send)
        return self._runner

    @property
    def runs(self) -> Runs:
        """This process's runs, flows and tool loops alike, held as `owner` (`agentflow.runs`)."""
        if self._runs is None:
            self._runs = Runs(self.flow_app, self.runner)
        return self._runs

    async def parent_waiting(self, parent: str) -> tuple[str, int, str] | None:
        """``(flow, step, version)`` of a parent run paused for its children, to send it a wake (None: it is not)."""
        try:
            row, body = await checked_latest(self.store, self.sealer, parent)
        except (CheckpointNotFound, CheckpointStoreCorrupt):
            return None
        wake = body.get("wake") if row.status == "paused" else None
        if not isinstance(wake, dict) or wake.get("for") != "child":
            return None
        return row.flow, row.step, version_of(body)

    def hook_store(self, hook: StoreHook) -> None:
        """Run `hook` around each operation of the store this process makes (timing, tracing); only before the runner.

        However many hooks, the store is wrapped once (`ForwardingStore`), the first hook outermost.
        """
        if self._runner is not None:
            raise RuntimeError("the worker's store exists already: hook it before the first task")
        self._store_hooks.append(hook)

    @property
    def store(self) -> CheckpointStore:
        """This process's store."""
        store = self.runner.checkpoints
        assert store is not None
        return store

    @property
    def markers(self) -> Markers:
        """The store's markers, signed and checked under the workers' key ring."""
        return worker_markers(self.store, self.sealer, self.settings, self.events)

    @property
    def sealer(self) -> Sealer:
        """Checks and signs rows under the workers' key ring."""
        sealer = self.runner.sealer
        assert sealer is not None
        return sealer

    def refuse(self, flow_name: str, run_id: str, step: int, cause: str, why: str) -> Outcome:
        """Log and report a control message or a row that was refused; the run is left as it was."""
        log.warning(
            "refused to act on run %s (a %s message, step %s): %s",
            run_id,
            cause,
            step,
            why,
            extra={"run_id": run_id, "step": step},
        )
        self.runner.events.emit("control.refused", run_id, flow=flow_name, step=step, cause=cause, why=why)
        return Outcome(run_id, flow_name, "refused", why=why)

    async def superstep(
        self,
        flow_name: str,
        run_id: str,
        step: int,
        *,
        handoff: bool,
        cause: str = "next",
        message: str | None = None,
        again: bool = False,
    ) -> Outcome:
        """Run one superstep of the run (one stage of a loop) under its lease.

        Calls in doubt rerun only when their tools are idempotent, or when an operator's
        signed decision covers them (`decide_in_doubt`). A message alone grants nothing.
        `message`: the id of the task served (each ``started`` record names it: `_task_states`).
        `again`: the message is delivered again after its worker was lost (redelivered, or
        retried when its pool process died): if it finds the run moved on, the run is looked at
        for being left without a message, as by a recheck (`Outcome.stranded_at`).
        """
        with delivering(message):
            return await self._superstep(flow_name, run_id, step, handoff=handoff, cause=cause, again=again)

    async def _superstep(
        self, flow_name: str, run_id: str, step: int, *, handoff: bool, cause: str, again: bool
    ) -> Outcome:
        spend = SPENDS.get(cause)
        run = self.runs.of(flow_name)

        def advance() -> Coroutine[Any, Any, Any]:
            if cause == "wake":  # a timer the sweep found due: checked against the run's signed wake time
                return run.wake(run_id, expected_step=step, max_supersteps=1)
            # The run protocol reads the run's head with the lease's take (`run.lease`).
            return run.advance(run_id, expected_step=step, handoff=handoff, park=True, spend=spend)

        outcome = await self._advance(flow_name, run_id, step, cause, advance)
        if outcome.done == "stale":  # a late or duplicate message; or the last one of a worker that died
            outcome.done = "skipped"
            if again or cause == "recheck":
                await self._at_rest(outcome)
        if outcome.done == "not_durable":  # a claim not acknowledged may be stored: the next try starts from it
            outcome.step = await self._latest_step(run_id, step)
        if outcome.held_until is not None and cause == "recheck" and not await self._still_at(run_id, step):
            outcome.held_until = None  # the run moved on since: its new holder's messages look after it
        if outcome.held_until is not None and not await self.watch(run_id, outcome.held_until):
            outcome.held_until = None  # another worker's recheck is due for this lease already
        return outcome

    async def asked(self, run_id: str, task_id: str, state: str) -> None:
        """Note that task `task_id` asked a person about the run (`_task_states.asked`)."""
        await asked(self.markers, run_id, task_id, state)

    async def answered(self, run_id: str) -> list[str]:
        """The tasks that asked a person about the run, now answered (`_task_states.answered`)."""
        return await answered(self.markers, run_id)

    async def lost_tasks(self, outcome: Outcome, own: str) -> dict[str, str | None]:
        """Each task (not `own`) that began a call `outcome` replayed, reran or parked on: the process it ran in."""
        calls = {*outcome.replayed, *outcome.rerun, *outcome.in_doubt}
        return await lost_tasks(self.store, self.sealer, outcome.run_id, calls, own)

    def lease_ends(self, expires_at: float) -> float:
        """When a lease read from the store ends, as far as this worker waits for it.

        `expires_at`, but no later than one lease of this worker's own from now: a lease is
        never taken or renewed for longer, so one that says it ends later was not written by a
        worker (someone wrote it to the store), and no recheck waits for it longer than that.
        """
        return min(expires_at, time.time() + self.settings.lease_s)

    async def watch(self, run_id: str, lease_ends: float) -> bool:
        """Whether this worker sends the recheck of a held run (`_rechecks`: one per lease)."""
        return await first_to_watch(self.markers, run_id, self.owner, lease_ends, self.settings.lease_s)

    async def _at_rest(self, outcome: Outcome) -> None:
        """Note when the run of `outcome`, found moved on, counts as stranded, if it is running, not parked and unheld.

        Its step and flow version go into `outcome` with it (the recover's step and queue). A
        row that fails its check is left to the sweep, which reports it.
        """
        try:
            row, body = await checked_latest(self.store, self.sealer, outcome.run_id)
        except (CheckpointNotFound, CheckpointStoreCorrupt):
            return
        if row.status != "running" or parked(body) or await held_by(self.store, [outcome.run_id]):
            return
        outcome.step, outcome.version = row.step, version_of(body)
        outcome.stranded_at = row.saved_at + self.settings.stale_after_s

    async def _latest_step(self, run_id: str, otherwise: int) -> int:
        """The run's latest step as the store has it now (`otherwise` if it cannot be read)."""
        try:
            return (await self.store.latest(run_id)).step
        except CheckpointError:
            return otherwise

    async def _still_at(self, run_id: str, step: int) -> bool:
        """Whether the run's latest checkpoint is still `step` (a held run a recheck should look at again)."""
        try:
            return (await self.store.latest(run_id)).step == step
        except CheckpointNotFound:
            return False

    async def _advance(
        self, flow_name: str, run_id: str, step: int, cause: str, advance: Callable[[], Coroutine[Any, Any, Any]]
    ) -> Outcome:
        try:
            result = await advance()
        except RunHeld as exc:
            return Outcome(run_id, flow_name, "skipped", why=str(exc), held_until=self.lease_ends(exc.expires_at))
        except VersionNotDeployed as exc:  # nothing was touched: a worker with that version carries it on
            return Outcome(run_id, flow_name, "elsewhere", why=str(exc), version=exc.version)
        except RecoveryNeedsDecision as exc:
            return Outcome(run_id, flow_name, "decision", why=str(exc), in_doubt=list(exc.call_ids))
        except Stale as exc:  # reported as skipped (`_superstep`)
            return Outcome(run_id, flow_name, "stale", why=str(exc))
        except ControlRefused as exc:
            return self.refuse(flow_name, run_id, step, cause, str(exc))
        except StoreNotDurable as exc:  # what needed the write did not happen: the task is sent again after a back-off
            return Outcome(run_id, flow_name, "not_durable", why=str(exc), step=step)
        except LeaseLost as exc:  # its tool did not run, and the run may be nobody's now: a recheck looks at once
            return Outcome(run_id, flow_name, "conflict", why=str(exc), held_until=time.time())
        except CheckpointConflict as exc:
            return Outcome(run_id, flow_name, "conflict", why=str(exc))
        except CheckpointStoreCorrupt as exc:
            return self.refuse(flow_name, run_id, step, cause, str(exc))
        return Outcome(
            run_id,
            flow_name,
            "ran",
            str(result.status),
            result.step,
            result.replayed,
            result.rerun,
            result.error,
            version=getattr(result, "version", None),  # a flow run's (a tool loop has none)
            parent=getattr(result, "parent", None),
        )

    async def wait_for_store(self, outcome: Outcome, retry_at: float | None) -> None:
        """Leave the run's ``store-wait`` marker: it waits for its store's durability (`run.store_waits`).

        Best effort: the store that could not confirm a write may fail this one too (a WARNING says so).
        """
        ttl_s = store_wait_ttl_s(self.settings, None if retry_at is None else retry_at - time.time())
        try:
            await note_store_wait(self.markers, outcome.run_id, outcome.step or 0, outcome.why or "", retry_at, ttl_s)
        except Exception as exc:
            log.warning("run %s: could not note that it waits for its store: %s", outcome.run_id, exc)

    async def stopped_waiting_for_store(self, run_id: str) -> None:
        """Remove the run's ``store-wait`` marker, if any (a superstep of it ran). Best effort."""
        try:
            await clear_store_wait(self.markers, run_id)
        except Exception as exc:
            log.warning("run %s: could not remove its store-wait marker: %s", run_id, exc)

    async def refusal_at_start(self) -> str | None:
        """Why this worker must not start on its store (`StoreRefused`: it keeps less than the settings ask), or None.

        A store made by the worker's own factory reads one run, as every task's first read
        does: the store's server check runs then. A store that cannot be reached now is only
        warned about (the tasks say so as they come); one that refuses its server is not.
        """
        store = self._store_factory()
        try:
            await store.latest("agentflow-start-check")
        except CheckpointNotFound:
            pass
        except StoreRefused as exc:
            return str(exc)
        except CheckpointError as exc:
            log.warning("the checkpoint store did not answer the worker's start-up check: %s", exc)
        finally:
            await store.aclose()
        return None

    async def prune(self) -> dict[str, Any]:
        """One tick of the retention beat: prune, then trim, what `WorkerSettings.retention()` no longer keeps."""
        return await prune_tick(self._store_factory, self.settings, self.owner, self.sealer)

    @property
    def resends(self) -> Resends:
        """The recovery markers: a run sent a recovery that has not moved since waits out a back-off."""
        return Resends(self.markers, base_of(self.settings), self.owner)

    async def mark_recoveries(self, found: Stranded) -> None:
        """Mark each run of `found.recover` as sent a recovery (after the messages went out)."""
        for _, run_id, step, _ in found.recover:
            await self.resends.mark(run_id, step, found.marks.get(run_id))

    async def stranded(self, *, startup: bool = False) -> Stranded | None:
        """Unfinished runs nobody works on (and, on `startup`, the held ones); None if another recover_all runs."""
        try:  # renewed while the sweep works, so a dead sweeper's lock lapses soon
            async with self.markers.holding(*RECOVER_ALL_LOCK, self.owner, self.settings.recover_lock_s):
                self.sweep_locked_until = None
                return await sweep(self, startup)
        except MarkerBusy as busy:  # raised by the take alone (the sweep puts markers, never holds one)
            self.sweep_locked_until = busy.holder.expires_at
            return None
