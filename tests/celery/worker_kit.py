"""The in-process worker set-up the worker-logic tests share: a Worker on a memory store, sends recorded.

`Setup` builds a FlowApp with a mail flow (a non-idempotent tool that can "die"), a tool
loop, and the registered task bodies; what they would send is recorded instead of sent.
The ``s`` fixture (tests/celery/celery_fixtures.py) makes one per test.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, Registry
from agentflow._events import Event
from agentflow.celery import WorkerSettings, register_tasks
from agentflow.celery.worker import Outcome, Worker
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.exec.run.lease import Ownership

KEY = b"worker-logic-test-key-0123456789ab"
OTHER_KEY = b"worker-logic-other-key-0123456789"
RIVAL = Ownership("rival@elsewhere:7", lease_s=30.0)


class Died(BaseException):
    """Stands in for a worker process killed inside a tool."""


class Job(BaseModel):
    note: str = ""


class Setup:
    """One worker on a memory store, with a mail flow (a non-idempotent send) and a wire flow (needs approval)."""

    def __init__(self) -> None:
        self.effects: list[str] = []
        self.die = False
        registry = Registry()

        @registry.tool
        async def send(to: str) -> str:
            self.effects.append(to)
            if self.die:
                self.die = False
                raise Died()
            return "sent"

        @registry.tool(approval=True)
        async def wire(amount: int) -> str:
            self.effects.append(f"wire {amount}")
            return "wired"

        mail = Flow("mail", state=Job).node("send", Call("send", args={"to": "a@b"}, into="note")).end("send")
        wires = Flow("wires", state=Job).node("wire", Call("wire", args={"amount": 5}, into="note")).end("wire")
        self.app = FlowApp(registry, [mail, wires])
        self.store = MemoryCheckpointStore()
        settings = WorkerSettings(stale_after_s=0.0)
        self.tasks = register_tasks(
            Celery("worker-logic"), self.app, store_factory=lambda: self.store, checkpoint_key=KEY, settings=settings
        )
        self.worker: Worker = self.tasks.worker
        self.events: list[Event] = []
        self.worker.runner.events.subscribe(self.events.append)
        #: What the task bodies sent: ``(flow, run_id, step, cause, countdown)``.
        self.sent: list[tuple[str, str, int, str, float | None]] = []
        #: The flow version each sent message was routed by (None: the deployment's queue), in the order sent.
        self.sent_versions: list[str | None] = []
        #: The Celery events the task bodies sent: ``(type, fields)``.
        self.celery_events: list[tuple[str, dict[str, Any]]] = []
        #: How many superstep tasks `task` ran (each gets an id of its own: ``task-<n>``).
        self.delivered = 0

    def record_sends(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Record what the task bodies enqueue instead of sending it to a broker."""

        def send(
            flow: str, run_id: str, step: int, cause: str, countdown: float | None = None, *, version: str | None = None
        ) -> str:
            self.sent.append((flow, run_id, step, cause, countdown))
            self.sent_versions.append(version)
            return "recorded"

        monkeypatch.setattr(self.tasks, "send_superstep", send)

    async def task(self, flow: str, run_id: str, step: int, cause: str) -> Outcome:
        """Run the superstep task's body as a worker process would (its own loop, on a thread)."""
        self.delivered += 1
        request = SimpleNamespace(id=f"task-{self.delivered}", hostname="w1@host", delivery_info={}, retries=0)
        task = SimpleNamespace(
            request=request,
            app=self.tasks.superstep.app,
            send_event=lambda kind, **fields: self.celery_events.append((kind, fields)),
        )
        return await asyncio.to_thread(self.tasks.run_superstep, task, flow, run_id, step, cause)

    async def start(self, flow: str, run_id: str) -> int:
        """Save the run's step 0 (its first message is never sent); return the step."""
        started = await self.worker.runner.start(self.app.flow(flow), {}, run_id=run_id)
        assert started.step is not None
        return started.step

    async def in_doubt(self, run_id: str = "r1") -> int:
        """A mail run whose worker died inside `send`: the call is in doubt. Returns the run's step."""
        self.die = True
        step = await self.start("mail", run_id)
        with pytest.raises(Died):
            await self.worker.superstep("mail", run_id, step, handoff=True)
        return (await self.store.latest(run_id)).step

    async def parked(self, run_id: str = "r1") -> int:
        """A mail run parked on its call in doubt. Returns the parked claim's step."""
        step = await self.in_doubt(run_id)
        out = await self.worker.superstep("mail", run_id, step, handoff=False, cause="recover")
        assert out.done == "decision", out
        return (await self.store.latest(run_id)).step

    async def body(self, run_id: str) -> dict[str, Any]:
        """The run's latest checkpoint, checked."""
        return self.worker.sealer.open_checkpoint(await self.store.latest(run_id), run_id)
