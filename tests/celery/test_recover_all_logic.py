"""recover_all's view of stranded runs, in-process: what it recovers, leaves alone, quarantines and reports.

`Worker.stranded` on a memory store (`worker_kit.Setup`): runs nobody moves, parked, paused
and held runs, rows that fail their check, runs of flows the workers do not know.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest
from _kit.poll import until
from celery import Celery
from worker_kit import KEY, OTHER_KEY, RIVAL, Died, Job

from agentflow import Call, Flow, FlowApp, LoopSpec, Registry
from agentflow.celery import WorkerSettings, register_tasks
from agentflow.celery._rechecks import first_to_watch
from agentflow.celery._resends import RECOVERING, Resends
from agentflow.celery.follow_ups import FollowUp, after_sweep
from agentflow.celery.worker import RECOVER_ALL_LOCK, Worker
from agentflow.exec import LoopRunner
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.exec.run.lease import take
from agentflow.exec.run.markers import Markers, key_of, marker_value
from agentflow.exec.run.quarantine import QUARANTINED, UNKNOWN_FLOW, marks
from agentflow.exec.seal import Sealer, canonical, key_id
from agentflow.models import Message, ScriptedModel


async def test_stranded_finds_a_run_nobody_moves(s):
    # Given a run saved at step 0 whose first message was never sent
    step = await s.start("mail", "r1")
    # When recover_all looks, Then it finds the run
    found = await s.worker.stranded()
    assert found is not None and found.recover == [("mail", "r1", step, "1")] and found.recheck == []


async def test_stranded_leaves_parked_and_paused_runs_alone(s):
    # Given a run parked on a call in doubt and a run paused for approval
    await s.parked("r1")
    step = await s.start("wires", "w1")
    assert (await s.worker.superstep("wires", "w1", step, handoff=True)).status == "paused"
    # When recover_all looks, Then it finds neither
    found = await s.worker.stranded(startup=True)
    assert found is not None and (found.recover, found.recheck) == ([], [])


async def test_stranded_recovers_a_parked_run_whose_call_ended_after_all(s):
    # Found by the simulation (tests/sim/test_regression_seeds.py, LATE_DONE_WHILE_PARKED).
    # Given a run parked on its call in doubt, whose stalled worker then logs the call's done
    # in its old segment (fencing stops new calls, not the end of one in flight)
    await s.parked("r1")
    started = [r for r in await s.store.calls("r1") if r.kind == "started"][-1]
    call = json.loads(started.payload)
    late = {"call_id": call["call_id"], "result": "sent", "superstep": call["superstep"]}
    count = sum(1 for r in await s.store.calls("r1") if r.segment == started.segment)
    sealer = s.worker.sealer
    await s.store.record_call("r1", sealer.seal_encoded_call("r1", started.segment, count, "done", canonical(late)))
    # When recover_all looks, Then the run waits for nobody: it is recovered, and the call replays
    found = await s.worker.stranded()
    assert found is not None and [r for _, r, _, _ in found.recover] == ["r1"]
    out = await s.worker.superstep("mail", "r1", found.recover[0][2], handoff=False, cause="recover")
    assert (out.done, out.status) == ("ran", "done") and out.replayed == [call["call_id"]]


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


async def test_a_start_sends_its_own_recheck_though_a_worker_that_died_set_the_marker(s):
    step = await s.start("mail", "r1")
    # Given a run a live worker holds, and the recheck marker of a worker that sent a recheck and then
    # died with its delayed message unacknowledged (the broker keeps it from everyone for an hour)
    lease = await take(s.store, "r1", RIVAL)
    assert await first_to_watch(s.worker.markers, "r1", "dead@host:1", lease.expires_at, RIVAL.lease_s)
    # When a worker starts, Then its recover_all sends a recheck for when the lease ends all the same
    found = await s.worker.stranded(startup=True)
    assert found is not None and found.recheck == [("mail", "r1", step, lease.expires_at)]
    # But a duplicate message that finds the run held sends none: the marker stands for this lease
    assert not await s.worker.watch("r1", lease.expires_at)


async def test_a_start_sends_a_recovery_due_when_a_run_at_rest_counts_as_stranded(s):
    worker = Worker(s.app, lambda: s.store, KEY, WorkerSettings(stale_after_s=60.0))
    # Given a run saved a moment ago that nobody holds: a handoff in flight, or a run whose next
    # message died with a worker's main process that had taken it
    step = await s.start("mail", "r1")
    saved_at = (await s.store.latest("r1")).saved_at
    # When beat's recover_all looks, Then it leaves the run alone (not stranded yet)
    found = await worker.stranded()
    assert found is not None and (found.recover, found.later) == ([], [])
    # But when a worker starts, it sends the run a recovery due when it counts as stranded
    found = await worker.stranded(startup=True)
    assert found is not None and found.recover == []
    assert found.later == [("mail", "r1", step, "1", saved_at + 60.0)]
    assert after_sweep(found) == [FollowUp("mail", "r1", step, "recover", "1", due=saved_at + 60.0)]


async def test_a_start_sends_a_recovery_though_one_went_out_for_the_same_step(s):
    # Given a stranded run a sweep sent a recovery, and held back at the next sweep
    step = await s.start("mail", "r1")
    results = [await asyncio.to_thread(s.tasks.run_recover_all, False) for _ in range(2)]
    assert [r["enqueued"] for r in results] == [["r1"], []] and results[1]["held_back"] == {"r1": "mail"}
    # When a worker starts (the worker that took that recovery may be the one that died)
    started = await asyncio.to_thread(s.tasks.run_recover_all, True)
    # Then its sweep sends the run another recovery all the same
    assert started == {"enqueued": ["r1"], "rechecks": []}
    assert [m for m in s.sent if m[3] == "recover"] == [("mail", "r1", step, "recover", None)] * 2


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
    assert set(await marks(s.worker.markers, ["forged"], QUARANTINED)) == {"forged"}


async def test_a_quarantined_run_whose_rows_check_again_is_recovered_and_its_marker_removed(s):
    # Given a run signed with another key, quarantined by a recover_all
    await s.app.runner(s.store, OTHER_KEY).start(s.app.flow("mail"), {}, run_id="forged")
    assert (await s.worker.stranded()).quarantined == [("mail", "forged")]
    # When the operator adds that key to the workers' ring (a worker restarted with both keys) and recover_all looks
    rotated = Worker(s.app, lambda: s.store, [KEY, OTHER_KEY], WorkerSettings(stale_after_s=0.0))
    found = await rotated.stranded()
    # Then the run is recovered like any stranded run, and its marker is gone
    assert found is not None and found.recover == [("mail", "forged", 0, "1")] and found.quarantined == []
    assert await marks(s.worker.markers, ["forged"], QUARANTINED) == {}


async def test_a_tool_loop_run_that_fails_its_check_is_quarantined_too(s):
    # Given workers that run the tool loop "helper", and a helper run signed with another key
    app = FlowApp(
        Registry(), [], loops={"helper": LoopSpec(model_factory=lambda: ScriptedModel([]), registry=Registry())}
    )
    worker = Worker(app, lambda: s.store, KEY, WorkerSettings(stale_after_s=0.0))
    forger = LoopRunner(None, Registry(), checkpoints=s.store, checkpoint_key=OTHER_KEY, name="helper")
    await forger.start([Message.user("hi")], run_id="lp")
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
    assert found is not None and found.recover == [("billing", "b1", 0, "1")] and found.unknown == []
    assert await marks(s.worker.markers, ["b1"], UNKNOWN_FLOW) == {}


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
    # Given another worker's recover_all under way (it holds the recover_all lock)
    await s.worker.markers.put(*RECOVER_ALL_LOCK, {"owner": RIVAL.owner}, s.worker.settings.recover_lock_s)
    # When this worker's recover_all runs, Then it does nothing
    assert await s.worker.stranded() is None


async def test_a_starts_sweep_kept_out_by_the_lock_comes_again_just_after_the_lock_would_lapse(s, monkeypatch):
    await s.start("mail", "r1")
    # Given the recover_all lock held by a worker that may have died inside its sweep (10 s left)
    _, lock = await s.worker.markers.put(*RECOVER_ALL_LOCK, {"owner": RIVAL.owner}, 10.0)
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(s.tasks.recover_all, "apply_async", lambda **options: sent.append(options))
    # When a starting worker's recover_all finds it held
    result = await asyncio.to_thread(s.tasks.run_recover_all, True)
    # Then it sends itself again for just after the lock would lapse, so the start's sweep is never lost
    assert result["skipped"] == "another recover_all holds its lock"
    (again,) = sent
    assert again["kwargs"] == {"startup": True}
    assert lock.expires_at - time.time() < again["countdown"] <= lock.expires_at - time.time() + 1.5
    # But a beat tick kept out sends nothing more: the next tick comes anyway
    sent.clear()
    assert await asyncio.to_thread(s.tasks.run_recover_all, False) == {"skipped": "another recover_all holds its lock"}
    assert sent == []


async def test_a_run_on_a_flow_version_the_worker_lacks_is_listed_for_migration_and_never_sent(s):
    # Given a stranded mail run on version 1, and a worker whose app has only version 2 of the flow
    await s.start("mail", "r1")
    mail_v2 = _mail_v2()
    upgraded = Worker(FlowApp(s.app.registry, [mail_v2]), lambda: s.store, KEY, WorkerSettings(stale_after_s=0.0))
    seen: list[Any] = []
    upgraded.events.subscribe(seen.append)
    # When that worker's recover_all looks
    found = await upgraded.stranded()
    # Then the run is listed as needing migration and counted as waiting, and not recovered
    assert found is not None and found.recover == [] and found.migrate == [("mail", "r1", "1")]
    assert found.as_result()["needs_migration"] == {"r1": "mail version 1"}
    (swept,) = [e for e in seen if e.name == "runs.swept"]
    waiting = {(w["flow"], w["why"]): w["runs"] for w in swept.data["waiting"]}
    assert waiting[("mail", "migration")] == 1
    # And a worker that has version 1 recovers it
    assert (await s.worker.stranded()).recover == [("mail", "r1", 0, "1")]


async def test_a_superstep_of_a_version_the_worker_lacks_touches_nothing_and_sends_the_message_on(s):
    # Given a mail run on version 1 whose message reaches a worker with only version 2
    step = await s.start("mail", "r1")
    before = await s.store.history("r1")
    mail_v2 = _mail_v2()
    s.worker.flow_app = FlowApp(s.app.registry, [mail_v2])
    # When its superstep task runs
    outcome = await s.task("mail", "r1", step, "next")
    # Then nothing was written or sent by mail, and the message went on to version 1's queue, once
    assert outcome.done == "elsewhere" and outcome.version == "1"
    assert await s.store.history("r1") == before and s.effects == []
    assert s.sent == [("mail", "r1", step, "next", None)] and s.sent_versions == ["1"]


def _mail_v2() -> Flow[Job]:
    """Version 2 of the kit's mail flow: it mails someone else."""
    return Flow("mail", state=Job, version="2").node("send", Call("send", args={"to": "c@d"}, into="note")).end("send")


