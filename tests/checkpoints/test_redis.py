"""RedisCheckpointStore: the store's rules and its Redis-only behaviour (TTL, hash tags, tenants).

Every rule runs against fakeredis (Lua through lupa) and, marked ``redis``, the real server
of the ``redis_url`` fixture (tests/conftest.py). Each test uses its own key prefix and
deletes its keys afterwards; nothing here flushes a database.
"""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot

from agentflow._errors import CheckpointConflict, CheckpointError, CheckpointNotFound, CheckpointStoreCorrupt
from agentflow.exec.checkpoints import CheckpointStore, RedisCheckpointStore, SealedCall, SealedCheckpoint

RUN_PARTS = ("cp", "latest", "calls", "next")


def cp(
    run_id: str,
    step: int,
    *,
    status: str = "running",
    segment: int = 0,
    flow: str = "orders",
    saved_at: float | None = None,
    payload: bytes | None = None,
) -> SealedCheckpoint:
    body = payload if payload is not None else f"body of {run_id} step {step}\n\x00\xff".encode("latin-1")
    at = time.time() + step if saved_at is None else saved_at
    return SealedCheckpoint(run_id, step, flow, status, segment, at, body, "kid-1", f"sig-{step}")


def rec(run_id: str, segment: int, seq: int, kind: str = "started") -> SealedCall:
    return SealedCall(run_id, segment, seq, kind, b"\x00call\n" + bytes([seq]), "kid-1", f"sig-{segment}.{seq}")


@dataclass
class Backend:
    name: str
    prefix: str
    make_client: Callable[..., Any]

    def store(self, **kwargs: Any) -> RedisCheckpointStore:
        kwargs.setdefault("prefix", self.prefix)
        return RedisCheckpointStore(self.make_client, **kwargs)

    def run_keys(self, run_id: str, prefix: str | None = None) -> list[str]:
        return [f"{prefix or self.prefix}:run:{{{run_id}}}:{part}" for part in RUN_PARTS]


@pytest.fixture(params=["fakeredis", pytest.param("redis", marks=pytest.mark.redis)])
def backend(request: pytest.FixtureRequest, unique_prefix: Callable[[], str]) -> Iterator[Backend]:
    prefix = unique_prefix()
    if request.param == "fakeredis":
        server = fakeredis.FakeServer()
        yield Backend("fakeredis", prefix, lambda **kw: fakeredis.FakeAsyncRedis(server=server, **kw))
        return
    url: str = request.getfixturevalue("redis_url")  # skips locally, fails under CI, if Redis is down
    yield Backend("redis", prefix, lambda **kw: redis.asyncio.Redis.from_url(url, **kw))
    with redis.Redis.from_url(url) as client:  # this test's keys only: its prefix
        stale = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if stale:
            client.delete(*stale)


@pytest.fixture
async def raw(backend: Backend) -> AsyncIterator[Any]:
    client = backend.make_client()
    yield client
    await client.aclose()


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[RedisCheckpointStore]:
    async with backend.store(ttl_s=3600) as s:
        yield s


# --- compare-and-set -------------------------------------------------------------------


async def test_save_step_zero_only_for_a_new_run(store):
    # Given an empty store
    # When a first save is not step 0, Then it conflicts and nothing is stored
    with pytest.raises(CheckpointConflict, match=r"run 'r1': step 1 saved but the store has no step 0"):
        await store.save("r1", 1, cp("r1", 1))
    with pytest.raises(CheckpointNotFound, match="r1"):
        await store.latest("r1")
    # When step 0 is saved, Then a second step 0 conflicts
    await store.save("r1", 0, cp("r1", 0))
    with pytest.raises(CheckpointConflict, match=r"step 0 is not next \(latest is 0\)"):
        await store.save("r1", 0, cp("r1", 0))


async def test_save_must_be_exactly_one_past_latest(store):
    # Given a run at step 0
    await store.save("r1", 0, cp("r1", 0))
    # When step 2 is saved, Then it conflicts (it skips ahead)
    with pytest.raises(CheckpointConflict, match=r"step 2 is not next \(latest is 0\); another worker holds"):
        await store.save("r1", 2, cp("r1", 2))
    # When step 1 is saved, Then it is the latest
    await store.save("r1", 1, cp("r1", 1))
    assert (await store.latest("r1")).step == 1


async def test_save_after_the_run_ended_conflicts(store):
    # Given a run that ended for good at step 1 (done; a failed run takes a retry's claim)
    await store.save("r1", 0, cp("r1", 0))
    await store.save("r1", 1, cp("r1", 1, status="done"))
    # When anyone saves step 2, Then it conflicts naming the end
    with pytest.raises(CheckpointConflict, match=r"run 'r1' ended \(done\) at step 1"):
        await store.save("r1", 2, cp("r1", 2))


