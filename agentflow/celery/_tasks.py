"""`register_tasks`: adds agentflow's tasks to a user's Celery app (no global app, no shared_task).

Tasks (messages carry ids only: flow name, run id, step; never state or secrets):
- ``agentflow.start_run`` / ``agentflow.superstep`` ``(flow, run_id, step, cause)``: one
  superstep; enqueues the next one when the run goes on.
- ``agentflow.recover_superstep`` (same arguments, same body): a superstep (or a loop stage)
  sent to recover a run, with the cause ``recover``, ``recheck`` or ``rerun``; its own name
  so that Flower lists recoveries apart.
- ``agentflow.loop_stage`` ``(loop:<name>, run_id, step, cause)``: one stage of a tool loop
  (a model call, or one round of tools), then the next.
- ``agentflow.resume`` ``(flow, run_id, step)``: spend the decision stored at `step` of a
  run or tool loop (``loop:<name>``). The decision itself is a signed claim that a process
  holding the checkpoint key saved (`FlowClient.resume`, the CLI, the viewer); a message
  that points at anything else is refused, so a message alone approves nothing.
- ``agentflow.recover_all`` ``(startup=False)``: enqueue a superstep for every stranded
  run, and a ``wake`` for every paused run whose signed timer is due (so a waiting run costs
  no message until then); on a worker's start, also a ``recheck`` for every held run, due
  when its lease ends, and a ``recover`` for every run at rest that nobody holds, due when
  it counts as stranded. On the sweep queue (`WorkerSettings.sweeps`), never behind supersteps.
- ``agentflow.mark_answered`` ``(run_id)``: move the task that asked a person about a run
  that has ended (a client cancelled it) to ``ANSWERED`` in Flower (`_task_states`: a client
  sends no Flower event of its own); a run that has not ended is left as it is.
- ``agentflow.prune_finished`` ``()``: prune, in bounded batches, the finished runs that
  `WorkerSettings.retention_days` no longer keeps, then trim those past ``retention_trim_days``
  (one worker at a time; beat sends it every ``retention_interval_s`` when either is set).

Causes a superstep message can carry: ``start``, ``next`` (the handoff between
supersteps), ``resume``, ``rerun``, ``retry`` and ``migrate`` (spend a signed decision;
anything else is refused), ``recover`` and ``recheck`` (look at a run whose holder may be
gone). A flow run's messages go to its version's queue (`_routing`); recover_all's go to
the sweep queue, which every worker consumes. A superstep that
finds the run held by someone else sends one ``recheck`` for when that lease ends; a
recheck that finds it held again at the same step sends the next one (the holder renewed:
it is alive, or the countdown ran ahead of the store's clock), and one that finds the run
moved on sends none, unless the run is at rest and nobody holds it: then a ``recover`` for
when it counts as stranded (so does a message delivered again after its worker was lost:
`Worker.superstep`). So a run whose worker was killed moves again within one lease.

How a superstep task ends tells what became of its run (Flower shows the state; see
`AgentflowTasks.end_task`): ``SUCCESS`` when the run goes on or finished; ``FAILURE`` (a
`RunFailed` with the run's error) when it ended failed; ``PAUSED`` when it waits for an
approval; ``NEEDS_DECISION`` when calls in doubt wait for an operator; ``CANCELLED`` when
the superstep ended the run on an operator's cancel request; ``RECOVERED`` when the
superstep recovered the run (it was not a clean handoff) and the run goes on or finished;
``SKIPPED`` or ``REFUSED`` when it did nothing; ``RETRY`` (Celery's own, with the store's
message) when the store could not confirm a write the superstep needed (`StoreNotDurable`):
the task is sent again after a back-off, ``WorkerSettings.store_retries`` times, then ends
``WAITING_FOR_STORE`` and leaves the run to recover_all. A later task moves a ``PAUSED`` or
``NEEDS_DECISION`` task to ``ANSWERED`` once the person answered, and a task whose worker
died to ``LOST`` once the run was recovered, naming that worker (`_task_states`); the
events that do so carry the moving worker's own node name. The custom states are stored
with the task's result as their meta and end the task with `celery.exceptions.Ignore`, which
acknowledges the message: none of them is retried or redelivered, and neither is a
``FAILURE`` (the tasks acknowledge on failure and retry nothing on an exception).

Reliability settings are set on the tasks themselves (late acks, requeue when a pool
process dies, time limits, JSON: `_config.task_options`), because the user's app defaults
may differ. `celery_config` gives the app-wide configuration to go with them (the runnable
``workers`` app and the demo both use it).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery, Task
from celery.exceptions import Ignore
from celery.signals import task_postrun, worker_init, worker_process_shutdown, worker_ready

from agentflow._app import FlowApp
from agentflow._errors import RunFailed, StoreNotDurable
from agentflow._run_types import RunKind
from agentflow.celery._bridge import LoopBridge
from agentflow.celery._config import celery_config, task_options
from agentflow.celery._routing import consume_own_queues, queue_for
from agentflow.celery._settings import WorkerSettings
from agentflow.celery._task_states import (
    ANSWERED,
    ANSWERING,
    LOST,
    REFUSED,
    SKIPPED,
    answered_once_ended,
    lost_on,
    settle,
)
from agentflow.celery.follow_ups import FollowUp, after_child, after_superstep, after_sweep
from agentflow.celery.worker import Outcome, Worker
from agentflow.exec.checkpoints import CheckpointStore

__all__ = ["AgentflowTasks", "celery_config", "register_tasks"]

log = logging.getLogger("agentflow.celery")

#: Causes a superstep message can carry. ``next`` is the normal handoff between supersteps.
CAUSES = ("start", "next", "recover", "recheck", "rerun", "resume", "retry", "migrate", "wake")
#: Causes of a superstep sent to recover a run (its holder may be gone, or an operator decided on
#: its calls in doubt): sent as ``agentflow.recover_superstep``.
RECOVERY_CAUSES = ("recover", "recheck", "rerun", "retry", "migrate")

#: The final task states Flower shows for a superstep whose run did not simply go on or finish.
PAUSED, NEEDS_DECISION, RECOVERED, CANCELLED = "PAUSED", "NEEDS_DECISION", "RECOVERED", "CANCELLED"
#: A superstep the store could not confirm as durable, its retries spent: the run waits for recover_all.
WAITING_FOR_STORE = "WAITING_FOR_STORE"


@dataclass
class AgentflowTasks:
    """Handles of the registered tasks, and the worker state behind them."""

    start_run: Task
    superstep: Task
    recover_superstep: Task
    resume: Task
    recover_all: Task
    loop_stage: Task
    prune_finished: Task
    mark_answered: Task
    worker: Worker
    bridge: LoopBridge

    def send_superstep(
        self,
        flow: str,
        run_id: str,
        step: int,
        cause: str,
        countdown: float | None = None,
        *,
        version: str | None = None,
    ) -> str:
        """Enqueue one superstep (after `countdown` seconds); returns the task id.

        With the run's flow `version`, the message goes to that version's queue (`_routing`),
        which only workers that have the version read; else to the deployment's queue.
        """
        if cause not in CAUSES:
            raise ValueError(f"unknown cause {cause!r}; one of {CAUSES}")
        task_id = f"af-{run_id}-{step}" if cause == "next" else f"af-{run_id}-{step}-{cause}-{uuid.uuid4().hex[:6]}"
        task = self.start_run if cause == "start" else self.superstep
        if RunKind.of(flow) is RunKind.LOOP:
            task = self.loop_stage
        if cause in RECOVERY_CAUSES:
            task = self.recover_superstep
        queue = queue_for(self.worker.settings.queue, flow, version)
        task.apply_async(args=(flow, run_id, step, cause), task_id=task_id, queue=queue, countdown=countdown)
        return task_id

    def send_mark_answered(self, run_id: str) -> None:
        """Have a worker move the task that asked a person about `run_id`, which ended, to ``ANSWERED`` (best effort).

        A broker that fails here costs a stale line in Flower (a WARNING says so), never the run's end.
        """
        try:
            self.mark_answered.apply_async(args=(run_id,), queue=self.worker.settings.queue)
        except Exception as exc:
            log.warning("run %s: could not ask a worker to mark its question answered in Flower: %s", run_id, exc)

    def send_follow_up(self, up: FollowUp) -> str:
        """Send what a task decided to send next (a recheck just after the lease it waits for ends)."""
        countdown = up.countdown(time.time(), self.worker.settings.recheck_margin_s)
        return self.send_superstep(up.flow, up.run_id, up.step, up.cause, countdown, version=up.version)

    def run_superstep(self, task: Task, flow: str, run_id: str, step: int, cause: str) -> Outcome:
        """The body of a superstep task: one superstep, then what follows from its outcome."""
        worker = self.worker
        if cause not in CAUSES:
            return worker.refuse(flow, run_id, step, str(cause), f"unknown cause {cause!r}")
        worker.node = task.request.hostname or worker.node
        handoff = self.handoff(task, cause)
        if not handoff:
            # Flower shows the task as RECOVERED while it runs; its result lists what it replayed and reran.
            task.send_event("task-recovered", run_id=run_id, step=step, cause=cause)
        message, again = task.request.id, self.delivered_again(task)
        outcome = self.bridge.run(
            worker.superstep(flow, run_id, step, handoff=handoff, cause=cause, message=message, again=again)
        )
        self.settle_earlier(task, outcome, cause)
        if handoff and outcome.cut_off(cause):  # a clean-looking handoff found a cut-off superstep
            task.send_event("task-recovered", run_id=run_id, replayed=outcome.replayed, rerun=outcome.rerun)
        if outcome.done == "refused":
            task.send_event("task-refused", run_id=run_id, step=step, cause=cause, why=outcome.why)
        for up in after_superstep(outcome, flow, run_id, step):  # held: a recheck; goes on: the next superstep
            self.send_follow_up(up)
        if outcome.done == "elsewhere":
            self.send_on(task, flow, run_id, step, cause, outcome)
        for up in self.bridge.run(after_child(worker, outcome)):  # a child ended: its parent goes on
            self.send_follow_up(up)
        if outcome.done == "ran" and (task.request.retries > 0 or cause in RECOVERY_CAUSES):
            self.bridge.run(worker.stopped_waiting_for_store(run_id))  # it may have waited for its store
        return outcome

    def retry_for_store(self, task: Task, outcome: Outcome) -> None:
        """Send a superstep the store could not confirm as durable again, after a back-off, while tries remain.

        The next try starts from the run's latest step as the store has it (a claim this try
        saved may be there, unacknowledged), and claims the run, as a recovery does.
        Raises `celery.exceptions.Retry` (Flower shows ``RETRY`` with the store's message) after
        leaving the run's ``store-wait`` marker (`agentflow.exec.run.store_waits`), so ``runs
        show`` and the viewer say why the run waits. Returns once the tries
        (`WorkerSettings.store_retries`) are spent: the task then ends ``WAITING_FOR_STORE``.
        """
        settings, retries = self.worker.settings, task.request.retries
        if retries >= settings.store_retries:
            self.bridge.run(self.worker.wait_for_store(outcome, None))
            return
        countdown = settings.store_backoff_s(retries)
        self.bridge.run(self.worker.wait_for_store(outcome, time.time() + countdown))
        log.warning("run %s: %s; its superstep is tried again in %.1f s", outcome.run_id, outcome.why, countdown,
                    extra={"run_id": outcome.run_id})  # fmt: skip
        args = list(task.request.args or ())
        if len(args) >= 3 and outcome.step is not None and type(args[2]) is int:
            args[2] = outcome.step  # a claim it saved may be there, unacknowledged: the next try goes on from it
        raise task.retry(
            args=args, exc=StoreNotDurable(outcome.why), countdown=countdown, max_retries=settings.store_retries
        )

    def settle_earlier(self, task: Task, outcome: Outcome, cause: str) -> None:
        """Move earlier tasks this superstep settled in Flower: answered questions, lost workers (`_task_states`)."""
        node, run_id = task.request.hostname, outcome.run_id
        if outcome.done == "ran" and cause in ANSWERING:
            asking = self.bridge.run(self.worker.answered(run_id))
            settle(task.app, dict.fromkeys(asking, {"run_id": run_id, "answered_by": task.request.id}), ANSWERED, node)
        if outcome.cut_off(cause) or outcome.done == "decision":
            lost = self.bridge.run(self.worker.lost_tasks(outcome, task.request.id))
            recovered = {"run_id": run_id, "recovered_by": task.request.id}
            settle(task.app, {t: {**recovered, **lost_on(on)} for t, on in lost.items()}, LOST, node)

    def run_mark_answered(self, task: Task, run_id: str) -> dict[str, Any]:
        """The body of the mark_answered task: settle the question of a run that ended (`_task_states`)."""
        worker = self.worker
        asking = self.bridge.run(answered_once_ended(worker.store, worker.sealer, worker.markers, run_id))
        settle(task.app, dict.fromkeys(asking, {"run_id": run_id, "answered_by": "cancel"}), ANSWERED,
               task.request.hostname)  # fmt: skip
        return {"run_id": run_id, "answered": sorted(asking)}

    def send_on(self, task: Task, flow: str, run_id: str, step: int, cause: str, outcome: Outcome) -> None:
        """Send a message about a run of a flow version this worker lacks on to that version's queue, once."""
        assert outcome.version is not None
        target = queue_for(self.worker.settings.queue, flow, outcome.version)
        came_from = (task.request.delivery_info or {}).get("routing_key")
        extra = {"run_id": run_id, "step": step}
        if came_from == target:  # cannot happen with the queues a worker reads (`_routing`); never loop
            log.warning("run %s: version %s of flow %r is not here, yet its message came from %s", run_id,
                        outcome.version, flow, target, extra=extra)  # fmt: skip
            return
        self.send_superstep(flow, run_id, step, cause, version=outcome.version)
        log.info("run %s is on version %s of flow %r, which this worker does not have: sent it on to %s", run_id,
                 outcome.version, flow, target, extra=extra)  # fmt: skip

    @staticmethod
    def delivered_again(task: Task) -> bool:
        """Whether the message comes again after its worker was lost: redelivered, or a retry (a pool process died)."""
        return bool((task.request.delivery_info or {}).get("redelivered")) or task.request.retries > 0

    @classmethod
    def handoff(cls, task: Task, cause: str) -> bool:
        """Whether the message is a clean handoff: a start, a next or a resume, delivered for the first time."""
        return cause in ("next", "start", "resume", "wake") and not cls.delivered_again(task)

    @staticmethod
    def final_state(outcome: Outcome, recovering: bool) -> str:
        """The Celery state a superstep task ends in, from its outcome.

        ``FAILURE`` when the run ended failed; ``CANCELLED`` when the superstep ended it on an
        operator's cancel request; ``NEEDS_DECISION`` when calls in doubt wait for
        an operator; ``PAUSED`` when the run waits for an approval; ``RECOVERED`` when a
        superstep that was not a clean handoff (`recovering`) ran and the run goes on or
        finished; ``REFUSED`` when it refused its message (no signed decision backs it);
        ``SKIPPED`` when it did nothing else (a duplicate or late message, a run held or in
        conflict, a message sent on to its flow version's queue); ``SUCCESS`` for a handoff
        that ran; ``WAITING_FOR_STORE`` when the store could not confirm a write the superstep
        needed and the task's retries are spent (the run waits for recover_all).
        """
        if outcome.done == "not_durable":
            return WAITING_FOR_STORE
        if outcome.done == "decision":
            return NEEDS_DECISION
        if outcome.done == "refused":
            return REFUSED
        if outcome.done != "ran":
            return SKIPPED
        if outcome.status == "failed":
            return "FAILURE"
        if outcome.status == "cancelled":
            return CANCELLED
        if outcome.status == "paused":
            return PAUSED
        return RECOVERED if recovering and outcome.status in ("running", "done") else "SUCCESS"

    def end_task(self, task: Task, outcome: Outcome, cause: str, runtime_s: float | None = None) -> dict[str, Any]:
        """End a superstep task in the state that tells what became of its run (see `final_state`).

        Called once the superstep is done and what follows from it sent (the next message, a
        recheck, the events). Returns the result of a task that ends ``SUCCESS``. Otherwise
        raises: `RunFailed` with the run's error (Celery records ``FAILURE``; the tasks
        acknowledge a failure and retry nothing on an exception), or, for a custom state,
        stores the state with the result as its meta, sends the event that shows it in
        Flower (``task-paused``, ``task-needs_decision``, ``task-recovered``, with the result),
        and raises `Ignore`, which acknowledges the message and sends nothing after it.
        `runtime_s` (how long the task ran) goes with that event, as Celery's own
        ``task-succeeded`` carries it, so Flower's Runtime column is filled in.
        """
        if outcome.done == "not_durable":
            self.retry_for_store(task, outcome)  # raises Retry while tries remain
        result = outcome.as_dict()
        recovering = not self.handoff(task, cause) or outcome.cut_off(cause)
        state = self.final_state(outcome, recovering)
        if state == "SUCCESS":
            return result
        if state == "FAILURE":
            raise RunFailed(outcome.run_id, outcome.why or "the run ended failed (no error was recorded)")
        if state in (PAUSED, NEEDS_DECISION):  # a later task moves this one to ANSWERED (`_task_states`)
            try:
                self.bridge.run(self.worker.asked(outcome.run_id, task.request.id, state))
            except Exception as exc:  # a stale line in Flower at worst, never the run's progress
                log.warning("run %s: could not note the task that asks: %s", outcome.run_id, exc)
        task.update_state(state=state, meta=result)
        # Celery's event state (and so Flower) shows a custom task-<x> event as the state <X>.
        event: dict[str, Any] = {"result": repr(result), "run_id": outcome.run_id}
        if runtime_s is not None:
            event["runtime"] = runtime_s
        task.send_event(f"task-{state.lower()}", **event)
        raise Ignore()

    def run_recover_all(self, startup: bool) -> dict[str, Any]:
        """The body of the recover_all task: enqueue what `Worker.stranded` found."""
        found = self.bridge.run(self.worker.stranded(startup=startup))
        if found is None:
            skipped: dict[str, Any] = {"skipped": "another recover_all holds its lock"}
            until = self.worker.sweep_locked_until
            if startup and until is not None:
                # A start's sweep must run: the holder may have died in its sweep (before sending this
                # start's rechecks), so it comes again just after the lock would lapse.
                countdown = max(0.5, until - time.time()) + self.worker.settings.recheck_margin_s
                self.recover_all.apply_async(
                    kwargs={"startup": True}, queue=self.worker.settings.sweeps, countdown=countdown
                )
                skipped["again_in_s"] = round(countdown, 3)
            return skipped
        for up in after_sweep(found):
            self.send_follow_up(up)
        self.bridge.run(self.worker.mark_recoveries(found))  # last: a store error here loses no message
        return found.as_result()


def register_tasks(
    app: Celery,
    flow_app: FlowApp,
    *,
    store_factory: Callable[[], CheckpointStore],
    checkpoint_key: bytes | Sequence[bytes],
    settings: WorkerSettings | None = None,
) -> AgentflowTasks:
    """Register agentflow's tasks on `app`.

    Args:
        app: the user's Celery app.
        flow_app: the flows, tools and tool loops the workers run.
        store_factory: makes the checkpoint store (called once per worker process).
        checkpoint_key: the signing key(s), the same on every worker.
        settings: leases, time limits, queue, beat period. Leases live in the checkpoint
            store (under its key prefix), like everything else about a run.

    Returns:
        The task handles (`send_superstep` enqueues a superstep).
    """
    settings = settings or WorkerSettings()
    bridge = LoopBridge()
    worker = Worker(flow_app, store_factory, checkpoint_key, settings)
    # Registered on `app` only: a shared task is also added to every app finalized later in the
    # process, where (Celery keeping the first callable under a name) another app's worker would run it.
    options = {**task_options(settings), "shared": False}
    handles: dict[str, Task] = {}

    def superstep(task: Task, flow: str, run_id: str, step: int, cause: str = "next") -> dict[str, Any]:
        began = time.monotonic()
        outcome = tasks.run_superstep(task, flow, run_id, step, cause)
        return tasks.end_task(task, outcome, cause, time.monotonic() - began)

    def resume(task: Task, flow: str, run_id: str, step: Any = None, *extra: Any) -> dict[str, Any]:
        worker.node = task.request.hostname or worker.node
        if extra or type(step) is not int:
            why = "agentflow.resume takes (flow, run_id, step) and spends a signed decision; it decides nothing"
            return worker.refuse(flow, run_id, -1, "resume", why).as_dict()
        began = time.monotonic()
        outcome = tasks.run_superstep(task, flow, run_id, step, "resume")
        return tasks.end_task(task, outcome, "resume", time.monotonic() - began)

    def recover_all(task: Task, startup: bool = False) -> dict[str, Any]:
        worker.node = task.request.hostname or worker.node  # before the runner exists: leases name this worker
        return tasks.run_recover_all(startup is True)

    def prune_finished(task: Task) -> dict[str, Any]:
        worker.node = task.request.hostname or worker.node
        return bridge.run(worker.prune())

    def mark_answered(task: Task, run_id: str) -> dict[str, Any]:
        worker.node = task.request.hostname or worker.node
        return tasks.run_mark_answered(task, str(run_id))

    handles["start_run"] = app.task(name="agentflow.start_run", **options)(superstep)
    handles["superstep"] = app.task(name="agentflow.superstep", **options)(superstep)
    handles["recover_superstep"] = app.task(name="agentflow.recover_superstep", **options)(superstep)
    handles["resume"] = app.task(name="agentflow.resume", **options)(resume)
    handles["loop_stage"] = app.task(name="agentflow.loop_stage", **options)(superstep)
    handles["recover_all"] = app.task(name="agentflow.recover_all", **{**options, "acks_late": False})(recover_all)
    handles["prune_finished"] = app.task(name="agentflow.prune_finished", **{**options, "acks_late": False})(
        prune_finished
    )
    handles["mark_answered"] = app.task(name="agentflow.mark_answered", **{**options, "acks_late": False})(
        mark_answered
    )
    routes = dict(app.conf.task_routes or {}) if isinstance(app.conf.task_routes, dict) else {}
    sweeps = {"agentflow.recover_all": {"queue": settings.sweeps}}  # an exact name wins over the pattern
    app.conf.task_routes = {**routes, **sweeps, "agentflow.*": {"queue": settings.queue}}
    tasks = AgentflowTasks(worker=worker, bridge=bridge, **handles)
    worker.send = tasks.send_superstep
    _connect_signals(app, tasks, settings, {f"agentflow.{name}" for name in handles})
    consume_own_queues(app, flow_app, settings.queue, settings.sweeps)
    return tasks


def _connect_signals(app: Celery, tasks: AgentflowTasks, settings: WorkerSettings, names: set[str]) -> None:
    def recover_on_start(sender: Any = None, **_: Any) -> None:
        # No expiry: a start's sweep must run (it sends what the workers that died held); on
        # the sweep queue it waits for a free pool process, never behind a backlog of supersteps.
        if getattr(sender, "app", None) is app:
            tasks.recover_all.apply_async(kwargs={"startup": True}, queue=settings.sweeps)

    def refuse_unsafe_store(sender: Any = None, **_: Any) -> None:
        # In the worker's main process, before its pool starts: a store whose server keeps less
        # than the settings ask for (`StoreRefused`) stops the worker here, not task by task.
        if getattr(sender, "app", None) is not app:
            return
        refused = asyncio.run(tasks.worker.refusal_at_start())
        if refused is not None:
            raise SystemExit(f"agentflow worker: refusing to start on this checkpoint store: {refused}")

    def close_loop(**_: Any) -> None:
        tasks.bridge.close()

    def drop_traceback(sender: Any = None, retval: Any = None, **_: Any) -> None:
        # A task of ours that ended by raising (`Ignore` for a state of ours, `RunFailed`) leaves
        # Celery's tracer holding the exception, whose traceback holds the tracer's own frame:
        # a reference cycle, with Celery's copy of the traceback (about half a MiB), that only a
        # full collection frees. Celery has recorded it by now; letting go of the traceback
        # frees it all when the tracer returns.
        ours = getattr(sender, "app", None) is app and getattr(sender, "name", None) in names
        if ours and isinstance(retval, BaseException):
            retval.__traceback__ = None

    worker_init.connect(refuse_unsafe_store, weak=False)
    worker_ready.connect(recover_on_start, weak=False)
    worker_process_shutdown.connect(close_loop, weak=False)
    task_postrun.connect(drop_traceback, weak=False)

    if settings.recover_interval_s:
        # A tick that waited an interval is dropped: the next one replaces it.
        expires = max(5.0, settings.recover_interval_s - 5)
        schedule = dict(app.conf.beat_schedule or {})
        schedule["agentflow-recover-all"] = {
            "task": "agentflow.recover_all",
            "schedule": settings.recover_interval_s,
            "options": {"expires": expires, "queue": settings.sweeps},
        }
        app.conf.beat_schedule = schedule
    if settings.retention() is not None:
        every = settings.retention_interval_s
        schedule = dict(app.conf.beat_schedule or {})
        schedule["agentflow-prune-finished"] = {
            "task": "agentflow.prune_finished",
            "schedule": every,
            "options": {"expires": max(5.0, every - 5), "queue": settings.queue},
        }
        app.conf.beat_schedule = schedule
