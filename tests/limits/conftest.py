"""The ``backend`` fixture: each limits backend in turn (local; Redis real and fakeredis), on a prefix of its own."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from _kit.stores import _remove_redis_keys

from agentflow.exec.limits import LimitBackend, LocalLimits, RedisLimits


@pytest.fixture
def prefix() -> str:
    return f"lim{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["local", "fakeredis", pytest.param("redis", marks=pytest.mark.redis)])
async def backend(request: pytest.FixtureRequest, prefix: str) -> AsyncIterator[LimitBackend]:
    if request.param == "local":
        yield LocalLimits()
        return
    if request.param == "fakeredis":
        import fakeredis

        server = fakeredis.FakeServer()
        made: LimitBackend = RedisLimits(lambda: fakeredis.FakeAsyncRedis(server=server), prefix=prefix)
        yield made
        await made.aclose()
        return
    url: str = request.getfixturevalue("redis_url")
    made = RedisLimits.from_url(f"{url}#{prefix}")
    try:
        yield made
        await made.aclose()
    finally:
        _remove_redis_keys(url, prefix)  # this test's keys only