async def test_save_of_another_flow_conflicts(store):
    # Given a run of flow "orders"
    await store.save("r1", 0, cp("r1", 0))
    # When a checkpoint of flow "refunds" is saved as its next step, Then it conflicts
    with pytest.raises(CheckpointConflict, match=r"run 'r1' belongs to flow 'orders', not 'refunds'"):
        await store.save("r1", 1, cp("r1", 1, flow="refunds"))


async def test_save_refuses_a_row_of_another_run_or_step(store):
    # Given rows that disagree with the arguments, When saved, Then ValueError and nothing is written
    with pytest.raises(ValueError, match="checkpoint of run 'r2'"):
        await store.save("r1", 0, cp("r2", 0))
    with pytest.raises(ValueError, match="step 1"):
        await store.save("r1", 0, cp("r1", 1))
    assert await store.history("r1") == []


async def test_racing_saves_of_one_step_exactly_one_wins(backend):
    # Given a run at step 0 and eight workers, each on its own store (own connections)
    stores = [backend.store() for _ in range(8)]
    await stores[0].save("r1", 0, cp("r1", 0))
    # When all save step 1 at once
    results = await asyncio.gather(
        *(s.save("r1", 1, cp("r1", 1, segment=1 + i)) for i, s in enumerate(stores)), return_exceptions=True
    )
    # Then exactly one wins and the others get CheckpointConflict
    assert sum(r is None for r in results) == 1
    assert all(isinstance(r, CheckpointConflict) for r in results if r is not None)
    for s in stores:
        await s.aclose()


# --- call log: numbering and fencing -------------------------------------------------------


async def test_record_call_needs_a_checkpoint(store):
    # Given no run, When a call is recorded, Then CheckpointNotFound names the run
    with pytest.raises(CheckpointNotFound, match=r"run 'r1' has no checkpoint"):
        await store.record_call("r1", rec("r1", 0, 0))
    with pytest.raises(ValueError, match="record of run 'r2'"):
        await store.record_call("r1", rec("r2", 0, 0))


async def test_call_records_are_numbered_without_gaps(store):
    # Given a run at step 0
    await store.save("r1", 0, cp("r1", 0))
    # When seq 1 comes first, Then it conflicts
    with pytest.raises(CheckpointConflict, match=r"call record 0.1 is out of sequence \(next is 0.0\)"):
        await store.record_call("r1", rec("r1", 0, 1))
    # When 0 then 0 again, Then the repeat conflicts; 1 then fits
    await store.record_call("r1", rec("r1", 0, 0))
    with pytest.raises(CheckpointConflict, match=r"next is 0.1"):
        await store.record_call("r1", rec("r1", 0, 0, "done"))
    await store.record_call("r1", rec("r1", 0, 1, "done"))
    assert [(r.seq, r.kind) for r in await store.calls("r1")] == [(0, "started"), (1, "done")]


async def test_fenced_worker_cannot_start_a_call(store):
    # Given worker A holds segment 0 and has started a call
    await store.save("r1", 0, cp("r1", 0, segment=0))
    await store.record_call("r1", rec("r1", 0, 0))
    # When worker B claims step 1 with segment 1
    await store.save("r1", 1, cp("r1", 1, segment=1))
    # Then A's next started record is refused, but A may still close its open call
    with pytest.raises(CheckpointConflict, match=r"segment 0 was fenced off by segment 1"):
        await store.record_call("r1", rec("r1", 0, 1))
    await store.record_call("r1", rec("r1", 0, 1, "done"))
    # And B starts calls in its own segment, numbered from 0
    await store.record_call("r1", rec("r1", 1, 0))


async def test_started_record_refused_after_the_run_ended(store):
    # Given a run that is done
    await store.save("r1", 0, cp("r1", 0, status="done"))
    # When a call starts, Then it conflicts; a closing record still fits
    with pytest.raises(CheckpointConflict, match=r"run 'r1' ended \(done\); no call may start"):
        await store.record_call("r1", rec("r1", 0, 0))
    await store.record_call("r1", rec("r1", 0, 0, "unrecordable"))


async def test_racing_started_records_exactly_one_wins(backend, store):
    # Given a run and six writers racing for call 0.0
    await store.save("r1", 0, cp("r1", 0))
    stores = [backend.store() for _ in range(6)]
    results = await asyncio.gather(*(s.record_call("r1", rec("r1", 0, 0)) for s in stores), return_exceptions=True)
    # Then exactly one record is stored
    assert sum(r is None for r in results) == 1
    assert len(await store.calls("r1")) == 1
    for s in stores:
        await s.aclose()


