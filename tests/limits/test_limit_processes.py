"""Limits across processes (Redis, and the SQL backend on SQLite and PostgreSQL): a killed holder's slot
comes back, a 429 is shared; and Redis judges on the server's clock."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from _kit.forkpopen import Child, spawn
from _kit.poll import until
from _kit.stores import _remove_postgres_tables, _remove_redis_keys
from limit_proc import HOLD

from agentflow import Event, Events, Executor, Registry
from agentflow.exec.limits import Limit, RedisLimits
from agentflow.exec.limits._backends import BackendRef

#: Worker processes started, frozen or killed: seconds each (make check leaves them to make test).
pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        "sql-sqlite",
        pytest.param("sql-postgres", marks=pytest.mark.postgres),
    ]
)
def spec(request: pytest.FixtureRequest, prefix: str, tmp_path: Path) -> Iterator[str]:
    """A backend URL two processes share."""
    if request.param == "redis":
        url: str = request.getfixturevalue("redis_url")
        yield f"{url}#{prefix}"
        _remove_redis_keys(url, prefix)
    elif request.param == "sql-sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'limits.db'}#{prefix}_"
    else:
        url = request.getfixturevalue("postgres_url")
        yield f"{url}#{prefix}_"
        _remove_postgres_tables(url.replace("+asyncpg", "", 1), f"{prefix}_")


@contextmanager
def second_process(what: str, spec: str) -> Iterator[Child]:
    """A limit_proc.py process (forked from its warm server: `_kit.forkpopen`), killed at the end if still there."""
    proc = spawn(HERE / "limit_proc.py", [what, spec])
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        proc.close()


def wait_for_line(proc: Child, line: str) -> None:
    said = proc.stdout.readline().strip()
    assert said == line, f"the second process said {said!r} (exit code {proc.poll()})"


async def test_a_killed_processs_slot_comes_back_after_its_hold(spec: str) -> None:
    # Given a process that took the one slot of a limit (held 0.6 s unless renewed) and was SIGKILLed
    with second_process("hold", spec) as proc:
        wait_for_line(proc, "held")
        taken_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    backend = BackendRef(spec).get()
    try:
        # When this process asks for the slot until it gets it
        first = await backend.take(HOLD, "", "me")

        async def taken() -> bool:
            return await backend.take(HOLD, "", "me") is None

        await until(taken, "the killed holder's slot coming back", timeout_s=5)

        # Then it was refused while the dead holder's hold lasted, and got the slot when it lapsed
        assert first is not None and first.why == "concurrency"
        assert time.monotonic() - taken_at >= 0.5
    finally:
        await backend.aclose()


@pytest.mark.redis
async def test_the_window_runs_on_the_servers_clock_not_the_callers(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a caller whose clock is an hour ahead
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    backend = RedisLimits.from_url(f"{redis_url}#{prefix}")
    lim = Limit("api", concurrency=2, rate=5, interval_s=10)
    try:
        # When it takes a slot
        assert await backend.take(lim, "", "a") is None
    finally:
        await backend.aclose()

    # Then the start and the hold are stamped with the server's TIME
    client = redis.Redis.from_url(redis_url)
    try:
        now: Any = client.time()
        server_ms = int(now[0]) * 1000 + int(now[1]) // 1000
        held_key, starts_key, _ = backend.keys(lim, "")
        started: Any = client.zrange(starts_key, 0, -1, withscores=True)
        lapses: Any = client.zrange(held_key, 0, -1, withscores=True)
    finally:
        client.close()
    assert abs(server_ms - started[0][1]) < 2000
    assert abs(server_ms + lim.hold_s * 1000 - lapses[0][1]) < 2000


async def test_a_429_in_one_process_holds_back_the_calls_of_another(spec: str) -> None:
    # Given a second process whose call of a tool under limit "api" got a 429 asking for 0.8 s
    with second_process("throttle", spec) as proc:
        wait_for_line(proc, "closed")
        closed_at = time.monotonic()

    # When this process calls another tool under the same limit
    registry = Registry(limit_backend=spec)
    registry.limit(Limit("api", concurrency=3))
    started: list[float] = []

    @registry.tool(limits=["api"])
    async def fetch(url: str) -> str:
        started.append(time.monotonic())
        return url

    events: list[Event] = []
    hub = Events()
    hub.subscribe(events.append, ["call.waiting", "call.admitted"])
    try:
        assert await Executor(registry, events=hub).run("fetch", {"url": "u"}) == "u"
    finally:
        await registry.limits.backend.get().aclose()

    # Then it waited out the back-off the other process recorded, and said why it waited
    assert started[0] - closed_at >= 0.6
    waiting = [e for e in events if e.name == "call.waiting"]
    assert [(e.data["limit"], e.data["why"]) for e in waiting] == [("api", "closed")]
    assert 0.3 < waiting[0].data["wait_s"] <= 0.8
    assert [e.name for e in events][-1] == "call.admitted"
