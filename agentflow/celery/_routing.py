"""Which queue a message goes to: one queue per flow version, so each reaches a worker that has it; sweeps apart.

A rolling deploy runs old and new workers side by side, each with the flow versions it was
built with. A run continues only on the version it started on, so its messages must reach
a worker that has that version:
- every worker consumes the deployment's queue (`WorkerSettings.queue`) and, for each flow
  version its app holds, that version's queue (`version_queue`), added when the worker
  starts whatever ``-Q`` it was given (`consume_own_queues`);
- a sender that knows the run's version (the client starting a run, the worker handing it
  over, a sweep) sends to the version's queue; one that does not (a recheck, a recovery
  asked for by id) sends to the deployment's queue;
- a worker that takes a message for a run whose version it lacks touches nothing
  (`VersionNotDeployed`) and sends the message on to that version's queue, once: it never
  consumes that queue, so the message cannot come back to it. A message that arrived on
  its version's queue is not sent on again.
If no worker has the version any more, the message waits in that queue and the run is
listed as needing migration (`Worker.stranded`); `FlowClient.migrate` moves it.

recover_all's messages (beat's ticks, each worker's start, a start's sweep sent again) go
to the sweep queue (`WorkerSettings.sweeps`), which every worker consumes too, whatever
``-Q`` says: a sweep waits for a free pool process, never behind a backlog of supersteps,
so it neither expires there (beat's ticks expire after about an interval) nor comes late.
A worker takes from its queues in turn, so a sweep is taken at the next task a worker takes.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import celeryd_after_setup

from agentflow._app import FlowApp
from agentflow._run_types import RunKind

log = logging.getLogger("agentflow.celery")


def version_queue(queue: str, flow: str, version: str) -> str:
    """The queue of the runs of `flow` on `version` (`queue`: the deployment's)."""
    return f"{queue}.{flow}.v{version}"


def queue_for(queue: str, flow: str, version: str | None) -> str:
    """Where a message about a run of `flow` goes: its version's queue when the version is known."""
    if version is None or not RunKind.of(flow).versioned:
        return queue
    return version_queue(queue, flow, version)


def version_queues(flow_app: FlowApp, queue: str) -> list[str]:
    """The version queues a worker with `flow_app` consumes."""
    return [version_queue(queue, name, v) for name, flows in flow_app.versions.items() for v in flows.versions]


def consume_own_queues(app: Celery, flow_app: FlowApp, queue: str, sweeps: str) -> None:
    """Make every worker of `app` consume the sweep queue and the queues of its flow versions, besides ``-Q``'s."""

    def add(sender: Any = None, instance: Any = None, **_: Any) -> None:
        if instance is None or getattr(instance, "app", None) is not app:
            return
        known = instance.app.amqp.queues
        for name in [sweeps, *version_queues(flow_app, queue)]:
            # Declared as a sender declares a queue it names (`new_missing`: on RabbitMQ a quorum
            # queue behind a topic exchange); the broker refuses a second, different declaration.
            known.select_add(known[name])
        log.info("consuming the sweep queue %s and the version queues %s", sweeps,
                 ", ".join(version_queues(flow_app, queue)))  # fmt: skip

    celeryd_after_setup.connect(add, weak=False)