# --- reading back ------------------------------------------------------------------------


async def test_history_and_latest_return_rows_as_given(store):
    # Given three checkpoints with binary payloads (newlines, NUL, non-UTF-8)
    rows = [cp("r1", i, payload=b"\n\x00\xfe{" * i) for i in range(3)]
    for row in rows:
        await store.save("r1", row.step, row)
    # Then history is every row oldest first, latest the newest, both byte for byte
    assert list(await store.history("r1")) == rows
    assert await store.latest("r1") == rows[-1]
    assert await store.history("nobody") == []
    with pytest.raises(CheckpointNotFound, match="'nobody'"):
        await store.latest("nobody")


async def test_calls_are_ordered_by_segment_then_seq(store):
    # Given records in segments 2 and 10 written in an interleaved order
    await store.save("r1", 0, cp("r1", 0, segment=2))
    for seq in range(3):
        await store.record_call("r1", rec("r1", 2, seq))
    for step in range(1, 11):
        await store.save("r1", step, cp("r1", step, segment=10))
    await store.record_call("r1", rec("r1", 10, 0))
    await store.record_call("r1", rec("r1", 2, 3, "done"))
    # Then calls come by segment numerically (2 before 10), then seq
    assert [(r.segment, r.seq) for r in await store.calls("r1")] == [(2, 0), (2, 1), (2, 2), (2, 3), (10, 0)]
    assert (await store.calls("r1"))[0] == rec("r1", 2, 0)


async def test_unreadable_rows_are_corrupt(store, raw, backend):
    # Given a run whose newest checkpoint row and a call row were overwritten with junk
    await store.save("r1", 0, cp("r1", 0))
    await store.record_call("r1", rec("r1", 0, 0))
    cp_key, _, calls_key, _ = backend.run_keys("r1")
    await raw.rpush(cp_key, b"not a row")
    await raw.hset(calls_key, "0:0", b'[1,"r1",0,0,"started","k"]\npayload')
    # Then reading them raises CheckpointStoreCorrupt naming the run
    with pytest.raises(CheckpointStoreCorrupt, match="run 'r1'"):
        await store.latest("r1")
    with pytest.raises(CheckpointStoreCorrupt, match="run 'r1'"):
        await store.calls("r1")
    # And a genuine row copied into another run is out of place
    await raw.rpush(backend.run_keys("r2")[0], await raw.lindex(cp_key, 0))
    with pytest.raises(CheckpointStoreCorrupt, match="belongs to run 'r1'"):
        await store.latest("r2")


# --- the lease take that reads the head -------------------------------------------------


async def test_a_take_reading_the_head_returns_what_head_reads_in_one_script(store, backend, raw):
    # Given a run with two checkpoints and records in two segments
    await store.save("r1", 0, cp("r1", 0))
    await store.record_call("r1", rec("r1", 0, 0))
    await store.save("r1", 1, cp("r1", 1, segment=1))
    await store.record_call("r1", rec("r1", 1, 0))
    # When a free lease is taken with the head
    lease, head, _ = await store.take_lease_reading_head("r1", "w1", "t1", 30)
    # Then the lease is held by the taker, and the head is the one `head` reads
    assert (lease.owner, lease.token) == ("w1", "t1")
    assert (await store.leases(["r1"]))["r1"].token == "t1"
    assert head == await store.head("r1")
    # And another taker gets the live lease and no head
    other, none, _ = await store.take_lease_reading_head("r1", "w2", "t2", 30)
    assert other.token == "t1" and none is None
    # And a run with nothing stored gives its lease and no head
    _, nothing, _ = await store.take_lease_reading_head("r9", "w1", "t9", 30)
    assert nothing is None
    # And counts that are not numbers are corrupt, as `head` finds them
    await raw.hset(backend.run_keys("r1")[3], "1", b"many")
    await store.release_lease("r1", "t1")
    with pytest.raises(CheckpointStoreCorrupt, match="record counts are not numbers"):
        await store.take_lease_reading_head("r1", "w1", "t3", 30)