async def test_an_untouched_run_gets_one_recovery_and_the_next_sweeps_hold_back(s):
    # Given a stranded run (as a run whose next message waits in a backlogged queue looks)
    step = await s.start("mail", "r1")
    # When recover_all looks three times in a row, and nothing touches the run meanwhile
    results = [await asyncio.to_thread(s.tasks.run_recover_all, False) for _ in range(3)]
    # Then one recovery went out, and the next two sweeps say they held the run back
    assert [m for m in s.sent if m[3] == "recover"] == [("mail", "r1", step, "recover", None)]
    assert results[0] == {"enqueued": ["r1"], "rechecks": []}
    assert results[1] == results[2] == {"enqueued": [], "rechecks": [], "held_back": {"r1": "mail"}}


async def test_a_run_saved_to_since_its_recovery_went_out_gets_another_at_once(s):
    # Given a stranded run that was sent a recovery
    step = await s.start("mail", "r1")
    await asyncio.to_thread(s.tasks.run_recover_all, False)
    # When a worker claims it for that recovery and dies inside its call (the claim is saved)
    s.die = True
    with pytest.raises(Died):
        await s.worker.superstep("mail", "r1", step, handoff=False, cause="recover")
    # Then the next sweep sends it another recovery right away: a run that moved is a new case
    again = await asyncio.to_thread(s.tasks.run_recover_all, False)
    assert again["enqueued"] == ["r1"] and "held_back" not in again
    assert [m[1] for m in s.sent if m[3] == "recover"] == ["r1", "r1"]


