"""Run leases: renewed while held, released at the end, never taken twice, never waited on for ever."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import fakeredis
import pytest
import redis
import redis.asyncio
from redis import exceptions as redis_errors

from agentflow.celery._lease import Leases


@pytest.fixture(params=["fakeredis", pytest.param("redis", marks=pytest.mark.redis)])
def make_client(request: pytest.FixtureRequest) -> Iterator[Callable[[], redis.asyncio.Redis]]:
    """Clients of one server: fakeredis, or the real one (as the workers make them)."""
    if request.param == "fakeredis":
        server = fakeredis.FakeServer()
        yield lambda: fakeredis.FakeAsyncRedis(server=server)
        return
    url: str = request.getfixturevalue("redis_url")
    yield lambda: redis.asyncio.Redis.from_url(url, socket_timeout=None)


def leases(make_client: Callable[[], redis.asyncio.Redis], lease_s: float, prefix: str) -> Leases:
    return Leases(make_client, prefix=prefix, lease_s=lease_s)


async def test_a_lease_held_longer_than_its_term_is_renewed_and_then_released(make_client, unique_prefix):
    # Given a lease term of 0.3 s
    prefix = unique_prefix()
    made, probe = leases(make_client, 0.3, prefix), make_client()
    async with made.hold("r1") as held:
        assert held is not None
        # When the holder works for three terms
        await asyncio.sleep(0.9)
        # Then the lease is still there (renewed), and a second holder is refused
        assert await probe.exists(f"{prefix}:lease:{{r1}}")
        async with made.hold("r1") as second:
            assert second is None
    # And it is gone once the block ends
    assert not await probe.exists(f"{prefix}:lease:{{r1}}")
    await probe.aclose()
    await made.aclose()


async def test_a_short_hold_starts_no_task(make_client, unique_prefix):
    # Given a lease term far longer than the work done under it
    made = leases(make_client, 30, unique_prefix())
    before = asyncio.all_tasks()
    async with made.hold("r1") as held:
        assert held is not None
        # Then the renewal waits on a timer: no task was started for it
        assert asyncio.all_tasks() == before
    await made.aclose()


async def test_releasing_with_clear_decision_forgets_the_decision_marker(make_client, unique_prefix):
    # Given a run that waited for a decision
    prefix = unique_prefix()
    made, probe = leases(make_client, 5, prefix), make_client()
    await made.mark_decision("r1", [("charge", "in doubt")])
    # When a holder moves the run on and says so
    async with made.hold("r1") as held:
        assert held is not None
        held.clear_decision = True
    # Then the lease and the marker are gone together
    assert not await probe.exists(f"{prefix}:lease:{{r1}}")
    assert await made.decision("r1") is None
    await probe.aclose()
    await made.aclose()


async def test_a_server_that_never_answers_fails_the_lease_at_the_deadline():
    # Given a server that accepts connections and then says nothing, a client without a
    # socket timeout, and leases with a deadline of 0.3 s
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client hangs up
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    made = Leases(lambda: redis.asyncio.Redis(host="127.0.0.1", port=port, socket_timeout=None), op_timeout_s=0.3)
    # When a lease is taken, Then it fails at the deadline with redis-py's TimeoutError
    started = time.monotonic()
    with pytest.raises(redis_errors.TimeoutError, match=r"did not answer within 0\.3 s"):
        async with made.hold("r1"):
            raise AssertionError("the lease was not taken, so the block must not run")
    assert time.monotonic() - started < 5
    await made.aclose()
    server.close()
    await server.wait_closed()


def test_lease_settings_are_checked():
    for kwargs in ({"lease_s": 0}, {"op_timeout_s": 0}, {"op_timeout_s": -1.0}):
        with pytest.raises(ValueError, match="must be positive"):
            Leases(fakeredis.FakeAsyncRedis, **kwargs)