async def test_a_take_reading_the_head_reads_a_marker_about_the_run_in_the_same_script(store, backend, raw):
    await store.save("r1", 0, cp("r1", 0))
    # Given a marker about the run (a cancel request), kept in the run's slot
    put = await store.put_marker("cancel/r1", "stop it", "m1", 60)
    assert await raw.exists(f"{backend.prefix}:marker:{{r1}}:cancel")
    # When a free lease is taken with the head and that marker
    lease, head, marker = await store.take_lease_reading_head("r1", "w1", "t1", 30, "cancel/r1")
    # Then the marker is the one `peek_markers` reads
    assert lease.token == "t1" and head == await store.head("r1")
    assert marker == (await store.peek_markers(["cancel/r1"]))["cancel/r1"] == put
    # And a run without one reads None
    await store.save("r2", 0, cp("r2", 0))
    assert (await store.take_lease_reading_head("r2", "w1", "t2", 30, "cancel/r2"))[2] is None
    # And a taker refused by a live lease reads no marker
    assert (await store.take_lease_reading_head("r1", "w2", "t3", 30, "cancel/r1"))[2] is None
    # And a marker about another run is refused before anything is read
    with pytest.raises(ValueError, match="reads a marker about that run"):
        await store.take_lease_reading_head("r2", "w1", "t4", 30, "cancel/r1")


# --- listings and their indexes -----------------------------------------------------------


async def test_list_unfinished_lists_running_and_paused_runs_of_the_flow(store):
    # Given running, paused, done and failed runs of "orders", and a running run of "refunds"
    for run_id, status in [("a", "running"), ("b", "paused"), ("c", "done"), ("d", "failed")]:
        await store.save(run_id, 0, cp(run_id, 0))
        await store.save(run_id, 1, cp(run_id, 1, status=status))
    await store.save("e", 0, cp("e", 0, flow="refunds"))
    # Then only the unfinished runs of each flow are listed
    assert sorted(await store.list_unfinished("orders")) == ["a", "b"]
    assert list(await store.list_unfinished("refunds")) == ["e"]
    assert list(await store.list_unfinished("nothing")) == []
    # When a run finishes, Then it leaves the list
    await store.save("a", 2, cp("a", 2, status="done"))
    assert list(await store.list_unfinished("orders")) == ["b"]


async def test_listings_send_no_keys_or_scan(backend):
    # Given a store whose connections record every command they send
    sent: list[str] = []
    base = fakeredis.FakeAsyncRedisConnection if backend.name == "fakeredis" else redis.asyncio.Connection

    class Recording(base):  # type: ignore[valid-type, misc]
        def pack_command(self, *args):
            sent.append(str(args[0]).split()[0].upper())
            return super().pack_command(*args)

    def factory() -> Any:
        return backend.make_client(connection_class=Recording)

    async with RedisCheckpointStore(factory, prefix=backend.prefix) as s:
        await s.save("r1", 0, cp("r1", 0))
        # When every method runs
        await s.list_unfinished("orders")
        await s.list_runs()
        await s.list_runs("orders")
        await s.delete("r1")
    # Then commands were sent, none of them KEYS or SCAN (and no script calls them either)
    assert "EVALSHA" in sent and not {"KEYS", "SCAN"} & set(sent)
    for script in (resources.files("agentflow.exec.checkpoints.redis") / "_lua").iterdir():
        text = script.read_text("utf-8").upper()
        assert "'KEYS'" not in text and "'SCAN'" not in text


async def test_listings_skip_and_prune_stale_index_entries(store, raw, backend):
    # Given a run that ended but is still in the unfinished index (as after a crash between
    # a save and a separate index update), and runs whose keys expired
    await store.save("ended", 0, cp("ended", 0))
    await store.save("ended", 1, cp("ended", 1, status="done"))
    await raw.zadd(f"{backend.prefix}:unfinished:orders", {"ended": 1.0})
    await store.save("old", 0, cp("old", 0, saved_at=time.time() - 3600))
    await store.save("fresh", 0, cp("fresh", 0))
    # (expiry, as the indexes see it: the keys are gone, and the unfinished entry's expiry time passed)
    await raw.delete(*backend.run_keys("old"), *backend.run_keys("fresh"))
    await raw.zadd(f"{backend.prefix}:unfinished:orders", {"old": time.time() - 5, "fresh": time.time() - 1})
    # When listed, Then none of them is listed as unfinished and no gone run is listed at all
    assert list(await store.list_unfinished("orders")) == []
    assert [c.run_id for c in await store.list_runs()] == ["ended"]
    # And the expired entries left the unfinished index; list_runs removed the surely stale
    # ones and kept the recent one, since a step 0 could be between its index update and its script
    assert await raw.zrange(f"{backend.prefix}:unfinished:orders", 0, -1) == []
    assert sorted(await raw.zrange(f"{backend.prefix}:runs", 0, -1)) == [b"ended", b"fresh"]