async def test_the_hold_back_holds_on_every_worker_of_the_store(s, monkeypatch):
    # Given a stranded run that one worker's recover_all sent a recovery
    await s.start("mail", "r1")
    await asyncio.to_thread(s.tasks.run_recover_all, False)
    # When beat's next tick lands on another worker process of the same store
    other = register_tasks(
        Celery("other-worker"),
        s.app,
        store_factory=lambda: s.store,
        checkpoint_key=KEY,
        settings=WorkerSettings(stale_after_s=0.0),
    )
    sent: list[str] = []

    def send(flow: str, run_id: str, *_: object, **__: object) -> str:
        sent.append(run_id)
        return "recorded"

    monkeypatch.setattr(other, "send_superstep", send)
    try:
        found = await asyncio.to_thread(other.run_recover_all, False)
    finally:
        await asyncio.to_thread(other.bridge.close)
    # Then it holds the run back too: the marker is in the store
    assert sent == [] and found == {"enqueued": [], "rechecks": [], "held_back": {"r1": "mail"}}


async def test_a_held_back_run_is_sent_again_after_a_back_off_that_doubles_up_to_its_cap():
    # Given the markers of a store, with a first wait of 60 s
    store = MemoryCheckpointStore()
    resends, mark, waits = Resends(Markers(store, Sealer(KEY)), 60.0, "w1@host:1"), None, []
    for _ in range(6):
        # When a recovery goes out for r1 at step 3 (replacing the marker of the one before)
        before = time.time()
        await resends.mark("r1", 3, mark)
        after = time.time()
        mark = (await resends.read(["r1"]))["r1"]
        # Then the run at step 3 is held back for the rung's wait, and due once it has passed
        # (each wait less half a base, so the beat tick that ends it is never missed by a few milliseconds)
        wait = next(w for w in (60, 120, 240, 480, 960) if resends.due(mark, 3, after + w - 30))
        assert not resends.due(mark, 3, before + wait - 31)
        waits.append(wait)
    assert waits == [60, 120, 240, 480, 480, 480]
    # And the run at another step (any save moves it on) is due at once, as is a run without a marker
    assert resends.due(mark, 4, time.time()) and resends.due(None, 3, time.time())


