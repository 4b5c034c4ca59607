"""The worker's decisions about one superstep and its task bodies, in-process (memory store, no broker).

The task bodies (`AgentflowTasks.run_superstep`, `run_recover_all`) run with what they would
send recorded instead of sent (`worker_kit.Setup`).
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from _kit.poll import until
from _kit.tickets import ORDER, TICKETS, make_tickets
from worker_kit import KEY, RIVAL

from agentflow import FlowApp, RunKind
from agentflow.celery import WorkerSettings
from agentflow.celery._rechecks import RECHECK
from agentflow.celery._routing import queue_for
from agentflow.celery.follow_ups import FollowUp, after_superstep
from agentflow.celery.worker import Outcome, Worker
from agentflow.exec.run.control import control_of
from agentflow.exec.run.lease import Ownership, take


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
    step = await s.worker.runs.of("mail").decide_in_doubt("r1", operator="alice")
    out = await s.worker.superstep("mail", "r1", step, handoff=False, cause="rerun")
    # Then the call reran once and the run finished; the decision names alice
    assert (out.done, out.status) == ("ran", "done")
    assert s.effects == ["a@b", "a@b"]
    decision = s.worker.sealer.open_checkpoint((await s.store.history("r1"))[step], "r1")
    assert (control_of(decision).claim, control_of(decision).operator) == ("decision", "alice")


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
    async def lapsed() -> bool:
        return not await s.worker.markers.peek(RECHECK, ["r1"])

    await until(lapsed, "the recheck marker lapsing with the lease", timeout_s=5)
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


async def test_a_message_sent_again_that_finds_the_run_moved_on_and_at_rest_asks_for_a_recovery(s):
    # Given a ticket run whose first superstep was saved (its lease given up with the save) and
    # whose next message was never sent: its pool process was killed in between
    app = FlowApp(make_tickets().registry, [TICKETS])
    worker = Worker(app, lambda: s.store, KEY, WorkerSettings(stale_after_s=60.0))
    await worker.runner.start(TICKETS, ORDER, run_id="r1")
    first = await worker.superstep("tickets", "r1", 0, handoff=True)
    assert (first.done, first.status, first.step) == ("ran", "running", 1)
    saved_at = (await s.store.latest("r1")).saved_at
    # When Celery sends the first superstep's task again (the pool process died)
    again = await worker.superstep("tickets", "r1", 0, handoff=False, again=True)
    # Then it finds the run moved on, held by nobody, and asks for a recovery of step 1 when it counts as stranded
    assert again.done == "skipped" and again.stranded_at == saved_at + 60.0
    recover = FollowUp("tickets", "r1", 1, "recover", "1", due=saved_at + 60.0)
    assert after_superstep(again, "tickets", "r1", 0) == [recover]
    # And so does a recheck that finds it so
    recheck = await worker.superstep("tickets", "r1", 0, handoff=False, cause="recheck")
    assert [up.cause for up in after_superstep(recheck, "tickets", "r1", 0)] == ["recover"]
    # But a message delivered for the first time asks for nothing (a duplicate), nor does the recovery
    # itself when it finds the run moved on (no chain of messages follows a run)
    for cause, handoff in (("next", True), ("recover", False)):
        out = await worker.superstep("tickets", "r1", 0, handoff=handoff, cause=cause)
        assert (out.done, after_superstep(out, "tickets", "r1", 0)) == ("skipped", [])
    # nor a message sent again that finds the run held by a live worker (it sends that lease's recheck)
    await take(s.store, "r1", RIVAL)
    held = await worker.superstep("tickets", "r1", 0, handoff=False, again=True)
    assert [up.cause for up in after_superstep(held, "tickets", "r1", 0)] == ["recheck"]


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


def test_a_flow_runs_message_goes_to_its_versions_queue_and_a_tool_loops_to_the_deployments():
    # A flow run is pinned to a version (its own queue); a tool loop is not, whatever a message says
    assert queue_for("agentflow", "tickets", "2") == "agentflow.tickets.v2"
    assert queue_for("agentflow", "tickets", None) == "agentflow"
    assert queue_for("agentflow", RunKind.LOOP.column("tickets"), "2") == "agentflow"
