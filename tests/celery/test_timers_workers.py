"""Durable timers on real Celery workers: a waiting run holds nothing, and the beat's sweep wakes it once.

The kit's beat sends recover_all every 2 s (``recover_interval_s``): that is the sweeper.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import redis
from _kit.poll import until
from celery_kit import Deployment

pytestmark = [pytest.mark.celery, pytest.mark.redis]  # starts Celery worker processes on Redis

RUNS = 1000
#: Runs brought to their wait before the worker's memory is first read (see the test's docstring).
WARM = 200
#: What a waiting run may cost the worker's resident memory, at most (KiB).
PER_RUN_KIB = 2.0


def threads_and_rss(deployment: Deployment, name: str) -> tuple[int, int]:
    """The threads and the resident memory (KiB) of a worker: its main process and its pool, summed."""
    found = by_process(deployment, name)
    return sum(t for t, _ in found.values()), sum(r for _, r in found.values())


def by_process(deployment: Deployment, name: str) -> dict[int, tuple[int, int]]:
    """The threads and the resident memory (KiB) of each process of a worker, by pid (the main process first)."""
    found = {}
    for pid in [deployment.procs[name].pid, *deployment.children(name)]:
        with open(f"/proc/{pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
        found[pid] = (int(fields["Threads"]), int(fields["VmRSS"].split()[0]))
    return found


def messages_queued(deployment: Deployment) -> int:
    """Messages about runs waiting in any of the deployment's queues, or taken and not yet acknowledged.

    The beat's own recover_all messages are not about any run, and are left out.
    """
    client = redis.Redis.from_url(str(deployment.redis_url))
    try:
        prefix = f"{deployment.prefix}:celery:"
        names = client.scan_iter(match=f"{prefix}{deployment.values['queue']}*")
        raw = [m for k in names if client.type(k) == b"list" for m in client.lrange(k, 0, -1)]
        raw += [json.dumps(json.loads(v)[0]).encode() for v in client.hvals(f"{prefix}unacked")]
    finally:
        client.close()
    return sum(1 for m in raw if json.loads(m)["headers"]["task"] != "agentflow.recover_all")


def sweeps_done(deployment: Deployment, name: str) -> int:
    """The sweeps worker `name` made: recover_all tasks that ended, less those another sweep's lease skipped."""
    lines = deployment.log(name).splitlines()
    ended = [line for line in lines if "agentflow.recover_all[" in line and " succeeded in " in line]
    return sum(1 for line in ended if "skipped" not in line)


async def bring_to_wait(deployment: Deployment, count: int, show: str) -> list[str]:
    """Start `count` runs that wait an hour; return their ids once every one waits and no message is left."""
    client = deployment.client
    run_ids: list[str] = []
    for batch in range(0, count, 20):  # a few at a time: the client's connection pool is bounded
        run_ids += await asyncio.gather(
            *(client.start("cooled", {"show": f"{show}{i}", "seconds": 3600.0}) for i in range(batch, batch + 20))
        )

    async def all_waiting() -> bool:  # the queue is first in, first out: the last runs wait last
        reports = await asyncio.gather(*(deployment.report(r) for r in run_ids[-20:]))
        return all(r.status == "paused" and r.wake is not None for r in reports) and messages_queued(deployment) == 0

    await until(all_waiting, f"{count} runs waiting", timeout_s=240, every=1.0)
    views = []
    for at in range(0, count, 20):
        views += await asyncio.gather(*(client.status(r) for r in run_ids[at : at + 20]))
    assert {v.status for v in views} == {"paused"}
    return run_ids