async def test_the_unfinished_index_is_scored_by_expiry_and_listed_in_one_round_trip(store, raw, backend):
    # Given a running run (its keys expire in ttl_s) and a paused one (its keys never expire)
    await store.save("run", 0, cp("run", 0))
    await store.save("wait", 0, cp("wait", 0, status="paused"))
    index = f"{backend.prefix}:unfinished:orders"
    # Then the index scores each by when its keys expire, paused runs never
    expires = dict(await raw.zrange(index, 0, -1, withscores=True))
    ttl = await raw.ttl(backend.run_keys("run")[1])
    assert abs(expires[b"run"] - (time.time() + ttl)) < 5
    assert expires[b"wait"] == float("inf")
    # And listing them reads the index only
    assert sorted(await store.list_unfinished("orders")) == ["run", "wait"]


async def test_list_runs_newest_first_per_flow_and_limited(store):
    # Given five runs saved at known times, in two flows
    for i, run_id in enumerate(["a", "b", "c", "d", "e"]):
        await store.save(run_id, 0, cp(run_id, 0, flow="orders" if i % 2 == 0 else "refunds", saved_at=1000.0 + i))
    await store.save("a", 1, cp("a", 1, saved_at=2000.0))
    # Then listings are newest first, filtered by flow, cut at limit
    assert [c.run_id for c in await store.list_runs()] == ["a", "e", "d", "c", "b"]
    assert [(c.run_id, c.step) for c in await store.list_runs("orders", limit=2)] == [("a", 1), ("e", 0)]
    assert [c.run_id for c in await store.list_runs("refunds")] == ["d", "b"]
    assert list(await store.list_runs(limit=0)) == []


async def test_delete_removes_every_key_and_index_entry(store, raw, backend):
    # Given a paused run with calls, listed everywhere
    await store.save("r1", 0, cp("r1", 0, status="paused"))
    await store.record_call("r1", rec("r1", 0, 0, "pending"))
    # When it is deleted (twice: the second is a no-op)
    await store.delete("r1")
    await store.delete("r1")
    # Then no key of the prefix is left and step 0 is free again
    assert [k async for k in raw.scan_iter(match=f"{backend.prefix}*")] == []
    assert await store.list_unfinished("orders") == [] and await store.list_runs() == []
    await store.save("r1", 0, cp("r1", 0))


# --- Redis-only behaviour: expiry, hash tags, tenants, clients ----------------------------------


async def test_keys_expire_after_the_last_write_except_while_paused(backend, raw):
    async with backend.store(ttl_s=600) as s:
        keys = backend.run_keys("r1")
        # Given a running run with a call record, Then every key of the run has a TTL
        await s.save("r1", 0, cp("r1", 0))
        await s.record_call("r1", rec("r1", 0, 0))
        assert all(0 < ttl <= 600 for ttl in [await raw.ttl(k) for k in keys])
        # When it pauses, Then no key expires (also after another record)
        await s.save("r1", 1, cp("r1", 1, status="paused"))
        await s.record_call("r1", rec("r1", 0, 1, "pending"))
        assert [await raw.ttl(k) for k in keys] == [-1] * 4
        # When it is resumed, Then the expiry is back
        await s.save("r1", 2, cp("r1", 2))
        assert all(0 < ttl <= 600 for ttl in [await raw.ttl(k) for k in keys])


async def test_ttl_none_never_expires_and_expired_runs_leave_listings(backend, raw):
    async with backend.store(ttl_s=None) as forever, backend.store(ttl_s=1) as brief:
        # Given one run kept forever and one with a 1 s TTL
        await forever.save("kept", 0, cp("kept", 0))
        await brief.save("gone", 0, cp("gone", 0))
        assert [await raw.ttl(k) for k in backend.run_keys("kept")[:2]] == [-1, -1]
        # When the TTL passes, Then the short-lived run is gone from reads and listings
        await asyncio.sleep(1.3)
        assert [c.run_id for c in await forever.list_runs()] == ["kept"]
        assert list(await forever.list_unfinished("orders")) == ["kept"]
        with pytest.raises(CheckpointNotFound):
            await brief.latest("gone")


