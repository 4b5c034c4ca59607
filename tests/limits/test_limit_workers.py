"""Issue 20's limit test: 4 Celery worker processes share one tool's limit (3 in flight, 20 a second).

The workers are real: two ``celery -A workers worker -P prefork -c 2`` (the kit of
tests/celery, `celery_kit.Deployment`, running ``limit_app:app``), so four pool processes on
two workers take supersteps off one queue. Their registry names the limits' Redis once, by a
factory; agentflow/celery is unchanged. Each call of the tool writes its start and end
time to a ledger file; from it the test checks that the limit was never exceeded, and that
the calls went through at the rate the limit allows.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from limit_app import CALL_S, CONCURRENCY, FAN_OUT, PER_SECOND

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RUNS = 20  # 1 + FAN_OUT calls each: 120 calls, 6 s at 20 a second
WINDOW_S = 1.0


@pytest.fixture
def kit() -> Iterator[Any]:
    """The Celery tests' deployment kit (tests/celery is not on the path when only tests/limits runs)."""
    path = str(ROOT / "tests" / "celery")
    sys.path.insert(0, path)
    try:
        yield importlib.import_module("celery_kit")
    finally:
        sys.path.remove(path)


@pytest.fixture
async def deployment(kit: Any, tmp_path: Path, redis_url: str) -> AsyncIterator[Any]:
    from agentflow.celery import FlowClient
    from config import Settings
    from workers.build import build

    dep = kit.Deployment(tmp_path, redis_url)
    try:
        dep.values["app"] = "limit_app:app"
        dep.env["AGENTFLOW_APP"] = "limit_app:app"
        dep.env["PYTHONPATH"] = f"{HERE}:{dep.env['PYTHONPATH']}"
        dep.env["AGENTFLOW_TEST_LIMITS"] = f"{redis_url}#{dep.prefix}-limits"  # deleted with the deployment's keys
        dep.env["AGENTFLOW_TEST_LIMIT_LEDGER"] = str(tmp_path / "calls.jsonl")
        dep.celery_app, dep.tasks = build(Settings(**dep.values))
        dep.client = FlowClient(dep.tasks)
        yield dep
        await dep.aclose_clients()
    finally:
        dep.close()


def most_in_flight(calls: list[tuple[float, float, int]]) -> int:
    """The most calls running at one instant (a call that ended at t is not running at t)."""
    edges = sorted([(start, 1) for start, _, _ in calls] + [(end, -1) for _, end, _ in calls])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def fullest_window(starts: list[float]) -> int:
    """The most starts in any window of WINDOW_S (half-open: a start WINDOW_S after another is in the next one)."""
    most, first = 0, 0
    for last, at in enumerate(starts):
        while at - starts[first] >= WINDOW_S:
            first += 1
        most = max(most, last - first + 1)
    return most


async def test_four_worker_processes_never_exceed_the_limit_and_use_all_of_it(deployment: Any, tmp_path: Path) -> None:
    # Given 4 worker processes (2 workers x 2) sharing a tool limited to 3 calls in flight and 20 a second
    deployment.start_worker("w1", concurrency=2, wait=False)
    deployment.start_worker("w2", concurrency=2, wait=False)
    deployment.wait_ready("w1")
    deployment.wait_ready("w2")

    # When 20 runs of 6 calls each (a Call node, then 5 calls at once through a node's handle) go through them
    run_ids = [
        await deployment.client.start("limited", {"n": 10 * i}, run_id=f"{deployment.prefix}-{i}") for i in range(RUNS)
    ]
    views = await deployment.wait_all(run_ids, timeout_s=90)

    # Then every run finished, each call ran once, and all four processes made calls
    assert {view.status for view in views.values()} == {"done"}, views
    ledger = tmp_path / "calls.jsonl"
    calls = sorted(tuple(json.loads(line)) for line in ledger.read_text().splitlines())
    assert len(calls) == (1 + FAN_OUT) * RUNS
    assert len({pid for _, _, pid in calls}) == 4

    # and the ledger shows the limit never exceeded: never more than 3 in flight, never 21 starts in a second
    starts = [start for start, _, _ in calls]
    assert most_in_flight(calls) <= CONCURRENCY
    assert fullest_window(starts) <= PER_SECOND

    # and the calls went through at the limit's rate, within 10% of 20 a second: start i + 20 waits for start i
    # to leave the window, so the rate sustained is how many starts the window let through after the first 20
    sustained = (len(starts) - PER_SECOND) / (starts[-PER_SECOND] - starts[0])
    took = max(end for _, end, _ in calls) - starts[0]
    closest = min(starts[i + PER_SECOND] - starts[i] for i in range(len(starts) - PER_SECOND))
    print(
        f"\n{len(calls)} calls of {CALL_S} s: {sustained:.2f} starts/s sustained, {len(calls) / took:.2f}/s from the "
        f"first start to the last end ({took:.2f} s); 21 starts never within {closest:.3f} s"
    )
    assert PER_SECOND * 0.9 <= sustained <= PER_SECOND
