"""Durable timers on real Celery workers: a waiting run holds nothing, and the beat's sweep wakes it once.

The kit's beat sends recover_all every 2 s (``recover_interval_s``): that is the sweeper.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis
from _kit.poll import until
from celery_kit import Deployment

RUNS = 1000


def threads_and_rss(deployment: Deployment, name: str) -> tuple[int, int]:
    """The threads and the resident memory (KiB) of a worker: its main process and its pool, summed."""
    threads = rss = 0
    for pid in [deployment.procs[name].pid, *deployment.children(name)]:
        with open(f"/proc/{pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
        threads += int(fields["Threads"])
        rss += int(fields["VmRSS"].split()[0])
    return threads, rss


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


@pytest.mark.timeout(300)  # a thousand supersteps through one worker: about a minute, more on a loaded machine
async def test_a_thousand_waiting_runs_cost_no_thread_and_no_message(deployment: Deployment) -> None:
    # Given one worker, warmed up by one waiting run, and the beat sweeping every 2 s
    deployment.start_worker("w1")
    deployment.start_beat()
    client = deployment.client
    first = await client.start("cooled", {"show": "warm-up", "seconds": 3600.0})
    assert (await client.wait(first, timeout_s=30)).status == "paused"
    threads_before, rss_before = threads_and_rss(deployment, "w1")
    # When a thousand runs start and each reaches its hour-long wait
    run_ids = []
    for batch in range(0, RUNS, 20):  # a few at a time: the client's connection pool is bounded
        run_ids += await asyncio.gather(
            *(client.start("cooled", {"show": f"s{i}", "seconds": 3600.0}) for i in range(batch, batch + 20))
        )

    async def all_waiting() -> bool:
        reports = await asyncio.gather(*(deployment.report(r) for r in run_ids[-20:]))
        return all(r.status == "paused" and r.wake is not None for r in reports) and messages_queued(deployment) == 0

    await until(all_waiting, "a thousand runs waiting", timeout_s=240, every=1.0)
    views = []
    for at in range(0, RUNS, 20):
        views += await asyncio.gather(*(client.status(r) for r in run_ids[at : at + 20]))
    assert {v.status for v in views} == {"paused"}
    threads_waiting, rss_waiting = threads_and_rss(deployment, "w1")
    # And they wait while the beat's sweeps read every one of them, three times over
    sweeps = deployment.log("w1").count("agentflow.recover_all")
    await until(lambda: deployment.log("w1").count("agentflow.recover_all") >= sweeps + 3, "three sweeps", every=0.5)
    threads_after, rss_after = threads_and_rss(deployment, "w1")
    # Then none holds a thread, a lease or a message, and waiting costs the worker no memory
    assert threads_before == threads_waiting == threads_after, (threads_before, threads_waiting, threads_after)
    assert messages_queued(deployment) == 0
    assert await deployment.tasks.worker.store.leases(run_ids) == {}
    assert rss_after - rss_waiting < 8 * 1024, f"RSS grew {rss_after - rss_waiting} KiB while {RUNS} runs waited"
    print(
        f"\n{RUNS} waiting runs: threads {threads_before} -> {threads_after}; RSS {rss_before} KiB before they started,"
        f" {rss_waiting} KiB once they waited (the supersteps that brought them there), {rss_after} KiB three sweeps on"
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
    assert (await deployment.client.wait(run_id, timeout_s=30)).status == "paused"
    wake = (await deployment.report(run_id)).wake
    assert wake is not None
    wake_at = wake["at"]
    # When its worker is killed while it waits, and another one starts
    deployment.kill_group("w1")
    deployment.start_worker("w2")
    done = await ended(deployment, run_id)
    # Then it was woken once, no earlier than its time and within a sweep's interval after it
    assert done.status == "done"
    report = await deployment.report(run_id)
    woken = [c for c in report.checkpoints if c.what == "claim (wake)"]
    assert len(woken) == 1
    late = woken[0].saved_at - wake_at
    interval = deployment.values["recover_interval_s"]
    assert 0 <= late <= interval + 3.0, f"woken {late:.2f}s after its time (sweep every {interval}s)"
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