async def test_a_recovery_marker_that_was_not_set_by_a_worker_holds_nothing_back():
    # Given markers written by someone with write access to the store but no key: one signed with
    # another key, one garbled, and a real one of a month ago written back to last another month
    store = MemoryCheckpointStore()
    resends = Resends(Markers(store, Sealer(KEY)), 60.0, "w1@host:1")
    body = {"step": 3, "rung": 0, "owner": "mallory"}
    month = 30 * 24 * 3600.0
    await store.put_marker(key_of(RECOVERING, "r1"), marker_value(Sealer(OTHER_KEY), RECOVERING, "r1", body, month)[1],
                           "t1", month)  # fmt: skip
    await store.put_marker(key_of(RECOVERING, "r2"), "3:0:not a marker", "t2", 60.0)
    old = marker_value(Sealer(KEY), RECOVERING, "r3", body, 120.0, now=time.time() - month)[1]
    await store.put_marker(key_of(RECOVERING, "r3"), old, "t3", month)
    # When recover_all reads them, Then none counts (each is removed), so none holds its run back
    assert await resends.read(["r1", "r2", "r3"]) == {}
    assert await store.peek_markers([key_of(RECOVERING, run_id) for run_id in ("r1", "r2", "r3")]) == {}
    # And a recovery sent leaves a real marker
    await resends.mark("r1", 3, None)
    replaced = (await resends.read(["r1"]))["r1"]
    assert replaced.body["owner"] == "w1@host:1" and not resends.due(replaced, 3, time.time())