async def test_keys_of_a_run_share_one_hash_slot(store, raw, backend):
    # Given runs with awkward ids, each with a checkpoint and a call record
    run_ids = ["plain", "a}b", "x{y}z", "ünï cödé", "a:run:{b}"]
    for run_id in run_ids:
        await store.save(run_id, 0, cp(run_id, 0))
        await store.record_call(run_id, rec(run_id, 0, 0))
    # Then each run's four keys exist and hash to one Redis Cluster slot
    for run_id in run_ids:
        keys = backend.run_keys(run_id)
        assert await raw.exists(*keys) == 4
        assert len({key_slot(k.encode()) for k in keys}) == 1, run_id
    assert {key_slot(k.encode()) for k in backend.run_keys("a}b") + backend.run_keys("a}c")} == {key_slot(b"a")}
    # And ids that would leave the hash tag empty are refused
    for bad in ["", "}x"]:
        with pytest.raises(ValueError, match="hash tag"):
            await store.latest(bad)


async def test_tenants_are_isolated_by_prefix(backend):
    # Given two stores with different prefixes on one server
    async with backend.store() as one, backend.store(prefix=backend.prefix + "-b") as two:
        # When both save run "r1", each its own way
        await one.save("r1", 0, cp("r1", 0))
        await two.save("r1", 0, cp("r1", 0, flow="refunds", status="paused"))
        await one.save("r1", 1, cp("r1", 1, status="done"))
        # Then neither sees the other's run, steps, calls or listings
        assert (await two.latest("r1")).flow == "refunds" and len(await two.history("r1")) == 1
        assert await one.list_unfinished("orders") == [] and await two.list_unfinished("refunds") == ["r1"]
        await two.delete("r1")
        assert (await one.latest("r1")).step == 1


async def test_stored_runs_scans_this_prefix_only_over_every_page(backend, monkeypatch):
    # Given a prefix with SCAN pattern characters, a tenant its unescaped pattern would match,
    # run ids with awkward characters, and pages of 7 keys
    monkeypatch.setattr("agentflow.exec.checkpoints.redis.store._SCAN_COUNT", 7)
    run_ids = sorted([f"run-{i:02d}" for i in range(30)] + ["a}:cp", "a*b?[c]\\d", "ü-run"])
    async with (
        backend.store(prefix=backend.prefix + "*[x]") as ours,
        backend.store(prefix=backend.prefix + "zx") as theirs,
    ):
        for run_id in run_ids:
            await ours.save(run_id, 0, cp(run_id, 0))
            await ours.record_call(run_id, rec(run_id, 0, 0))
        await theirs.save("theirs", 0, cp("theirs", 0))
        # When the runs stored under each prefix are listed
        # Then each store finds exactly its own, from every page, in order
        assert list(await ours.stored_runs()) == run_ids
        assert list(await theirs.stored_runs()) == ["theirs"]


async def test_step_zero_over_keys_left_without_the_latest_hash_is_refused(store, raw, backend):
    # Given a run whose latest hash is gone (deleted by hand, or evicted) while its other keys stay
    await store.save("r1", 0, cp("r1", 0))
    await store.record_call("r1", rec("r1", 0, 0))
    cp_key, latest_key, calls_key, next_key = backend.run_keys("r1")
    await raw.delete(latest_key)
    before = {key: await raw.dump(key) for key in (cp_key, calls_key, next_key)}
    # When step 0 of the same run id is saved again, Then the script refuses it and touches nothing
    with pytest.raises(CheckpointConflict, match="already has stored rows"):
        await store.save("r1", 0, cp("r1", 0, payload=b"second"))
    assert {key: await raw.dump(key) for key in before} == before
    assert await raw.exists(latest_key) == 0
    # And a run with nothing but its call counter left is refused the same way
    await raw.delete(cp_key, calls_key)
    with pytest.raises(CheckpointConflict, match="already has stored rows"):
        await store.save("r1", 0, cp("r1", 0, payload=b"second"))
    assert await raw.exists(next_key) == 1


def test_constructor_and_run_ids_are_validated():
    def factory():
        return fakeredis.FakeAsyncRedis()

    for prefix in ["", "a{b", "a}b"]:
        with pytest.raises(ValueError, match="prefix must be a non-empty string"):
            RedisCheckpointStore(factory, prefix=prefix)
    for ttl in [0, -5, True, 1.5]:
        with pytest.raises(ValueError, match="ttl_s must be a positive"):
            RedisCheckpointStore(factory, ttl_s=ttl)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="client_factory"):
        RedisCheckpointStore("redis://localhost")  # type: ignore[arg-type]
    assert isinstance(RedisCheckpointStore(factory), CheckpointStore)
    assert RedisCheckpointStore(factory).in_process is False


async def test_client_with_decode_responses_is_refused(backend):
    # Given a factory that makes clients which decode replies to str
    s = RedisCheckpointStore(lambda: backend.make_client(decode_responses=True), prefix=backend.prefix)
    # When the store is used, Then it refuses, saying how to fix it
    with pytest.raises(ValueError, match="decode_responses=False"):
        await s.latest("r1")


