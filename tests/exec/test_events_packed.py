"""A finished run's event stream is packed on Redis: fewer bytes, the same entries at the same cursors.

Once the recorder has stored a run's last event, the Redis store packs the stream's rows
into one compressed value beside it (`EventCompacting`). What any reader gets is unchanged:
every entry, its bytes, its cursor, each checked by its own signature. What someone who can
write to the server puts in the packed value is refused or reported, never read as data.
"""

from __future__ import annotations

import os
import time
import zlib
from importlib import resources
from typing import Any

import pytest
import redis.asyncio as aioredis
from _kit.stores import StoreSetup, setups
from _kit.tickets import FANOUT, KEY, ORDER, TICKETS, make_tickets

from agentflow import Events, Executor, FlowRunner
from agentflow.errors import CheckpointStoreCorrupt
from agentflow.exec.checkpoints import RedisCheckpointStore
from agentflow.exec.checkpoints.redis._events import PACKED_MAX, UNPACKED_MAX, _pack, _unpack
from agentflow.exec.run import events as run_events
from agentflow.exec.run.events import follow_events, read_events
from agentflow.exec.seal import Sealer

REDIS = setups("fakeredis", "redis")


async def _finished(store_setup: StoreSetup, spied: list[Any] | None = None) -> RedisCheckpointStore:
    store = store_setup.open()
    assert isinstance(store, RedisCheckpointStore)
    if spied is not None:  # what a reader read just before the stream was packed, and just after
        packing = store.compact_events

        async def compact_events(run_id: str) -> bool:
            spied.append(list(await store.read_events(run_id)))
            done = await packing(run_id)
            spied.append(list(await store.read_events(run_id)))
            return done

        store.compact_events = compact_events  # type: ignore[method-assign]
    runner = FlowRunner(Executor(make_tickets().registry, events=Events(record=True)), checkpoints=store,
                        checkpoint_key=KEY)  # fmt: skip
    assert (await runner.run(TICKETS, ORDER, run_id="order-1")).status == "done"
    return store


@pytest.mark.parametrize("store_setup", REDIS, indirect=True)
async def test_a_finished_runs_stream_is_packed_and_reads_as_it_did(
    store_setup: StoreSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a run whose recorder appended as soon as it could (several entries), then finished
    monkeypatch.setattr(run_events, "FLUSH_AFTER_S", 0.0)
    spied: list[Any] = []
    store = await _finished(store_setup, spied)
    # Then its stream was packed once, after run.finished was stored: the stream is empty, the packed value holds it
    before, after = spied
    assert len(before) >= 3 and after == before
    entries, packed = await store_setup.rows.packed_events("order-1")  # type: ignore[attr-defined]
    assert (
        entries == 0 and packed is not None and [i for i, _ in _unpack("order-1", packed)] == [e.cursor for e in before]
    )
    # And every event reads without a problem, ending with run.finished, and reads on from each cursor as before
    every = await read_events(store, Sealer(KEY), "order-1")
    assert all(e.problem is None for e in every) and every[-1].name == "run.finished"
    for i, event in enumerate(every):
        assert [e.cursor for e in await read_events(store, Sealer(KEY), "order-1", after=event.cursor)] == [
            e.cursor for e in every[i + 1 :]
        ]
    # And a follower (FlowClient.events, the viewer's live page) sees the same run to its end
    followed = [e async for e in follow_events(store, Sealer(KEY), "order-1", settle_s=0.0, poll_s=0.01)]
    assert followed == every


@pytest.mark.parametrize("store_setup", REDIS, indirect=True)
async def test_a_run_that_has_not_ended_keeps_its_stream_as_it_is(store_setup: StoreSetup) -> None:
    # Given a run paused for an approval (its recorder stored no run.finished)
    store = store_setup.open()
    runner = FlowRunner(Executor(make_tickets().registry, events=Events(record=True)), checkpoints=store,
                        checkpoint_key=KEY)  # fmt: skip
    assert (await runner.run(FANOUT, ORDER, run_id="asks-1")).status == "paused"
    # Then its stream holds its entries and nothing is packed
    entries, packed = await store_setup.rows.packed_events("asks-1")  # type: ignore[attr-defined]
    assert entries >= 1 and packed is None


@pytest.mark.parametrize("store_setup", REDIS, indirect=True)
async def test_packing_a_stream_that_changed_since_it_was_read_changes_nothing(store_setup: StoreSetup) -> None:
    # Given a finished run's packed events, and one entry appended to the stream since (a retried run's)
    store = await _finished(store_setup)
    await store.append_events("order-1", [Sealer(KEY).seal_event("order-1", {"pos": ["w", 0], "events": []})])
    entries, packed = await store_setup.rows.packed_events("order-1")  # type: ignore[attr-defined]
    assert entries == 1 and packed is not None
    stream = list(await store.read_events("order-1"))
    # When a packing that read the stream before that append (0 entries, or another first or last id) goes ahead
    script = (resources.files("agentflow.exec.checkpoints.redis") / "_lua" / "compact_events.lua").read_text()
    keys = [f"{store_setup.rows.prefix}:run:{{order-1}}:{part}" for part in ("events", "packed")]  # type: ignore[attr-defined]
    client: Any = store_setup.rows._client()  # type: ignore[attr-defined]
    try:
        stale = [[0, stream[-1].cursor, stream[-1].cursor, len(packed), b"x"],
                 [1, "1-0", stream[-1].cursor, len(packed), b"x"],
                 [1, stream[-1].cursor, stream[-1].cursor, len(packed) + 1, b"x"]]  # fmt: skip
        replies = [await client.eval(script, 2, *keys, *args) for args in stale]
    finally:
        await client.aclose()
    # Then each is refused and the stream and its packed events read as they did
    assert replies == [0, 0, 0]
    assert await store_setup.rows.packed_events("order-1") == (1, packed)  # type: ignore[attr-defined]
    assert list(await store.read_events("order-1")) == stream


@pytest.mark.parametrize("store_setup", REDIS, indirect=True)
@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"not compressed", "while decompressing"),
        (zlib.compress(b"some other format\n"), "not version 1 of packed events"),
        (zlib.compress(bytes(UNPACKED_MAX + 1)), f"within {UNPACKED_MAX} bytes"),
        (_pack([("5-0", b"x"), ("4-0", b"y")]), "out of order"),
    ],
    ids=["not-zlib", "other-format", "inflates-past-the-bound", "ids-out-of-order"],
)
async def test_a_packed_value_this_store_did_not_write_is_refused_with_what_is_wrong(
    store_setup: StoreSetup, value: bytes, why: str
) -> None:
    # Given a finished run whose packed events someone replaced
    store = await _finished(store_setup)
    await store_setup.rows.put_packed_events("order-1", value)  # type: ignore[attr-defined]
    # When its events are read, Then the read says which run's packed events are wrong, and why
    with pytest.raises(CheckpointStoreCorrupt, match=f"run 'order-1': its packed events cannot be read.*{why}"):
        await store.read_events("order-1")


