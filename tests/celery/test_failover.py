"""No call runs twice when the store's server is lost, if the store waits for what the promise stands on.

Ticket runs go through a real Celery worker (prefork, two at a time) and beat, with the
checkpoint store on a server that is then lost with acknowledged writes (failover_kit.py):

- through Sentinel: the replica cut off, the primary SIGKILLed, the replica promoted;
  without durability options the runs' last writes go with the primary, and a charge whose
  ``started`` record was among them is made again; with ``wait_replicas=1`` the write the
  replica did not acknowledge stops its run before the tool (`StoreNotDurable`), and no call
  runs twice.
- a host crash: a stalled disk, then SIGKILL and every file cut back to what was fsynced;
  under ``appendfsync everysec`` alone the last second of runs goes (runs whose step 0 was
  acknowledged vanish, charges are made again); with ``wait_fsync=True``, which asks for
  ``appendfsync always``, nothing acknowledged is lost.

Each test runs AGENTFLOW_FAILOVER_ROUNDS rounds (1 by default, the shortest that shows each set-up's
outcome; ``make failover`` and ``make soak`` run 20)
and prints its tally, which the closing notes and docs/stores/redis.md quote.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _kit.disk import CrashableServer
from _kit.poll import until
from _kit.ports import free_port
from _kit.replication import SERVICE, replica_set
from celery_kit import Deployment
from failover_kit import RESULTS, Tally, crash_round, sentinel_round

from agentflow._errors import CheckpointError

ROUNDS = int(os.environ.get("AGENTFLOW_FAILOVER_ROUNDS", "1"))

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(90 + 45 * ROUNDS)]

#: How long a durable write waits for its acknowledgement in these deployments.
WAIT_S = 0.5


@pytest.mark.parametrize("setup", ["none", "wait_replicas=1"])
async def test_a_sentinel_failover_runs_no_call_twice_when_the_store_waits_for_a_replica(
    setup: str, tmp_path: Path, redis_url: str
) -> None:
    ports = [free_port() for _ in range(3)]
    url = "redis+sentinel://" + ",".join(f"127.0.0.1:{port}" for port in ports) + f"/{SERVICE}/0"
    waits = {"store_wait_replicas": 1, "store_wait_timeout_s": WAIT_S} if setup != "none" else {}
    # Given a worker and beat whose store is the primary Sentinel names, the broker elsewhere
    dep = Deployment(tmp_path, redis_url, store_url=url, settings=waits)
    tally = Tally(f"Sentinel failover, {setup}")
    try:
        dep.set_delay(0.02, 0.1)
        dep.start_worker("w1")
        dep.start_beat()
        for i in range(ROUNDS):
            # When, in each round, the primary is lost with what it acknowledged after the replica was cut off
            with replica_set(tmp_path / f"set-{i}", sentinels=True, sentinel_ports=ports) as pair:
                await sentinel_round(dep, pair, tally)
        print(f"\n{tally.line()}")
    finally:
        await dep.aclose_clients()
        dep.close()
    # Then every run finished and none was lost
    assert tally.rounds == ROUNDS and tally.lost == 0
    if setup == "none":
        # and without waiting, the charges logged after the cut ran again: the gap the docs warn of
        assert tally.duplicates >= ROUNDS, tally.line()
    else:
        # and waiting for the replica, each round's first unacknowledged started stopped its run: no call ran twice
        assert tally.duplicates == 0 and tally.refused == ROUNDS, tally.line()


@pytest.mark.parametrize("setup", ["none", "wait_fsync=True"])
async def test_a_host_crash_runs_no_call_twice_when_the_store_waits_for_the_fsync(
    setup: str, tmp_path: Path, redis_url: str
) -> None:
    fsync = setup != "none"
    # Given the store on a server with an append-only file: fsynced every second (as the compose file
    # has it), or fsynced before every reply (appendfsync always, which wait_fsync asks for)
    disk = CrashableServer(tmp_path / "disk", appendfsync="always" if fsync else "everysec").start()
    waits = {"store_wait_fsync": True, "store_wait_timeout_s": WAIT_S} if fsync else {}
    dep = Deployment(tmp_path, redis_url, store_url=disk.url, settings=waits)
    tally = Tally(f"host crash, {setup}")
    try:
        dep.set_delay(0.15, 0.3)  # runs still in flight once their step 0s are fsynced (up to a second)
        dep.start_worker("w1")
        dep.start_beat()
        for _ in range(ROUNDS):
            # When, in each round, the disk stalls under runs in flight and the host then crashes
            await crash_round(dep, disk, tally)
        print(f"\n{tally.line()}")
    finally:
        await dep.aclose_clients()
        dep.close()
        disk.stop()
    assert tally.rounds == ROUNDS
    if not fsync:
        # Then, fsyncing once a second, the charges logged in the lost second ran again
        assert tally.duplicates >= 1, tally.line()
    else:
        # Then, fsynced before every acknowledgement, nothing acknowledged was lost and nothing ran twice
        assert tally.duplicates == 0 and tally.lost == 0, tally.line()


async def test_workers_follow_a_sentinel_failover_of_the_broker_and_the_store_without_a_restart(
    tmp_path: Path,
) -> None:
    with replica_set(tmp_path / "set", sentinels=True) as pair:
        # Given a deployment whose broker, results and store are all the primary Sentinel names
        url = pair.sentinel_url
        settings = {"broker_url": url, "store_url": url, "store_wait_replicas": 1, "store_wait_timeout_s": WAIT_S}
        dep = Deployment(tmp_path, settings=settings)
        try:
            dep.set_delay(0.3, 0.5)  # so the worker has a superstep in hand when the primary dies
            dep.start_worker("w1")
            dep.start_beat()
            before = await dep.client.start("tickets", {"show": "before", "seats": 1})
            assert (await dep.client.settle(before, timeout_s=60)).status == "done"
            # When the primary dies with a run in flight and the Sentinels promote the replica
            during = await dep.client.start("tickets", {"show": "during", "seats": 2})
            pair.primary.kill()
            pair.link.close()
            await until(pair.promoted, "the Sentinels to promote the replica", timeout_s=60)
            pair.add_replica()
            # Then the same worker and beat, never restarted, finish the run in flight and take new ones
            after = await _start_when_reachable(dep, {"show": "after", "seats": 3})
            views = {run_id: await dep.client.settle(run_id, timeout_s=90) for run_id in (during, after)}
            assert {view.status for view in views.values()} == {"done"}, views
            assert dep.procs["w1"].poll() is None and dep.procs["beat"].poll() is None
            effects = dep.effects()
            assert all(effects[(tool, r)] == 1 for r in (before, during, after) for tool in RESULTS), effects
        finally:
            await dep.aclose_clients()
            dep.close()


async def _start_when_reachable(dep: Deployment, order: dict[str, object]) -> str:
    """Start a run once the client reaches the new primary (a start during the switch fails cleanly)."""

    async def started() -> str | None:
        try:
            return await dep.client.start("tickets", order)
        except CheckpointError:
            return None

    return await until(started, "a run to start on the new primary", timeout_s=30)
