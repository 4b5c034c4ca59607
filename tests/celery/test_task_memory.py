"""What a task of ours leaves behind in the worker process once Celery's tracer returns: nothing.

Each test runs a task body through Celery's own tracer (`celery.app.trace.build_tracer`, as
a pool process runs it) with the garbage collector off, on a memory store and an in-memory
broker and result backend. A task that ends in a state of ours raises Celery's ``Ignore``;
Celery keeps the exception, and with it its traceback, which holds the tracer's own frame.
Unless the task lets go of that traceback, each such superstep leaves a reference cycle
(with Celery's copy of the traceback, about half a MiB) that only a full collection frees,
and a worker's memory grew by some 40 KiB per paused run between those collections.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.app.trace import build_tracer
from celery.exceptions import Ignore
from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, Registry
from agentflow._errors import RunFailed
from agentflow.celery import AgentflowTasks, WorkerSettings, register_tasks
from agentflow.exec.checkpoints import MemoryCheckpointStore

KEY = b"task-memory-test-key-0123456789ab"


class Job(BaseModel):
    note: str = ""


@pytest.fixture
def tasks() -> Iterator[AgentflowTasks]:
    """Agentflow's tasks on an app with an in-memory broker and backend, over a flow that pauses and one that fails."""
    registry = Registry()

    @registry.tool(approval=True)
    async def wire(amount: int) -> str:
        return "wired"

    @registry.tool
    async def crash(amount: int) -> str:
        raise ValueError("the bank said no")

    wires = Flow("wires", state=Job).node("wire", Call("wire", args={"amount": 5}, into="note")).end("wire")
    crashes = Flow("crashes", state=Job).node("crash", Call("crash", args={"amount": 5}, into="note")).end("crash")
    celery_app = Celery("task-memory", broker="memory://", backend="cache+memory://")
    store = MemoryCheckpointStore()
    made = register_tasks(
        celery_app,
        FlowApp(registry, [wires, crashes]),
        store_factory=lambda: store,
        checkpoint_key=KEY,
        settings=WorkerSettings(),
    )
    try:
        yield made
    finally:
        made.bridge.close()
        celery_app.close()


def _celerys_copy(o: object) -> bool:
    """Whether `o` is part of Celery's copy of a traceback (billiard's ``ExceptionInfo`` and its frames)."""
    return type(o).__module__ == "billiard.einfo"


def traced(tasks: AgentflowTasks, flow: str) -> tuple[str, list[Any]]:
    """Start a run of `flow` and trace its first superstep task with the collector off.

    Returns the task's final state and what of its exception, or of Celery's copy of its
    traceback, is still alive once the tracer's result is let go of.
    """
    worker = tasks.worker
    started = tasks.bridge.run(worker.runner.start(worker.flow_app.flow(flow), {}, run_id=f"r-{flow}"))
    task = tasks.superstep
    tracer = build_tracer(task.name, task, app=task.app, eager=False)
    request = {"id": f"t-{flow}", "hostname": "w1@host", "delivery_info": {}}
    gc.collect()
    gc.disable()
    try:
        result = tracer(f"t-{flow}", (flow, started.run_id, started.step, "next"), {}, request)
        state = result[1].state
        del result
        left = [o for o in gc.get_objects() if isinstance(o, Ignore | RunFailed) or _celerys_copy(o)]
    finally:
        gc.enable()
    return state, left


def test_a_superstep_that_pauses_leaves_no_cycle_behind(tasks: AgentflowTasks) -> None:
    # Given a run whose first superstep pauses for an approval
    # When Celery's tracer runs that superstep's task, which ends PAUSED by raising Ignore
    state, left = traced(tasks, "wires")
    # Then the state is stored, and neither the exception nor Celery's copy of its traceback outlives the task
    assert state == "IGNORED"
    assert tasks.superstep.AsyncResult("t-wires").state == "PAUSED"
    assert left == []


def test_a_superstep_that_fails_its_run_leaves_no_cycle_behind(tasks: AgentflowTasks) -> None:
    # Given a run whose first superstep's tool raises
    # When Celery's tracer runs that superstep's task, which ends FAILURE (the run failed)
    state, left = traced(tasks, "crashes")
    # Then the failure is stored, and nothing of the exception outlives the task
    assert state == "FAILURE"
    assert tasks.superstep.AsyncResult("t-crashes").state == "FAILURE"
    assert left == []
