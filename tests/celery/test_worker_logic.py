"""The worker's decisions about one superstep and about stranded runs, in-process (memory store, no broker).

The task bodies (`AgentflowTasks.run_superstep`, `run_recover_all`) run with what they would
send recorded instead of sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, LoopSpec, Registry
from agentflow._events import Event
from agentflow.celery import WorkerSettings, register_tasks
from agentflow.celery._rechecks import RECHECK
from agentflow.celery._worker import RECOVER_ALL_LEASE, Outcome, Worker
from agentflow.exec._durable_loop import start_tool_loop
from agentflow.exec._durable_seal import key_id
from agentflow.exec._run_control import control_of
from agentflow.exec._run_lease import Ownership, take
from agentflow.exec._run_quarantine import QUARANTINED, UNKNOWN_FLOW, marker, marks
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.models import Message, ScriptedModel

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
        #: The Celery events the task bodies sent: ``(type, fields)``.
        self.celery_events: list[tuple[str, dict[str, Any]]] = []

    def record_sends(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Record what the task bodies enqueue instead of sending it to a broker."""

        def send(flow: str, run_id: str, step: int, cause: str, countdown: float | None = None) -> str:
            self.sent.append((flow, run_id, step, cause, countdown))
            return "recorded"

        monkeypatch.setattr(self.tasks, "send_superstep", send)

    async def task(self, flow: str, run_id: str, step: int, cause: str) -> Outcome:
        """Run the superstep task's body as a worker process would (its own loop, on a thread)."""
        request = SimpleNamespace(hostname="w1@host", delivery_info={}, retries=0)
        task = SimpleNamespace(
            request=request, send_event=lambda kind, **fields: self.celery_events.append((kind, fields))
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


@pytest.fixture
async def s(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Setup]:
    """A fresh set-up whose task bodies record what they send; its worker's event loop is closed afterwards."""
    made = Setup()
    made.record_sends(monkeypatch)
    yield made
    await asyncio.to_thread(made.tasks.bridge.close)


async def test_a_superstep_finding_the_run_held_does_nothing_and_says_when_the_lease_ends(s):
    step = await s.start("mail", "r1")
    # Given a run another worker holds
    lease = await take(s.store, "r1", RIVAL)
    # When a superstep message for it arrives
    out = await s.worker.superstep("mail", "r1", step, handoff=True)
    # Then nothing ran, and the outcome names the holder and when its lease ends
    assert (out.done, out.held_until) == ("skipped", lease.expires_at)
    assert out.why is not None and RIVAL.owner in out.why
    assert s.effects == [] and (await s.store.latest("r1")).step == step


async def test_a_run_with_a_call_in_doubt_is_parked_with_a_signed_claim_once(s):
    step = await s.in_doubt()
    # When a recovery superstep finds the non-idempotent call in doubt
    out = await s.worker.superstep("mail", "r1", step, handoff=False, cause="recover")
    # Then the run waits for a decision: its latest checkpoint is a signed parked claim naming the call
    assert out.done == "decision"
    parked = await s.store.latest("r1")
    said = control_of(await s.body("r1"))
    assert (parked.step, said.claim, [tool for tool, _ in said.awaiting]) == (step + 1, "parked", ["send"])
    assert s.effects == ["a@b"]
    # And a second superstep at the parked step does not park it again, nor run the call
    again = await s.worker.superstep("mail", "r1", parked.step, handoff=False, cause="recheck")
    assert again.done == "decision"
    assert len(await s.store.history("r1")) == parked.step + 1
    assert s.effects == ["a@b"]


async def test_a_rerun_message_without_a_signed_decision_is_refused(s, caplog):
    caplog.set_level(logging.WARNING, logger="agentflow.celery")
    step = await s.parked()
    # When a superstep with cause "rerun" points at the parked step, but no operator decided
    out = await s.worker.superstep("mail", "r1", step, handoff=False, cause="rerun")
    # Then it is refused: logged at WARNING, reported as an event, and the run is left as it was
    assert out.done == "refused" and out.why is not None and "decision" in out.why
    assert [r.levelno for r in caplog.records if r.name.startswith("agentflow.celery")] == [logging.WARNING]
    assert [(e.name, e.run_id, e.data["cause"]) for e in s.events if e.name == "control.refused"] == [
        ("control.refused", "r1", "rerun")
    ]
    assert s.effects == ["a@b"] and (await s.store.latest("r1")).step == step


async def test_a_resume_message_without_a_signed_resume_is_refused(s, caplog):
    caplog.set_level(logging.WARNING, logger="agentflow.celery")
    step = await s.start("wires", "w1")
    paused = await s.worker.superstep("wires", "w1", step, handoff=True)
    assert (paused.done, paused.status) == ("ran", "paused")
    # When a superstep with cause "resume" points at the paused step, where nobody decided
    out = await s.worker.superstep("wires", "w1", (await s.store.latest("w1")).step, handoff=True, cause="resume")
    # Then it is refused, logged and reported; the run stays paused and nothing was wired
    assert out.done == "refused"
    assert any(
        r.levelno == logging.WARNING and "refused to act on run w1 (a resume message" in r.getMessage()
        for r in caplog.records
    )
    assert [e.data["cause"] for e in s.events if e.name == "control.refused"] == ["resume"]
    assert (await s.store.latest("w1")).status == "paused" and s.effects == []


async def test_a_signed_decision_is_spent_by_the_rerun_it_points_at(s):
    await s.parked()
    # When an operator decides (a signed decision claim), then the rerun message comes
    step = await s.worker.decide_in_doubt("mail", "r1", operator="alice")
    out = await s.worker.superstep("mail", "r1", step, handoff=False, cause="rerun")
    # Then the call reran once and the run finished; the decision names alice
    assert (out.done, out.status) == ("ran", "done")
    assert s.effects == ["a@b", "a@b"]
    decision = s.worker.sealer.open_checkpoint((await s.store.history("r1"))[step], "r1")
    assert (control_of(decision).claim, control_of(decision).operator) == ("decision", "alice")


async def test_stranded_finds_a_run_nobody_moves(s):
    # Given a run saved at step 0 whose first message was never sent
    step = await s.start("mail", "r1")
    # When recover_all looks, Then it finds the run
    found = await s.worker.stranded()
    assert found is not None and found.recover == [("mail", "r1", step)] and found.recheck == []


async def test_stranded_leaves_parked_and_paused_runs_alone(s):
    # Given a run parked on a call in doubt and a run paused for approval
    await s.parked("r1")
    step = await s.start("wires", "w1")
    assert (await s.worker.superstep("wires", "w1", step, handoff=True)).status == "paused"
    # When recover_all looks, Then it finds neither
    found = await s.worker.stranded(startup=True)
    assert found is not None and (found.recover, found.recheck) == ([], [])


async def test_stranded_leaves_held_runs_alone_and_on_startup_rechecks_them_when_their_lease_ends(s):
    step = await s.start("mail", "r1")
    # Given a run a live worker holds
    lease = await take(s.store, "r1", RIVAL)
    # When recover_all looks, Then it does not take the run
    found = await s.worker.stranded()
    assert found is not None and (found.recover, found.recheck) == ([], [])
    # And on a worker's start, it returns the run to look at again when that lease ends
    found = await s.worker.stranded(startup=True)
    assert found is not None and found.recover == []
    assert found.recheck == [("mail", "r1", step, lease.expires_at)]


async def test_stranded_quarantines_a_run_whose_latest_row_fails_its_check_and_reports_it_once(s, caplog):
    caplog.set_level(logging.WARNING, logger="agentflow.celery")
    # Given a run saved with another key (a forged row, as far as the workers can tell)
    forger = s.app.runner(s.store, OTHER_KEY)
    await forger.start(s.app.flow("mail"), {}, run_id="forged")
    # When recover_all looks twice (two beat ticks: the marker is in the store, so any worker sees it)
    first = await asyncio.to_thread(s.tasks.run_recover_all, False)
    second = await asyncio.to_thread(s.tasks.run_recover_all, False)
    # Then it is reported once: one WARNING naming the row's key id, one event, in the first result only
    assert first == {"enqueued": [], "rechecks": [], "quarantined": {"forged": "mail"}}
    assert second == {"enqueued": [], "rechecks": []}
    warned = [r for r in caplog.records if "forged is not recovered" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert "quarantined" in warned[0].getMessage() and key_id(OTHER_KEY) in warned[0].getMessage()
    assert [(e.name, e.run_id, e.data["flow"]) for e in s.events if e.name == "run.quarantined"] == [
        ("run.quarantined", "forged", "mail")
    ]
    # And it is never enqueued, nothing ran, and the marker stays in the store
    assert s.sent == [] and s.effects == []
    assert set(await marks(s.store, ["forged"], QUARANTINED)) == {"forged"}


async def test_a_quarantined_run_whose_rows_check_again_is_recovered_and_its_marker_removed(s):
    # Given a run signed with another key, quarantined by a recover_all
    await s.app.runner(s.store, OTHER_KEY).start(s.app.flow("mail"), {}, run_id="forged")
    assert (await s.worker.stranded()).quarantined == [("mail", "forged")]
    # When the operator adds that key to the workers' ring (a worker restarted with both keys) and recover_all looks
    rotated = Worker(s.app, lambda: s.store, [KEY, OTHER_KEY], WorkerSettings(stale_after_s=0.0))
    found = await rotated.stranded()
    # Then the run is recovered like any stranded run, and its marker is gone
    assert found is not None and found.recover == [("mail", "forged", 0)] and found.quarantined == []
    assert await marks(s.store, ["forged"], QUARANTINED) == {}


async def test_a_tool_loop_run_that_fails_its_check_is_quarantined_too(s):
    # Given workers that run the tool loop "helper", and a helper run signed with another key
    app = FlowApp(
        Registry(), [], loops={"helper": LoopSpec(model_factory=lambda: ScriptedModel([]), registry=Registry())}
    )
    worker = Worker(app, lambda: s.store, KEY, WorkerSettings(stale_after_s=0.0))
    await start_tool_loop(
        Registry(), [Message.user("hi")], run_id="lp", checkpoints=s.store, checkpoint_key=OTHER_KEY, name="helper"
    )
    # When recover_all looks twice, Then the loop run is quarantined once and never enqueued
    first, second = await worker.stranded(), await worker.stranded()
    assert first is not None and (first.recover, first.quarantined) == ([], [("loop:helper", "lp")])
    assert second is not None and (second.recover, second.quarantined) == ([], [])


async def test_a_run_of_a_flow_the_workers_do_not_know_is_reported_once(s, caplog):
    caplog.set_level(logging.WARNING, logger="agentflow.celery")
    # Given a stranded run of a flow that is not in the workers' app (signed with the workers' key)
    billing = Flow("billing", state=Job).node("bill", lambda state: {"note": "billed"}).end("bill")
    await FlowApp(Registry(), [billing]).runner(s.store, KEY).start(billing, {}, run_id="b1")
    # and a finished run of that flow, which needs nobody
    await FlowApp(Registry(), [billing]).runner(s.store, KEY).run(billing, Job(), run_id="b2")
    # When recover_all looks twice
    first = await asyncio.to_thread(s.tasks.run_recover_all, False)
    second = await asyncio.to_thread(s.tasks.run_recover_all, False)
    # Then the unfinished run is reported once: in the first result, one WARNING, one event; never enqueued
    assert first == {"enqueued": [], "rechecks": [], "unknown_flows": {"b1": "billing"}}
    assert second == {"enqueued": [], "rechecks": []}
    warned = [r.getMessage() for r in caplog.records if "b1 of flow 'billing'" in r.getMessage()]
    assert len(warned) == 1 and "does not know that flow" in warned[0]
    assert [(e.name, e.run_id, e.data["flow"]) for e in s.events if e.name == "run.unknown_flow"] == [
        ("run.unknown_flow", "b1", "billing")
    ]
    assert s.sent == []


async def test_a_worker_that_knows_the_flow_recovers_the_run_and_removes_its_unknown_flow_marker(s):
    # Given a stranded run of a flow these workers do not know, reported once
    billing = Flow("billing", state=Job).node("bill", lambda state: {"note": "billed"}).end("bill")
    await FlowApp(Registry(), [billing]).runner(s.store, KEY).start(billing, {}, run_id="b1")
    assert (await s.worker.stranded()).unknown == [("billing", "b1")]
    # When a worker whose app has that flow (a new release) runs recover_all
    upgraded = Worker(FlowApp(Registry(), [billing]), lambda: s.store, KEY, WorkerSettings(stale_after_s=0.0))
    found = await upgraded.stranded()
    # Then it recovers the run, and the marker is gone
    assert found is not None and found.recover == [("billing", "b1", 0)] and found.unknown == []
    assert await marks(s.store, ["b1"], UNKNOWN_FLOW) == {}


async def test_an_unknown_flow_run_someone_holds_is_not_reported(s):
    # Given a run of a flow the workers do not know, held by a live process (another app moving it)
    billing = Flow("billing", state=Job).node("bill", lambda state: {"note": "billed"}).end("bill")
    await FlowApp(Registry(), [billing]).runner(s.store, KEY).start(billing, {}, run_id="b1")
    await take(s.store, "b1", RIVAL)
    # When recover_all looks, Then it reports nothing
    found = await s.worker.stranded()
    assert found is not None and (found.unknown, found.quarantined) == ([], [])


async def test_stranded_gives_way_to_another_recover_all(s):
    await s.start("mail", "r1")
    # Given another worker's recover_all under way (it holds the recover_all lease)
    await take(s.store, RECOVER_ALL_LEASE, RIVAL)
    # When this worker's recover_all runs, Then it does nothing
    assert await s.worker.stranded() is None


async def test_a_superstep_task_finding_the_run_held_sends_one_recheck_due_just_after_the_lease_ends(s):
    step = await s.start("mail", "r1")
    # Given a run another worker holds
    lease = await take(s.store, "r1", RIVAL)
    # When a superstep task for it runs
    out = await s.task("mail", "r1", step, "next")
    # Then it sends one recheck of the same step, due just after that lease ends
    assert out.done == "skipped"
    [(flow, run_id, at, cause, countdown)] = s.sent
    assert (flow, run_id, at, cause) == ("mail", "r1", step, "recheck")
    due = lease.expires_at - time.time() + s.worker.settings.recheck_margin_s
    assert countdown == pytest.approx(due, abs=1.0)

    # And a second message that finds it held meanwhile sends none: one recheck is due for that lease
    duplicate = await s.task("mail", "r1", step, "next")
    assert duplicate.done == "skipped" and len(s.sent) == 1


async def test_a_recheck_that_finds_the_run_still_held_at_its_step_sends_the_next_one(s):
    step = await s.start("mail", "r1")
    # Given a run held by a live worker whose lease is short, and a recheck already sent for it
    short = Ownership("rival@elsewhere:7", lease_s=0.6)
    lease = await take(s.store, "r1", short)
    assert (await s.task("mail", "r1", step, "next")).done == "skipped" and len(s.sent) == 1
    # When that lease ends, the holder renews it (it is alive), and the recheck comes due
    mark = marker("r1", RECHECK)
    deadline = time.monotonic() + 5
    while await s.store.leases([mark]):
        assert time.monotonic() < deadline, "the recheck marker did not lapse with the lease"
        await asyncio.sleep(0.05)
    renewed = await s.store.take_lease("r1", short.owner, lease.token, 30.0)  # the live holder, just in time
    assert renewed.token == lease.token
    again = await s.task("mail", "r1", step, "recheck")
    # Then the recheck finds it held at the same step and sends the next one: the run stays watched
    assert again.done == "skipped" and [cause for *_, cause, _ in s.sent] == ["recheck", "recheck"]


async def test_a_recheck_that_finds_the_run_moved_on_sends_nothing_more(s):
    step = await s.start("mail", "r1")
    # Given a run that moved on past the step a recheck was sent for, and is held again
    moved = await s.task("mail", "r1", step, "next")
    assert moved.done == "ran" and moved.step is not None and moved.step > step
    s.sent.clear()
    await take(s.store, "r1", RIVAL)
    # When the recheck of the old step runs
    out = await s.task("mail", "r1", step, "recheck")
    # Then it does nothing and sends nothing: the run's own messages look after its new step
    assert out.done == "skipped" and s.sent == []


async def test_a_workers_start_up_recovers_free_runs_and_rechecks_held_ones_when_their_lease_ends(s):
    # Given a run nobody moves and a run another worker holds
    free = await s.start("mail", "free")
    held = await s.start("mail", "held")
    lease = await take(s.store, "held", RIVAL)
    # When a worker starts (recover_all with startup=True)
    said = await asyncio.to_thread(s.tasks.run_recover_all, True)
    # Then it recovers the free run now, and looks at the held one again when its lease ends
    assert said == {"enqueued": ["free"], "rechecks": ["held"]}
    by_run = {run_id: (step, cause, countdown) for _, run_id, step, cause, countdown in s.sent}
    assert by_run["free"] == (free, "recover", None)
    step, cause, countdown = by_run["held"]
    assert (step, cause) == (held, "recheck")
    assert countdown == pytest.approx(lease.expires_at - time.time() + s.worker.settings.recheck_margin_s, abs=1.0)


async def test_a_refused_superstep_task_tells_celery_and_sends_nothing(s):
    step = await s.parked()
    # When a rerun task points at the parked step, where no operator decided
    out = await s.task("mail", "r1", step, "rerun")
    # Then it is refused, Celery hears a task-refused event, and nothing is enqueued
    assert out.done == "refused"
    assert [(kind, fields["cause"]) for kind, fields in s.celery_events if kind == "task-refused"] == [
        ("task-refused", "rerun")
    ]
    assert s.sent == []


def test_flower_hears_of_a_cut_off_superstep_only_from_reruns_or_replays_not_due_to_a_resume():
    replayed = Outcome("r1", "mail", "ran", "running", 3, replayed=["1/send/0/x"])
    rerun = Outcome("r1", "mail", "ran", "running", 3, rerun=["1/send/0/x"])
    plain = Outcome("r1", "mail", "ran", "running", 3)
    # A handoff that replayed calls found a cut-off superstep, unless it spent a resume's decision
    assert replayed.cut_off("next") and not replayed.cut_off("resume")
    # A rerun always means one; a superstep that replayed nothing found none
    assert rerun.cut_off("next") and rerun.cut_off("resume")
    assert not plain.cut_off("next") and not plain.cut_off("resume")
