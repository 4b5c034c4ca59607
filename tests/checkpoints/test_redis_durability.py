"""RedisCheckpointStore's durability options on a real primary and replica: what waits, and what a missing ack stops.

Each test starts its own primary and replica (tests/_kit/replication.py) on free ports;
the replica reaches the primary through a link the test can cut like a partition. A
cut replica acknowledges nothing, so a write that waits for it times out, and one that
does not wait returns at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio
from _kit.disk import CrashableServer
from _kit.ports import free_port
from _kit.replication import ReplicaSet, Server, replica_set, server_binary
from _kit.tickets import KEY, ORDER, make_tickets
from test_redis import cp, rec

from agentflow import Call, Executor, Flow, FlowRunner
from agentflow._errors import CheckpointError
from agentflow.errors import StoreNotDurable
from agentflow.exec.checkpoints import RedisCheckpointStore
from agentflow.exec.checkpoints.records import SealedCall
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer

pytestmark = [pytest.mark.redis, pytest.mark.slow]

#: How long a waiting write waits in these tests (a cut replica never answers). The writes made before
#: the cut must be acknowledged within it too: 0.3 s was missed by a live replica with the suite's three
#: processes on the two cores.
WAIT_S = 1.5


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[ReplicaSet]:
    with replica_set(tmp_path) as started:
        yield started


def durable(record: SealedCall) -> SealedCall:
    return dataclasses.replace(record, durable=True)


def on_replica(pair: ReplicaSet, run_id: str) -> int:
    with pair.replica.client() as client:
        return int(client.hlen(f"agentflow:run:{{{run_id}}}:calls"))


async def test_a_durable_record_is_on_the_replica_when_the_write_returns(pair: ReplicaSet) -> None:
    store = RedisCheckpointStore.from_url(pair.primary.url, wait_replicas=1, wait_timeout_s=5.0)
    async with store:
        await store.save("r1", 0, cp("r1", 0))
        # When a non-idempotent call's started record is written with wait_replicas=1
        await store.record_call("r1", durable(rec("r1", 0, 0)))
        # Then the replica has it by the time record_call returns (WAIT, not luck)
        assert on_replica(pair, "r1") == 1


async def test_a_started_the_replica_did_not_acknowledge_raises_store_not_durable(pair: ReplicaSet) -> None:
    store = RedisCheckpointStore.from_url(pair.primary.url, wait_replicas=1, wait_timeout_s=WAIT_S)
    async with store:
        await store.save("r2", 0, cp("r2", 0))
        # Given the replica cut off (a partition: its connection stays up, nothing gets through)
        pair.link.cut()
        # When a durable record is written, it is refused as not durable, naming the setting
        refused = rf"only 0 of the 1 replicas .*wait_replicas.*wait_timeout_s \({WAIT_S}"
        with pytest.raises(StoreNotDurable, match=refused):
            await store.record_call("r2", durable(rec("r2", 0, 0)))
        # Then the record is on the primary (it may survive) and not on the replica
        assert [c.seq for c in await store.calls("r2")] == [0]
        assert on_replica(pair, "r2") == 0
        # And a record that need not be durable (an idempotent call's, a done) does not wait at all
        began = time.monotonic()
        await store.record_call("r2", rec("r2", 0, 1, "done"))
        assert time.monotonic() - began < WAIT_S


async def test_a_claim_and_a_step_0_wait_and_an_ordinary_checkpoint_does_not(pair: ReplicaSet) -> None:
    store = RedisCheckpointStore.from_url(pair.primary.url, wait_replicas=1, wait_timeout_s=WAIT_S)
    async with store:
        pair.link.cut()
        # A run's step 0 waits (the client is told the run started) ...
        with pytest.raises(StoreNotDurable, match="step 0"):
            await store.save("r3", 0, cp("r3", 0))
        # ... an ordinary step does not ...
        await store.save("r3", 1, cp("r3", 1))
        # ... and a claim (a checkpoint that opens a segment: a recovery, every signed decision) does
        with pytest.raises(StoreNotDurable, match="step 2"):
            await store.save("r3", 2, cp("r3", 2, segment=2))
        assert (await store.latest("r3")).step == 2  # on the primary: the run stopped, nothing else


PAY = (
    Flow("pay-durably", state=type(ORDER))
    .node("hold", Call("hold_seats", args=lambda o: {"show": o.show, "seats": o.seats}, into="held"))
    .node("pay", Call("charge_card", args=lambda o: {"show": o.show, "seats": o.seats}, into="paid"))
    .edge("hold", "pay")
    .end("pay")
)


async def test_a_run_whose_started_was_not_acknowledged_never_runs_its_tool(pair: ReplicaSet) -> None:
    tickets = make_tickets()
    store = RedisCheckpointStore.from_url(pair.primary.url, wait_replicas=1, wait_timeout_s=WAIT_S)
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store, checkpoint_key=KEY)
    first = await runner.run(PAY, ORDER, run_id="order-1", max_supersteps=1)  # step 0 and hold_seats, replicated
    assert first.status == "running" and tickets.counts()["hold_seats"] == 1
    # Given the replica cut off before charge_card's step
    pair.link.cut()
    # When the run goes on, charge_card's started record is not acknowledged in time
    with pytest.raises(StoreNotDurable, match="started record"):
        await runner.advance(PAY, "order-1", handoff=True)
    # Then the card was never charged
    assert tickets.counts()["charge_card"] == 0
    # And once the link heals, the call is in doubt (its started may have survived), not run on its own
    pair.link.heal()
    await asyncio.to_thread(lambda: _wait_in_sync(pair))
    report = await read_run(store, Sealer(KEY), "order-1")
    assert [c.tool for c in report.in_doubt] == ["charge_card"]
    assert tickets.counts()["charge_card"] == 0


def _wait_in_sync(pair: ReplicaSet) -> None:
    from _kit.replication import wait_for

    wait_for(pair.in_sync, "the replica to catch up")


async def test_an_idempotent_call_does_not_wait_for_the_replica(pair: ReplicaSet) -> None:
    tickets = make_tickets()
    store = RedisCheckpointStore.from_url(pair.primary.url, wait_replicas=1, wait_timeout_s=WAIT_S)
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store, checkpoint_key=KEY)
    # Given step 0 acknowledged, then the replica cut off
    await runner.run(PAY, ORDER, run_id="order-2", max_supersteps=0)
    pair.link.cut()
    # When the next step runs hold_seats (idempotent): it runs, nothing waits on the replica
    result = await runner.advance(PAY, "order-2", handoff=True)
    assert result.status == "running" and tickets.counts()["hold_seats"] == 1


def test_wait_fsync_on_a_server_without_waitaof_is_refused_with_what_to_do(tmp_path: Path) -> None:
    binary = server_binary()
    if "valkey" in binary:
        pytest.fail("this test needs Debian's redis-server 7.0 (no WAITAOF); only Valkey was found")
    server = Server(binary, free_port(), tmp_path / "old", ["--save", "", "--appendonly", "yes"]).start()
    try:
        version = server.info("server")["redis_version"]
        assert tuple(map(int, version.split(".")[:2])) < (7, 2), f"this machine's redis-server is {version}"
        store = RedisCheckpointStore.from_url(server.url, wait_fsync=True)
        with pytest.raises(CheckpointError, match=r"wait_fsync=True.*has no WAITAOF.*upgrade the server"):
            asyncio.run(store.latest("r"))
    finally:
        server.kill()


def test_wait_fsync_without_an_append_only_file_is_refused(tmp_path: Path) -> None:
    server = Server(server_binary(need_waitaof=True), free_port(), tmp_path / "v", ["--save", "", "--appendonly", "no"])
    server.start()
    try:
        store = RedisCheckpointStore.from_url(server.url, wait_fsync=True)
        with pytest.raises(CheckpointError, match=r"no append-only file.*appendonly yes"):
            asyncio.run(store.latest("r"))
    finally:
        server.kill()


def test_wait_fsync_under_everysec_is_refused_because_the_server_answers_early(tmp_path: Path) -> None:
    # Given a server fsyncing once a second (the compose file's setting), its disk then stalled
    disk = CrashableServer(tmp_path).start()
    try:
        with disk.server.client() as client:
            assert _waitaof(client, "first", 3000) == [1, 0]  # an fsync: the next write comes under a second after it
            disk.stall_disk()
            # When a write is waited for with WAITAOF, the server says fsynced: no fsync could have happened
            early = _waitaof(client, "second", 500)
        lost = disk.crash()
        # Then the write it vouched for is gone after a crash (redis/redis#13793, seen here on Valkey 8.1) ...
        assert early == [1, 0] and lost, "WAITAOF now waits for the fsync: _redis_durability's refusal may be relaxed"
        disk.restart()
        with disk.server.client() as client:
            assert client.get("second") is None
        # ... which is why a store that waits for fsyncs refuses everysec, saying what to set
        store = RedisCheckpointStore.from_url(disk.url, wait_fsync=True)
        with pytest.raises(CheckpointError, match=r"appendfsync everysec.*cannot be trusted.*appendfsync always"):
            asyncio.run(store.latest("r"))
    finally:
        disk.stop()


def _waitaof(client: redis.Redis, key: str, timeout_ms: int) -> list[int]:
    pipe = client.pipeline(transaction=False)
    pipe.set(key, 1)
    pipe.execute_command("WAITAOF", 1, 0, timeout_ms)  # type: ignore[no-untyped-call]
    return list(pipe.execute()[1])


def test_wait_fsync_fails_a_write_the_stalled_disk_did_not_take_in_time(tmp_path: Path) -> None:
    disk = CrashableServer(tmp_path, appendfsync="always").start()
    store = RedisCheckpointStore.from_url(disk.url, wait_fsync=True, wait_timeout_s=WAIT_S, op_timeout_s=WAIT_S + 1)
    try:

        async def write() -> None:
            async with store:
                await store.save("r4", 0, cp("r4", 0))
                disk.stall_disk()
                # With appendfsync always the server fsyncs before it answers: a stalled disk stalls the write
                with pytest.raises(CheckpointError, match=f"did not answer within {WAIT_S + 1} s"):
                    await store.save("r4", 1, cp("r4", 1, segment=1))

        asyncio.run(write())
        disk.crash()
        disk.restart()
        # And after the crash the store holds what was acknowledged, not what was not
        assert asyncio.run(_steps(disk.url, "r4")) == [0]
    finally:
        disk.stop()


async def _steps(url: str, run_id: str) -> list[int]:
    async with RedisCheckpointStore.from_url(url) as store:
        return [c.step for c in await store.history(run_id)]


def test_a_server_that_keeps_nothing_is_refused_unless_allowed_and_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = Server(server_binary(), free_port(), tmp_path / "cache", ["--save", "", "--appendonly", "no"]).start()
    try:
        strict = RedisCheckpointStore.from_url(server.url, allow_volatile=False)
        with pytest.raises(CheckpointError, match=r"keeps nothing on disk.*AGENTFLOW_STORE_ALLOW_VOLATILE=1"):
            asyncio.run(strict.latest("r"))
        with caplog.at_level(logging.WARNING, "agentflow.exec.checkpoints.redis"):
            with pytest.raises(Exception, match="no checkpoint"):
                asyncio.run(RedisCheckpointStore.from_url(server.url).latest("r"))
        assert any("keeps nothing on disk" in r.getMessage() for r in caplog.records)
        # Waiting for a replica is persistence enough: the strict store is then taken
        waiting = RedisCheckpointStore.from_url(server.url, allow_volatile=False, wait_replicas=1)
        with pytest.raises(Exception, match="no checkpoint"):
            asyncio.run(waiting.latest("r"))
        # And a server set right meanwhile is taken by the store that refused it
        with redis.Redis(port=server.port) as client:
            client.config_set("appendonly", "yes")
        with pytest.raises(Exception, match="no checkpoint"):
            asyncio.run(strict.latest("r"))
    finally:
        server.kill()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"wait_replicas": -1}, "wait_replicas must be a whole number"),
        ({"wait_replicas": True}, "wait_replicas must be a whole number"),
        ({"wait_fsync": "yes"}, "wait_fsync must be True or False"),
        ({"wait_timeout_s": 0}, "wait_timeout_s must be a number of seconds"),
        ({"wait_replicas": 1, "wait_timeout_s": 10.0, "op_timeout_s": 5.0}, "must be longer than wait_timeout_s"),
    ],
)
def test_bad_durability_options_are_refused_saying_what_to_fix(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedisCheckpointStore.from_url("redis://127.0.0.1:6379/0", **kwargs)  # type: ignore[arg-type]


async def test_waits_on_redis_cluster_are_refused_saying_what_to_use(redis_cluster: list[int]) -> None:
    cluster = redis.asyncio.RedisCluster(host="127.0.0.1", port=redis_cluster[0])
    store = RedisCheckpointStore(lambda: cluster, prefix="waits", wait_replicas=1)
    try:
        with pytest.raises(CheckpointError, match="not supported on Redis Cluster.*Sentinel"):
            await store.latest("r")
    finally:
        await cluster.aclose()


async def test_a_start_the_replica_did_not_acknowledge_is_retried_into_one_run(pair: ReplicaSet) -> None:
    tickets = make_tickets()
    store = RedisCheckpointStore.from_url(pair.primary.url, wait_replicas=1, wait_timeout_s=WAIT_S)
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store, checkpoint_key=KEY)
    # Given the replica cut off when an order starts: its step 0 is not acknowledged
    pair.link.cut()
    with pytest.raises(StoreNotDurable, match=r"step 0 .*the run may exist.*retry the start with the same run id"):
        await runner.run(PAY, ORDER, run_id="order-3")
    # And a retry while the replica is still away is not answered either (its step 0 could still be lost)
    with pytest.raises(StoreNotDurable, match="as a start retried with its id found it"):
        await runner.run(PAY, ORDER, run_id="order-3")
    assert tickets.counts() == {}
    # When the replica is back and the client retries the same start once more
    pair.link.heal()
    await asyncio.to_thread(lambda: _wait_in_sync(pair))
    result = await runner.run(PAY, ORDER, run_id="order-3")
    # Then it carried on the one run the first try stored: one hold, one charge
    assert result.status == "done"
    assert tickets.counts() == {"hold_seats": 1, "charge_card": 1}
    assert [c.step for c in await store.history("order-3")][0] == 0
