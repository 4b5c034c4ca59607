"""`RedisLimits`: limits shared by every process that talks to one Redis, in Lua, on the server's clock.

Key layout (``P`` is the prefix, ``L`` the limit's name, ``K`` the tenant key, each
percent-encoded so that no brace breaks the hash tag)::

    P:limit:{L/K}:held     zset    holder token -> when its slot lapses (ms, server clock)
    P:limit:{L/K}:starts   zset    start token -> when it started (ms)
    P:limit:{L/K}:closed   string  until when a 429 closed the limit (ms)

Every operation is one run of ``_lua/limit.lua`` over the three keys of one limit and
key (one slot on a Redis Cluster): it reads the server's ``TIME``, drops lapsed holders and
starts that left the window, and decides. So a slot and a start are taken together or not
at all, a killed holder's slot comes back `Limit.hold_s` after its last renewal, and hosts
with skewed clocks agree. Each key expires once nothing in it counts any more.

Clients are made lazily, one per process and event loop (`LoopClients`, as the Redis
store's): nothing connects at import or construction, and a forked process (a Celery
prefork child) makes its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from importlib import resources
from typing import Final
from urllib.parse import quote

from redis.asyncio import Redis

from agentflow._errors import CheckpointError, LimitsUnavailable
from agentflow.exec.checkpoints.redis.clients import Client, LoopClients
from agentflow.exec.limits._protocol import Refusal, RefusalReason
from agentflow.exec.limits._spec import Limit

_SCRIPT: Final = (resources.files(__package__) / "_lua" / "limit.lua").read_text()


class RedisLimits:
    """Limits whose state lives in Redis, shared by every worker that uses the same server and prefix."""

    def __init__(
        self, client_factory: Callable[[], Client], *, prefix: str = "agentflow", op_timeout_s: float = 10.0
    ) -> None:
        """Limits on the Redis the clients of `client_factory` talk to (called once per process and event loop).

        Args:
            client_factory: makes a ``redis.asyncio`` client (``decode_responses=False``).
            prefix: first part of every key (limits of one prefix are shared; another prefix is apart).
            op_timeout_s: the deadline of each operation.

        Raises:
            ValueError: `prefix` is empty or holds a brace.
        """
        if not prefix or "{" in prefix or "}" in prefix:
            raise ValueError(f"prefix must be a non-empty string without braces, not {prefix!r}")
        self._factory, self._timeout = client_factory, op_timeout_s
        self._prefix = prefix
        self._clients = LoopClients(client_factory, {"limit": _SCRIPT}, op_timeout_s)
        self._pid = os.getpid()

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "agentflow", op_timeout_s: float = 10.0) -> RedisLimits:
        """Limits on the Redis at `url` (``redis://``, ``rediss://``, ``unix://``); ``#name`` at its end is the prefix.

        Raises:
            ValueError: `url` is not a Redis URL.
        """
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"url must be a redis://, rediss:// or unix:// URL; got {url!r}")
        address, _, fragment = url.partition("#")

        def client() -> Redis:
            return Redis.from_url(address, socket_timeout=None, socket_connect_timeout=op_timeout_s)

        return cls(client, prefix=fragment or prefix, op_timeout_s=op_timeout_s)

    def keys(self, limit: Limit, key: str) -> list[str]:
        """The held, starts and closed keys of `limit` for tenant `key`."""
        tag = f"{{{quote(limit.name, safe='')}/{quote(key, safe='')}}}"
        return [f"{self._prefix}:limit:{tag}:{part}" for part in ("held", "starts", "closed")]

    async def _run(self, op: str, limit: Limit, key: str, token: str = "", close_ms: int = 0) -> tuple[str, float]:
        if self._pid != os.getpid():  # forked: never use the parent's connections
            self._clients, self._pid = LoopClients(self._factory, {"limit": _SCRIPT}, self._timeout), os.getpid()
        args: list[str | int] = [op, token, limit.concurrency or 0, _ms(limit.hold_s), limit.rate or 0]
        args += [_ms(limit.window_s), close_ms]
        try:
            async with self._clients.use() as bound:
                word, ms = await bound.scripts["limit"](keys=self.keys(limit, key), args=args)
        except CheckpointError as exc:  # what the shared client holder says when Redis does not answer
            raise LimitsUnavailable(f"RedisLimits: {exc}") from exc
        return (word.decode() if isinstance(word, bytes) else str(word)), int(ms) / 1000

    async def take(self, limit: Limit, key: str, token: str) -> Refusal | None:
        """See `LimitBackend.take`."""
        word, seconds = await self._run("take", limit, key, token)
        if word == "taken":
            return None
        why: RefusalReason = "closed" if word == "closed" else "concurrency" if word == "concurrency" else "rate"
        return Refusal(why, max(seconds, 0.0))

    async def start(self, limit: Limit, key: str, token: str) -> None:
        """See `LimitBackend.start`."""
        await self._run("start", limit, key, token)

    async def renew(self, limit: Limit, key: str, token: str) -> bool:
        """See `LimitBackend.renew`."""
        return (await self._run("renew", limit, key, token))[0] == "held"

    async def release(self, limit: Limit, key: str, token: str) -> None:
        """See `LimitBackend.release`."""
        await self._run("release", limit, key, token)

    async def close(self, limit: Limit, key: str, seconds: float) -> float:
        """See `LimitBackend.close`."""
        return (await self._run("close", limit, key, close_ms=_ms(seconds)))[1]

    async def aclose(self) -> None:
        """Close this event loop's client (the next operation makes a new one)."""
        await self._clients.aclose()


def _ms(seconds: float) -> int:
    """Whole milliseconds, at least 1."""
    return max(1, round(seconds * 1000))