@pytest.mark.parametrize("store_setup", REDIS, indirect=True)
async def test_an_8_mib_forged_packed_value_is_refused_by_its_length_before_it_is_decoded(
    store_setup: StoreSetup,
) -> None:
    # Given a finished run whose packed value someone replaced with 8 MiB of well-framed rows (random bytes each,
    # so it stays 8 MiB compressed): before the bound, a read inflated and framed it, seconds of CPU each time
    store = await _finished(store_setup)
    rows: list[tuple[str, bytes]] = []
    size = 0
    while size < 8 * 1024 * 1024:
        rows += [(f"{len(rows) + i + 1}-0", os.urandom(4096)) for i in range(256)]
        size += 256 * 4096
    forged = _pack(rows)
    assert len(forged) >= 8 * 1024 * 1024
    await store_setup.rows.put_packed_events("order-1", forged)  # type: ignore[attr-defined]
    # When its events are read
    started = time.process_time()
    with pytest.raises(CheckpointStoreCorrupt, match=f"is {len(forged)} bytes long, over the {PACKED_MAX}"):
        await store.read_events("order-1")
    # Then the read is refused by the value's length alone, at once (the script sends its length, not the value)
    assert time.process_time() - started < 0.2


@pytest.mark.parametrize("store_setup", REDIS, indirect=True)
async def test_a_row_changed_inside_the_packed_value_reads_as_a_problem_never_as_data(store_setup: StoreSetup) -> None:
    # Given a finished run's packed events
    store = await _finished(store_setup)
    _, packed = await store_setup.rows.packed_events("order-1")  # type: ignore[attr-defined]
    rows = _unpack("order-1", packed)
    # When someone changes a tool's name in one of its rows and packs them again (no key needed)
    victim = next(i for i, (_, row) in enumerate(rows) if b"charge_card" in row)
    rows[victim] = (rows[victim][0], rows[victim][1].replace(b"charge_card", b"refund_card"))
    await store_setup.rows.put_packed_events("order-1", _pack(rows))  # type: ignore[attr-defined]
    events = await read_events(store, Sealer(KEY), "order-1")
    # Then that entry reads as one event with a problem, and no event names the forged tool
    bad = [e for e in events if e.problem]
    assert len(bad) == 1 and bad[0].name == "" and bad[0].cursor == rows[victim][0]
    assert not [e for e in events if e.data.get("tool") == "refund_card"]


@pytest.mark.redis
async def test_a_real_redis_keeps_a_finished_runs_events_in_a_fraction_of_what_the_stream_took(
    redis_url: str, unique_prefix: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the same finished run twice on the real Redis (several entries each), once with packing turned off
    monkeypatch.setattr(run_events, "FLUSH_AFTER_S", 0.0)
    prefix = unique_prefix()
    store = RedisCheckpointStore(lambda: aioredis.Redis.from_url(redis_url), prefix=prefix)
    runner = FlowRunner(Executor(make_tickets().registry, events=Events(record=True)), checkpoints=store,
                        checkpoint_key=KEY)  # fmt: skip
    with monkeypatch.context() as unpacked:
        unpacked.setattr(run_events._Recorder, "compact", _no_packing)
        assert (await runner.run(TICKETS, ORDER, run_id="as-stream")).status == "done"
    assert (await runner.run(TICKETS, ORDER, run_id="packed")).status == "done"
    client = aioredis.Redis.from_url(redis_url)
    try:
        usage = {
            run_id: sum(
                [await client.memory_usage(f"{prefix}:run:{{{run_id}}}:{part}") or 0 for part in ("events", "packed")]
            )
            for run_id in ("as-stream", "packed")
        }
    finally:
        await client.aclose()
        for run_id in ("as-stream", "packed"):
            await store.delete(run_id)
        await store.aclose()
    # Then the packed events take under half of what the stream took (MEMORY USAGE: the server's own count)
    assert usage["packed"] < usage["as-stream"] / 2, usage


async def _no_packing(self: Any) -> None:
    return None
