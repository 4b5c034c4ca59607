"""A run's event stream followed from another process while real workers run it (issue 18, item 4)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from _kit.event_streams import assert_handed_on
from _kit.poll import until
from celery_kit import HERE, ROOT, Deployment

from agentflow import Happened
from agentflow.exec.run.events import read_events

pytestmark = [pytest.mark.redis, pytest.mark.celery]


def _follower(deployment: Deployment, run_id: str, *after: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "event_follower.py"), run_id, *after],
        cwd=ROOT, env=deployment.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip


def _lines(out: bytes) -> list[str]:
    """The whole lines printed (a line cut by the kill is not one)."""
    text = out.decode()
    return text.split("\n")[:-1]


async def test_a_follower_killed_mid_run_resumes_from_its_last_cursor_with_no_event_lost_or_repeated(deployment):
    # Given a worker and a run it carries out until it pauses for the approval of wire_money
    # (mid-run for as long as the test wants: no race with a fast run)
    deployment.start_worker("w1")
    run_id = await deployment.client.start("fanout", {"show": "stream"})
    # When a follower in another process prints events, and is killed mid-run
    first = _follower(deployment, run_id)
    assert first.stdout is not None and first.stderr is not None
    stdout, out = first.stdout, bytearray()
    os.set_blocking(stdout.fileno(), False)

    def printed_some() -> bool:
        out.extend(stdout.read() or b"")
        return any(line.endswith(" run.paused") for line in _lines(bytes(out)))

    await until(printed_some, "the first follower printed the run's pause", timeout_s=30)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    out.extend(stdout.read() or b"")
    stdout.close()
    first.stderr.close()
    before = _lines(bytes(out))
    assert (await deployment.client.status(run_id)).status == "paused"  # it was disconnected mid-run
    # And the run goes on while nobody follows, and a new follower resumes from the last cursor the first printed
    await deployment.client.resume(run_id, approve=True, operator="ops")
    second = _follower(deployment, run_id, before[-1].split()[0])
    rest, err = second.communicate(timeout=60)
    assert second.returncode == 0, err.decode()[-2000:]
    after = _lines(rest)
    # Then together they saw the whole stream, in order: nothing lost, nothing repeated
    view = await deployment.client.settle(run_id, timeout_s=30)
    assert view.status == "done"
    stored = await read_events(deployment.client.runner.checkpoints, deployment.client.sealer, run_id)
    assert before + after == [f"{e.cursor} {e.name}" for e in stored]
    assert after[-1].endswith("run.finished")


async def test_a_run_handed_on_by_a_killed_worker_reads_back_clean_from_every_writer(deployment):
    # Given a run whose worker (w1) was SIGKILLed right after charging the card, parked by w2
    run_id = await deployment.parked_run()
    [call] = (await deployment.client.status(run_id)).in_doubt
    # When an operator says the charge happened, and w2 finishes the run
    await deployment.client.decide_in_doubt(run_id, calls={call.call_id: Happened("charged 80 for parked")})
    assert (await deployment.client.settle(run_id, timeout_s=60)).status == "done"
    # Then the run's stream reads back clean through what verify and `agentflow events` read, each later
    # writer's first entry following the head the checkpoint it took the run up from names
    store = deployment.client.runner.checkpoints
    assert store is not None
    by = await assert_handed_on(store, deployment.client.runner.sealer, run_id)
    assert len(by) >= 2, [w.writer for w in by]
    savers = {(cp.by or "").split("@")[0] for cp in (await deployment.report(run_id)).checkpoints}
    assert {"w1", "w2"} <= savers, savers