async def test_unreachable_server_gives_a_clear_error():
    # Given a store pointed at a port nothing listens on
    no_retry = Retry(NoBackoff(), 0)
    s = RedisCheckpointStore(lambda: redis.asyncio.Redis(host="127.0.0.1", port=1, retry=no_retry))
    # When it is used, Then the error names the store and the address, chained from the driver's
    with pytest.raises(CheckpointError, match=r"RedisCheckpointStore cannot reach Redis at 127\.0\.0\.1:1: ") as info:
        await s.save("r1", 0, cp("r1", 0))
    assert isinstance(info.value.__cause__, redis.ConnectionError)
    await s.aclose()


async def test_a_server_that_never_answers_gives_a_clear_error_at_the_deadline():
    # Given a server that accepts connections and then says nothing, and a store whose
    # client has no socket timeout (as from_url makes them) and a deadline of 0.3 s
    heard = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)
        heard.set()
        await reader.read()  # until the client hangs up
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    s = RedisCheckpointStore(
        lambda: redis.asyncio.Redis(host="127.0.0.1", port=port, socket_timeout=None), op_timeout_s=0.3
    )
    # When a checkpoint is saved, Then it fails at the deadline, naming the server and the deadline
    started = time.monotonic()
    with pytest.raises(CheckpointError, match=rf"Redis at 127\.0\.0\.1:{port} did not answer within 0\.3 s"):
        await s.save("r1", 0, cp("r1", 0))
    assert time.monotonic() - started < 5
    assert heard.is_set()  # the command reached the server: the deadline, not the connect, ended it
    await s.aclose()
    server.close()
    await server.wait_closed()


@pytest.mark.redis
async def test_from_url_makes_a_working_store_and_refuses_other_urls(
    redis_url: str, unique_prefix: Callable[[], str]
) -> None:
    # Given a store made from a URL
    prefix = unique_prefix()
    s = RedisCheckpointStore.from_url(redis_url, prefix=prefix, ttl_s=60)
    try:
        # When a checkpoint is saved and read back, Then it round-trips
        await s.save("r1", 0, cp("r1", 0))
        assert (await s.latest("r1")).step == 0
        await s.delete("r1")
    finally:
        await s.aclose()
    # And a URL of another kind, or a bad deadline, is refused with what to give instead
    with pytest.raises(ValueError, match="redis://, rediss://, unix:// or redis\\+sentinel:// URL"):
        RedisCheckpointStore.from_url("postgresql://localhost/db")
    for bad in (0, -1.0, True):
        with pytest.raises(ValueError, match="op_timeout_s must be a positive number"):
            RedisCheckpointStore(lambda: None, op_timeout_s=bad)  # type: ignore[arg-type,return-value]


def test_store_is_usable_from_asyncio_run_calls_in_a_row(backend: Backend) -> None:
    # Given one store, used by two asyncio.run calls one after another (no aclose between)
    s = backend.store()

    async def first() -> None:
        await s.save("r1", 0, cp("r1", 0))

    async def second() -> SealedCheckpoint:
        await s.save("r1", 1, cp("r1", 1))
        return await s.latest("r1")

    asyncio.run(first())
    # Then the second loop gets its own client and the run goes on
    assert asyncio.run(second()).step == 1
    # And the client of each loop was closed as its loop shut down (no connection left open)
    assert s._clients.bound == {}
    gc.collect()


async def test_aclose_then_reuse_and_script_reload(backend):
    # Given a store that was closed
    s = backend.store()
    await s.save("r1", 0, cp("r1", 0))
    await s.aclose()
    # When it is used again, Then it connects again
    await s.save("r1", 1, cp("r1", 1))
    if backend.name == "fakeredis":  # never flush scripts of the shared real server
        # When the server forgot the scripts, Then they are loaded again on NOSCRIPT
        async with backend.make_client() as client:
            await client.script_flush()
        await s.save("r1", 2, cp("r1", 2))
    assert (await s.latest("r1")).step >= 1
    await s.aclose()


