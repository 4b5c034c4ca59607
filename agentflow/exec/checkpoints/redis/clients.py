"""One Redis client per event loop for `RedisCheckpointStore`, each operation under a deadline.

redis.asyncio clients belong to the loop that made them, so `LoopClients` makes one per
running loop (with the store's Lua scripts registered on it, sent by SHA after the first
time; with ``functions``, called by name in the library an admin loaded: `redis.functions`)
and closes it when that loop shuts down its async generators, which ``asyncio.run`` does
before it ends: a store used from several ``asyncio.run`` calls in a row leaves no connection open behind each of them.

`LoopClients.use` bounds one store operation, connecting (and, on Cluster, learning the
slots before any command is sent) included, with ``op_timeout_s``
(`asyncio.timeout`, a timer) and turns "Redis does not answer" into `CheckpointError`.
With that deadline the client needs no socket timeout of its own, which spares redis-py's
per-command ``asyncio.wait_for`` (on Python 3.11 a task and extra loop turns per command).

A new client is checked once before its first operation (`LoopClients`' ``check``, the
store's server check: `redis.durability.check_server`); a check that refuses is made
again on the next operation, so a server set right meanwhile is taken.

`LoopClients.scan` walks the keyspace with SCAN on the one server, or on every primary of
a Cluster (the keys of each slot live on its primary), one deadline per page.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from redis import exceptions as redis_errors
from redis.asyncio import Redis, RedisCluster
from redis.commands.core import AsyncScript

from agentflow._errors import CheckpointError
from agentflow.exec.checkpoints.redis.functions import FunctionCall, library_name

Client: TypeAlias = "Redis | RedisCluster"

#: The most commands one pipeline carries. Below redis-py's threshold (1,000 from its 8.x) for
#: packing a pipeline on a thread of the event loop's default executor: a store starts no
#: thread, and each round trip stays short. Every pipeline of the store is built in pages of it.
MAX_PIPELINE: Final = 500
#: Driver errors that mean Redis did not answer.
_UNREACHABLE = (redis_errors.ConnectionError, redis_errors.TimeoutError, redis_errors.ClusterDownError)


@dataclass(eq=False)
class Bound:
    """A client made for one event loop, with the scripts registered on it by name."""

    loop: asyncio.AbstractEventLoop
    client: Client
    scripts: dict[str, AsyncScript | FunctionCall]
    closer: AsyncGenerator[None, None] | None = field(default=None, repr=False)
    checked: bool = False

    @property
    def cluster(self) -> bool:
        """Whether the client talks to a Redis Cluster."""
        return isinstance(self.client, RedisCluster)


class LoopClients:
    """The clients of one store, one per running event loop."""

    def __init__(
        self,
        factory: Callable[[], Client],
        scripts: Mapping[str, str],
        op_timeout_s: float | None,
        check: Callable[[Client], Awaitable[None]] | None = None,
        functions: bool = False,
    ) -> None:
        self._factory = factory
        self._scripts = dict(scripts)
        #: With ``functions``, the loaded library the scripts are called in (`redis.functions`), else None.
        self.library = library_name(self._scripts) if functions else None
        self._check = check
        self.op_timeout_s = op_timeout_s
        self.bound: dict[int, Bound] = {}

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[Bound]:
        """Yield this loop's client for one operation, within the deadline.

        Raises:
            CheckpointError: Redis cannot be reached, or did not answer in time.
            ValueError: the factory made a client that decodes replies to str.
        """
        bound = await self._bind()
        try:
            async with asyncio.timeout(self.op_timeout_s):
                if isinstance(bound.client, RedisCluster):
                    # Learn the slots first (a flag check once done): redis-py's RedisCluster fails
                    # several commands sent at once as a new client's first ("'NoneType' object has
                    # no attribute 'writelines'"), but not after `initialize`, which takes its own lock.
                    await bound.client.initialize()
                if not bound.checked and self._check is not None:
                    await self._check(bound.client)
                    bound.checked = True
                yield bound
        except TimeoutError:  # the deadline (redis-py's own TimeoutError is not this class)
            raise CheckpointError(
                f"RedisCheckpointStore: Redis at {address(bound.client)} did not answer within {self.op_timeout_s} s"
            ) from None
        except (*_UNREACHABLE, redis_errors.RedisClusterException) as exc:
            if not isinstance(exc, _UNREACHABLE) and not isinstance(exc.__cause__, _UNREACHABLE):
                raise  # a cluster error other than "no node answers"
            raise CheckpointError(f"RedisCheckpointStore cannot reach Redis at {address(bound.client)}: {exc}") from exc

    async def scan(self, match: str, count: int) -> list[bytes | str]:
        """Return every key matching the SCAN pattern `match`, on every primary node.

        Each page (``count`` is SCAN's hint) is one operation under the deadline. SCAN's
        guarantee holds: a key present for the whole walk is returned (maybe twice); one
        written or deleted meanwhile may or may not be.

        Raises:
            CheckpointError: Redis cannot be reached, or a page did not come in time.
        """
        async with self.use() as bound:
            cluster = bound.client if isinstance(bound.client, RedisCluster) else None
            if cluster is not None:
                await cluster.initialize()  # the primaries are known once the client has connected
            nodes = cluster.get_primaries() if cluster is not None else [None]
        found: list[bytes | str] = []
        for node in nodes:
            cursor = 0
            while True:
                async with self.use() as bound:
                    if node is None:
                        cursor, keys = await bound.client.scan(cursor, match=match, count=count)
                    else:  # a Cluster client replies with each asked node's cursor: {node name: cursor}
                        page: Any = await bound.client.scan(cursor, match=match, count=count, target_nodes=node)
                        cursor, keys = page[0][node.name], page[1]
                found += keys
                if cursor == 0:
                    break
        return found

    async def aclose(self) -> None:
        """Close this loop's client (the next operation makes a new one)."""
        bound = self.bound.get(id(asyncio.get_running_loop()))
        if bound is not None and bound.closer is not None:
            await bound.closer.aclose()

    async def _bind(self) -> Bound:
        """Return the running loop's client, making it (and registering the scripts) on first use."""
        loop = asyncio.get_running_loop()
        bound = self.bound.get(id(loop))
        if bound is not None and bound.loop is loop:
            return bound
        for key, old in list(self.bound.items()):  # only when a loop is new: entries come with loops
            if old.loop.is_closed():  # it ended without shutting its async generators down
                self.bound.pop(key, None)
        client = self._factory()
        if client.get_encoder().decode_responses:
            await client.aclose()
            raise ValueError(
                "RedisCheckpointStore needs a client made with decode_responses=False (payloads are "
                "bytes); the client_factory returned one with decode_responses=True"
            )
        scripts: dict[str, AsyncScript | FunctionCall] = {
            name: client.register_script(text) if self.library is None else FunctionCall(client, self.library, name)
            for name, text in self._scripts.items()
        }
        bound = Bound(loop, client, scripts)
        bound.closer = self._close_at_shutdown(bound)
        self.bound[id(loop)] = bound
        await anext(bound.closer)
        return bound

    async def _close_at_shutdown(self, bound: Bound) -> AsyncGenerator[None, None]:
        """Close `bound`'s client when its loop shuts down its async generators."""
        try:
            yield
        finally:
            if self.bound.get(id(bound.loop)) is bound:
                del self.bound[id(bound.loop)]
            await bound.client.aclose()


def address(client: Client) -> str:
    """Say where `client` connects, for error messages."""
    service = getattr(getattr(client, "connection_pool", None), "service_name", None)
    if service is not None:  # a primary found through Sentinel (`redis.urls`)
        return f"the primary Sentinel calls {service!r}"
    kwargs = client.get_connection_kwargs()
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}"
    if kwargs.get("host"):
        return f"{kwargs['host']}:{kwargs.get('port', 6379)}"
    nodes = getattr(getattr(client, "nodes_manager", None), "startup_nodes", None)
    return ", ".join(map(str, nodes or ())) or "an unknown address"
