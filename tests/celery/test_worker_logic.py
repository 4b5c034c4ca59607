"""The worker's decisions about one superstep, in-process (fakeredis leases, memory store)."""

from __future__ import annotations

from typing import Any

import fakeredis
from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, Registry
from agentflow.celery import WorkerSettings
from agentflow.celery._lease import Leases
from agentflow.celery._worker import Worker
from agentflow.exec.checkpoints import MemoryCheckpointStore

KEY = b"worker-logic-test-key-0123456789ab"


class Died(BaseException):
    """Stands in for a worker process killed inside a tool."""


class Job(BaseModel):
    note: str = ""


def build(effects: list[str], die: list[bool]) -> tuple[FlowApp, MemoryCheckpointStore]:
    registry = Registry()

    @registry.tool
    async def send(to: str) -> str:
        effects.append(to)
        if die and die.pop():
            raise Died()
        return "sent"

    flow = Flow("mail", state=Job).node("send", Call("send", args={"to": "a@b"}, into="note")).end("send")
    return FlowApp(registry, [flow]), MemoryCheckpointStore()


async def make_worker(effects: list[str], die: list[bool]) -> tuple[Worker, Flow[Any]]:
    app, store = build(effects, die)
    server = fakeredis.FakeServer()
    leases = Leases(lambda: fakeredis.FakeAsyncRedis(server=server), prefix="t", lease_s=5)
    worker = Worker(app, lambda: store, KEY, leases, WorkerSettings())
    return worker, app.flow("mail")


async def in_doubt_run(worker: Worker, flow: Flow[Any]) -> int:
    """A run whose worker died inside `send`: the call is in doubt. Returns its step."""
    started = await worker.runner.start(flow, {}, run_id="r1")
    assert started.step is not None
    try:
        await worker.superstep("mail", "r1", started.step, handoff=True)
    except Died:
        pass
    return (await worker.store.latest("r1")).step


async def test_a_rerun_message_without_a_recorded_decision_reruns_nothing():
    effects: list[str] = []
    worker, flow = await make_worker(effects, [True])
    step = await in_doubt_run(worker, flow)
    # When a message arrives (a rerun asked for, say), but no operator decided
    out = await worker.superstep("mail", "r1", step, handoff=False)
    # Then the run waits for a decision and the tool did not run again
    assert out.done == "decision"
    assert effects == ["a@b"]
    assert await worker.leases.decision("r1") is not None


async def test_a_recorded_decision_is_spent_by_the_rerun_and_the_marker_goes():
    effects: list[str] = []
    worker, flow = await make_worker(effects, [True])
    step = await in_doubt_run(worker, flow)
    await worker.superstep("mail", "r1", step, handoff=False)  # marks: decision needed
    # When the operator decides for this step, and a message comes: the rerun one, or a
    # recovery that got there first (a superstep does not look at its message's cause)
    await worker.leases.allow_rerun("r1", step)
    out = await worker.superstep("mail", "r1", step, handoff=False)
    # Then the call reran once, the run finished, and no decision marker is left behind
    assert (out.done, out.status) == ("ran", "done")
    assert effects == ["a@b", "a@b"]
    assert await worker.leases.decision("r1") is None
    # and the decision was spent: nothing is left to grant another rerun
    assert not await worker.leases.take_rerun("r1", step)


async def test_a_run_that_moved_on_clears_a_stale_decision_marker():
    effects: list[str] = []
    worker, flow = await make_worker(effects, [])
    started = await worker.runner.start(flow, {}, run_id="r2")
    assert started.step is not None
    # Given a stale marker (set by an earlier message for this run)
    await worker.leases.mark_decision("r2", [("send", "old")])
    await worker.leases.clear_decision("r2")
    await worker.leases.mark_decision("r2", [("send", "old")])
    # When a superstep of the run runs
    out = await worker.superstep("mail", "r2", started.step, handoff=True)
    # Then the marker is gone: the run is not reported as waiting, and recover_all may see it
    assert out.done == "ran"
    assert await worker.leases.decision("r2") is None
    assert await worker.leases.leased(["r2"]) == set()


def test_flower_hears_of_a_cut_off_superstep_only_from_reruns_or_replays_not_due_to_a_resume():
    from agentflow.celery._worker import Outcome

    replayed = Outcome("r1", "mail", "ran", "running", 3, replayed=["1/send/0/x"])
    rerun = Outcome("r1", "mail", "ran", "running", 3, rerun=["1/send/0/x"])
    plain = Outcome("r1", "mail", "ran", "running", 3)
    # A handoff that replayed calls found a cut-off superstep, unless it spent a resume's decision
    assert replayed.cut_off("next") and not replayed.cut_off("resume")
    # A rerun always means one; a superstep that replayed nothing found none
    assert rerun.cut_off("next") and rerun.cut_off("resume")
    assert not plain.cut_off("next") and not plain.cut_off("resume")