async def test_the_recover_all_lock_is_renewed_while_a_sweep_works_and_lapses_soon_after_its_holder_dies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given two workers of one store whose recover_all lock lasts 1 s unless renewed, and a sweep that takes long
    store = MemoryCheckpointStore()
    first, second = _worker_on(store), _worker_on(store)
    going_on, let_go = asyncio.Event(), asyncio.Event()

    async def slow_sweep(worker: Worker, startup: bool) -> Any:
        going_on.set()
        await let_go.wait()
        return None

    monkeypatch.setattr("agentflow.celery.worker.sweep", slow_sweep)
    sweeping = asyncio.create_task(first.stranded())
    await going_on.wait()
    # When the sweep goes on for 2.5 leases, Then its lock is renewed: the other worker's sweep gives way
    began = time.monotonic()
    while time.monotonic() - began < 2.5:
        assert await second.stranded() is None
        await asyncio.sleep(0.1)
    # And when its worker dies in the sweep (SIGKILL: no release), the next sweep runs within the lease
    monkeypatch.setattr(store, "take_marker", _never_released)
    sweeping.cancel()
    monkeypatch.undo()
    monkeypatch.setattr("agentflow.celery.worker.sweep", _quick_sweep)
    await until(second.stranded, "the next sweep once the dead sweeper's lock lapsed", timeout_s=3.0, every=0.05)


def _worker_on(store: MemoryCheckpointStore) -> Worker:
    settings = WorkerSettings(stale_after_s=0.0, recover_lock_s=1.0)
    tasks = register_tasks(Celery("lock"), FlowApp(Registry(), []), store_factory=lambda: store, checkpoint_key=KEY,
                           settings=settings)  # fmt: skip
    worker: Worker = tasks.worker
    return worker


async def _never_released(key: str, token: str) -> bool:
    return False


async def _quick_sweep(worker: Worker, startup: bool) -> Any:
    return "swept"


async def test_a_captured_sweep_lock_written_back_for_ten_years_does_not_keep_a_starts_sweep_out(s, monkeypatch):
    await s.start("mail", "r1")
    # Given the recover_all lock a store writer captured while a worker held it, written back after
    # that worker let go, for the store to keep for ten years
    async with s.worker.markers.holding(*RECOVER_ALL_LOCK, RIVAL.owner, s.worker.settings.recover_lock_s):
        (captured,) = (await s.store.peek_markers([key_of(*RECOVER_ALL_LOCK)])).values()
    ten_years = 10 * 365 * 24 * 3600.0
    await s.store.put_marker(captured.key, captured.value, "forged-token", ten_years)
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(s.tasks.recover_all, "apply_async", lambda **options: sent.append(options))
    # When a starting worker's recover_all runs, Then it sweeps now: the marker is reported and removed
    result = await asyncio.to_thread(s.tasks.run_recover_all, True)
    assert "skipped" not in result and result["enqueued"] == ["r1"]
    assert sent == []
    assert [e.data["kind"] for e in s.events if e.name == "control.refused"] == ["lock"]


async def test_a_fake_lease_of_twenty_years_makes_no_recheck_wait_longer_than_a_lease(s):
    step = await s.start("mail", "r1")
    # Given a lease written into the store to hold the run for twenty years
    twenty_years = 20 * 365 * 24 * 3600.0
    await s.store.take_lease("r1", "mallory@nowhere:1", "forged-token", twenty_years)
    lease_s = s.worker.settings.lease_s
    # When a message finds the run held, Then its recheck is due within one of the worker's own leases,
    # and the recheck marker it signs lasts no longer
    before = time.time()
    out = await s.worker.superstep("mail", "r1", step, handoff=False, cause="recover")
    assert out.done == "skipped" and out.held_until is not None
    assert out.held_until <= time.time() + lease_s
    (note,) = (await s.worker.markers.peek("recheck", ["r1"])).values()
    assert before < note.body["until"] <= time.time() + lease_s
    # And a start's sweep rechecks it within a lease too
    found = await s.worker.stranded(startup=True)
    assert found is not None
    ((_, _, _, ends),) = found.recheck
    assert ends <= time.time() + lease_s
