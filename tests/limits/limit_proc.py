"""A second process for the shared-limit tests: ``python limit_proc.py <what> <backend URL#prefix>``.

- ``hold``: take the one slot of limit ``api`` (hold 0.6 s), print ``held``, and sleep until killed.
- ``throttle``: run a tool of limit ``api`` that answers 429 (Retry-After 0.8 s, no retry), print ``closed``.
"""

from __future__ import annotations

import asyncio
import sys

from agentflow import Executor, Registry
from agentflow.errors import RateLimited
from agentflow.exec.limits import Limit
from agentflow.exec.limits._backends import BackendRef

HOLD = Limit("api", concurrency=1, hold_s=0.6)
#: What the warm server imports before it forks this script's processes (`_kit.forkserver`): each backend's
#: module and its driver, as the backend imports them when it opens (about a second of a child's start else).
PRELOAD = (
    "agentflow.exec.limits.redis",
    "agentflow.exec.limits.sql",
    "sqlalchemy.dialects.sqlite.aiosqlite",
    "aiosqlite",
    "sqlalchemy.dialects.postgresql.asyncpg",
    "asyncpg",
)


async def hold(spec: str) -> None:
    backend = BackendRef(spec).get()
    assert await backend.take(HOLD, "", "the-dead-one") is None
    print("held", flush=True)
    await asyncio.sleep(3600)


async def throttle(spec: str) -> None:
    registry = Registry(limit_backend=spec)
    registry.limit(Limit("api", concurrency=3, retries_429=0))

    @registry.tool(limits=["api"])
    async def search(q: str) -> str:
        raise RateLimited("the provider said 429", 0.8)

    try:
        await Executor(registry).run("search", {"q": "x"})
    except RateLimited:
        print("closed", flush=True)
    await registry.limits.backend.get().aclose()


def main(argv: list[str]) -> None:
    asyncio.run({"hold": hold, "throttle": throttle}[argv[0]](argv[1]))


if __name__ == "__main__":
    main(sys.argv[1:])