@pytest.mark.timeout(300)  # 1,200 supersteps through one pool process: about a minute, three on a loaded machine
async def test_a_thousand_waiting_runs_cost_no_thread_and_no_message(deployment: Deployment) -> None:
    """A thousand runs waiting cost the worker no thread, no message and no memory each.

    Each superstep that pauses ends its task in a state of ours (``PAUSED``) by raising
    Celery's ``Ignore``. The worker lets go of that exception's traceback once Celery has
    recorded it (`agentflow.celery._tasks`): else it stayed in a reference cycle with
    Celery's copy of the traceback until a full collection, and a worker's RSS grew by
    about 40 KiB for every run brought to its wait (this test measured 43 KiB a run).

    What is left is each process's start-up: a fresh pool process's RSS grows by about
    7 MiB over its first few dozen supersteps (caches filled, CPython's allocator sized),
    then by under 1 MiB over the next thousand or so, then not at all
    (`bench.worker_memory`: flat from 1,000 to 3,000 supersteps); the main process's
    likewise. The main process also keeps one timer entry (about 0.7 KiB) per task until
    the task's soft time limit has passed (50 s here): a window, not a growth. So 200
    runs warm the worker before its RSS is read (the rest of the start-up is the 1 to
    1.4 KiB a run this test measures), and it has one pool process (``-c 1``), since each
    process pays its own start-up. The beat starts once the runs wait: its sweeps read
    every one of them, which is all a waiting run costs from then on; the first sweep
    sizes the buffers that reading them takes (about 1 KiB a run), the next ones nothing.
    """
    # Given one worker with one pool process, warmed up by 200 runs that wait an hour
    deployment.start_worker("w1", concurrency=1)
    warm = await bring_to_wait(deployment, WARM, "warm-up")
    threads_before, rss_before = threads_and_rss(deployment, "w1")
    warmed = by_process(deployment, "w1")
    # When a thousand runs start and each reaches its hour-long wait
    run_ids = await bring_to_wait(deployment, RUNS, "s")
    threads_waiting, rss_waiting = threads_and_rss(deployment, "w1")
    growth = {pid: rss - warmed.get(pid, (0, 0))[1] for pid, (_, rss) in by_process(deployment, "w1").items()}
    # And they wait while the beat's sweeps read every one of them, once and then three times over
    sweeps = sweeps_done(deployment, "w1")  # the worker's own, on its start
    deployment.start_beat()
    await until(lambda: sweeps_done(deployment, "w1") > sweeps, "a sweep", timeout_s=60, every=0.5)
    threads_swept, rss_swept = threads_and_rss(deployment, "w1")
    await until(lambda: sweeps_done(deployment, "w1") > sweeps + 3, "three more sweeps", timeout_s=60, every=0.5)
    threads_after, rss_after = threads_and_rss(deployment, "w1")
    # Then none holds a thread, a lease or a message, and waiting costs the worker no memory
    assert threads_before == threads_waiting == threads_swept == threads_after, (threads_before, threads_after)
    assert messages_queued(deployment) == 0
    assert await deployment.tasks.worker.store.leases(warm + run_ids) == {}
    per_run = (rss_waiting - rss_before) / RUNS
    grew = f"RSS grew {rss_waiting - rss_before} KiB while {RUNS} runs came to wait (by pid: {growth})"
    assert per_run < PER_RUN_KIB, grew
    first = (rss_swept - rss_waiting) / (WARM + RUNS)
    assert first < PER_RUN_KIB, f"RSS grew {rss_swept - rss_waiting} KiB in the first sweep of {WARM + RUNS} runs"
    assert rss_after - rss_swept < 512, f"RSS grew {rss_after - rss_swept} KiB over three more sweeps"
    print(
        f"\n{RUNS} waiting runs: threads {threads_before} -> {threads_after}; RSS {rss_before} KiB once {WARM} runs"
        f" waited, {rss_waiting} KiB once {RUNS} more did ({per_run:+.2f} KiB a run; by pid {growth}),"
        f" {rss_swept} KiB after the first sweep ({first:+.2f} KiB a run), {rss_after} KiB three sweeps on"
    )
    assert not deployment.effects()


async def ended(deployment: Deployment, run_id: str, timeout_s: float = 60.0) -> Any:
    """The run once it ended (`FlowClient.wait` settles on ``paused``, which a waiting run is)."""

    async def view() -> Any:
        seen = await deployment.client.status(run_id)
        return seen if seen.status in ("done", "failed", "cancelled") else None

    return await until(view, f"run {run_id} ending", timeout_s=timeout_s, every=0.2)


async def test_a_run_waiting_while_its_worker_is_killed_wakes_once_on_time(deployment: Deployment) -> None:
    # Given a run waiting four seconds, and the beat running
    deployment.start_worker("w1")
    deployment.start_beat()
    run_id = await deployment.client.start("cooled", {"show": "Tosca", "seconds": 4.0}, run_id=f"{deployment.prefix}-c")
    assert (await deployment.client.settle(run_id, timeout_s=30)).status == "paused"
    wake = (await deployment.report(run_id)).wake
    assert wake is not None
    wake_at = wake["at"]
    # When its worker is killed while it waits, and another one starts
    deployment.kill_group("w1")
    deployment.start_worker("w2")
    up_at = time.time()  # no worker could wake it before: w2 may come up after its time on a loaded machine
    done = await ended(deployment, run_id)
    # Then it was woken once, no earlier than its time, and within a sweep's interval after it
    # (or after w2 came up, if that was later)
    assert done.status == "done"
    report = await deployment.report(run_id)
    woken = [c for c in report.checkpoints if c.what == "claim (wake)"]
    assert len(woken) == 1
    assert woken[0].saved_at >= wake_at, f"woken {wake_at - woken[0].saved_at:.2f}s before its time"
    late = woken[0].saved_at - max(wake_at, up_at)
    interval = deployment.values["recover_interval_s"]
    assert late <= interval + 3.0, (
        f"woken {late:.2f}s after its time or w2's start, whichever was later "
        f"(sweep every {interval}s; w2 up {up_at - wake_at:+.2f}s from its time)"
    )
    assert deployment.effects()[("email_tickets", run_id)] == 1


async def test_an_approval_deadline_fires_its_on_timeout_once_on_a_worker(deployment: Deployment) -> None:
    # Given a refund that waits two seconds for an approval nobody gives, and the beat running
    deployment.start_worker("w1")
    deployment.start_beat()
    run_id = await deployment.client.start("deadline", {"amount": 500}, run_id=f"{deployment.prefix}-d")
    # When the deadline passes and the beat sweeps
    done = await ended(deployment, run_id)
    # Then on_timeout denied it once: the apology went out, the refund never did
    assert done.status == "done" and done.state.outcome == "denied", done
    effects = deployment.effects()
    assert effects[("apologize", run_id)] == 1 and effects[("refund", run_id)] == 0
    report = await deployment.report(run_id)
    assert [c.what for c in report.checkpoints].count("claim (wake)") == 1