# --- Redis Cluster ----------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.slow
async def test_store_works_on_redis_cluster(redis_cluster):
    # Given a store on a three-node Redis Cluster, and runs that land on many slots
    cluster = redis.asyncio.RedisCluster(host="127.0.0.1", port=redis_cluster[0])
    await cluster.initialize()
    run_ids = [f"run-{i}" for i in range(24)]
    assert len({getattr(cluster.get_node_from_key(f"x:run:{{{r}}}:cp"), "name", None) for r in run_ids}) == 3
    async with RedisCheckpointStore(lambda: cluster, prefix="cl", ttl_s=600) as s:
        for i, run_id in enumerate(run_ids):
            # When each run goes through the rules, Then the scripts enforce them on every node
            await s.save(run_id, 0, cp(run_id, 0))
            with pytest.raises(CheckpointConflict, match="not next"):
                await s.save(run_id, 2, cp(run_id, 2))
            await s.record_call(run_id, rec(run_id, 0, 0))
            await s.save(run_id, 1, cp(run_id, 1, segment=1, status="done" if i % 2 else "running"))
            with pytest.raises(CheckpointConflict, match="fenced off|ended"):
                await s.record_call(run_id, rec(run_id, 0, 1))
            assert len(await s.history(run_id)) == 2 and len(await s.calls(run_id)) == 1
            # and a lease take reads the head and the run's cancel marker in the same script, on the run's slot
            await s.put_marker(f"cancel/{run_id}", "please", "m", 60)
            _, head, marker = await s.take_lease_reading_head(run_id, "w", "t", 30, f"cancel/{run_id}")
            assert head == await s.head(run_id) and marker is not None and marker.value == "please"
            assert 0 < await cluster.ttl(f"cl:run:{{{run_id}}}:latest") <= 600
        # Then the listings read across nodes, checking each indexed run (the indexes are
        # updated by separate commands on Cluster): an ended run left in the index is not listed
        await cluster.zadd("cl:unfinished:orders", {run_ids[1]: 1.0})
        assert sorted(await s.list_unfinished("orders")) == sorted(run_ids[::2])
        assert {c.run_id for c in await s.list_runs("orders")} == set(run_ids)
        # And stored_runs finds every run from the keys on all three primaries, index or not
        await cluster.delete("cl:runs", "cl:runs:orders", "cl:unfinished:orders")
        assert list(await s.stored_runs()) == sorted(run_ids)
        # And a run whose latest hash is gone takes no step 0 over its keys
        await cluster.delete(f"cl:run:{{{run_ids[0]}}}:latest")
        with pytest.raises(CheckpointConflict, match="already has stored rows"):
            await s.save(run_ids[0], 0, cp(run_ids[0], 0))
        assert len(await s.history(run_ids[0])) == 2
        # And relist puts its hash back, and the run in the indexes (separate commands on Cluster)
        assert await s.relist(run_ids[0]) == (await s.history(run_ids[0]))[-1]
        assert await s.relist(run_ids[0]) == (await s.history(run_ids[0]))[-1]
        assert list(await s.list_unfinished("orders")) == [run_ids[0]]
        assert [c.run_id for c in await s.list_runs("orders")] == [run_ids[0]]
        await s.save(run_ids[0], 2, cp(run_ids[0], 2, segment=1))
        for run_id in run_ids:
            await s.delete(run_id)
        assert await s.list_runs() == [] and await s.stored_runs() == []


@pytest.mark.redis
@pytest.mark.slow
async def test_the_conformance_suite_passes_on_redis_cluster(redis_cluster):
    from agentflow.exec.checkpoints.conformance import CHECKS, validate

    # Given a fresh store (its own prefix) on the three-node cluster for every check
    def fresh() -> RedisCheckpointStore:
        prefix = f"c{uuid.uuid4().hex[:12]}"
        return RedisCheckpointStore(
            lambda: redis.asyncio.RedisCluster(host="127.0.0.1", port=redis_cluster[0]), prefix=prefix
        )

    # When the whole conformance suite runs, Then every check passes
    report = await validate(fresh)
    assert len(report) == len(CHECKS)
    assert {name: why for name, why in report.items() if why is not None} == {}


async def test_head_reads_the_latest_checkpoint_and_the_records_per_segment_in_one_go(store):
    from agentflow.exec.calls.read import read_head

    # Given a run with two checkpoints, two records in segment 0 and one in segment 1
    await store.save("s1", 0, cp("s1", 0))
    await store.record_call("s1", rec("s1", 0, 0))
    await store.record_call("s1", rec("s1", 0, 1))
    await store.save("s1", 1, cp("s1", 1, segment=1))
    await store.record_call("s1", rec("s1", 1, 0))
    # When its head is read, Then it is the latest checkpoint and the count of each segment
    latest, counts = await read_head(store, "s1")
    assert latest == await store.latest("s1")
    assert counts == {0: 2, 1: 1}
    # And an unknown run is not found
    with pytest.raises(CheckpointNotFound):
        await store.head("nobody")
