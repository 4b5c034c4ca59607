"""Leases on runs, the recover_all lock and decision markers, in Redis.

- A lease (``P:lease:{run}``) says a live worker is working on the run. It is taken with
  ``SET NX PX`` and a random token, renewed while the superstep runs, and released (only
  by its holder, checked in Lua) when the superstep is saved. A dead worker's lease
  lapses after ``lease_s``; then recovery may enqueue the run.
- The recover_all lock (``P:lock:recover_all``) lets one of many concurrent recover_alls
  do the work; it expires on its own if its holder dies.
- A decision marker (``P:decision:{run}``) says the run waits for a person to decide about
  a call in doubt, so recover_all does not re-enqueue it every tick.

Every command has a deadline of its own (``op_timeout_s``, `asyncio.timeout`), so the
client may be made with ``socket_timeout=None``: redis-py then skips the per-command
``asyncio.wait_for`` that, on Python 3.11, costs a task and extra loop turns for each
command. A renewal is a timer, not a task: a superstep shorter than a third of the lease
starts none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.commands.core import AsyncScript

_log = logging.getLogger(__name__)

#: How long a decision marker lives (a person may take days; it must not outlive the run for ever).
MARKER_TTL_S = 30 * 24 * 3600

_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
# Releases a run's lease (if still held) and, when ARGV[2] is 1, forgets its decision
# marker in the same round trip (both keys carry the run's hash tag: one slot).
_RELEASE_RUN = """
local released = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then released = redis.call('DEL', KEYS[1]) end
if ARGV[2] == '1' then redis.call('DEL', KEYS[2]) end
return released
"""
_RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"

T = TypeVar("T")


@dataclass
class Hold:
    """A run's lease, held for the length of a block (`Leases.hold`)."""

    clear_decision: bool = False
    """Forget the run's decision marker when the lease is released (the run moved on)."""


@dataclass(eq=False)
class _Bound:
    """One event loop's client, with the scripts registered on it (sent by SHA after the first time)."""

    client: Redis
    release: AsyncScript
    release_run: AsyncScript
    renew: AsyncScript


class Leases:
    """Leases and locks for one deployment (one key prefix)."""

    def __init__(
        self,
        client_factory: Callable[[], Redis],
        *,
        prefix: str = "agentflow",
        lease_s: float = 30.0,
        op_timeout_s: float | None = 10.0,
    ) -> None:
        """Leases under `prefix`.

        Args:
            client_factory: makes a ``redis.asyncio.Redis`` (called once per event loop).
            prefix: first part of every key.
            lease_s: a lease lapses this long after its holder stopped renewing it.
            op_timeout_s: deadline of each command (None: the client's own timeouts only).

        Raises:
            ValueError: `lease_s` or `op_timeout_s` is not positive.
        """
        if lease_s <= 0:
            raise ValueError("lease_s must be positive")
        if op_timeout_s is not None and op_timeout_s <= 0:
            raise ValueError("op_timeout_s must be positive, or None for no deadline")
        self._factory = client_factory
        self._bound: dict[asyncio.AbstractEventLoop, _Bound] = {}
        self.prefix = prefix
        self.lease_s = lease_s
        self.op_timeout_s = op_timeout_s

    def _bind(self) -> _Bound:
        loop = asyncio.get_running_loop()
        for old in [lp for lp in self._bound if lp.is_closed()]:
            del self._bound[old]
        if loop not in self._bound:
            client = self._factory()
            scripts = (client.register_script(text) for text in (_RELEASE, _RELEASE_RUN, _RENEW))
            self._bound[loop] = _Bound(client, *scripts)
        return self._bound[loop]

    def _client(self) -> Redis:
        return self._bind().client

    async def _answer(self, command: Awaitable[T]) -> T:
        """Await one command within `op_timeout_s` (a lapsed deadline is redis-py's TimeoutError)."""
        try:
            async with asyncio.timeout(self.op_timeout_s):
                return await command
        except TimeoutError:
            raise redis_errors.TimeoutError(f"Redis did not answer within {self.op_timeout_s} s") from None

    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}:{kind}:{{{name}}}"

    async def take(self, key: str, ttl_s: float) -> str | None:
        """Take `key` for `ttl_s` seconds if nobody holds it; return the token, or None."""
        token = secrets.token_hex(16)
        ok = await self._answer(self._client().set(key, token, nx=True, px=max(1, int(ttl_s * 1000))))
        return token if ok else None

    async def give_back(self, key: str, token: str) -> None:
        """Release `key` if `token` still holds it."""
        await self._answer(self._bind().release(keys=[key], args=[token]))

    @contextlib.asynccontextmanager
    async def hold(self, run_id: str) -> AsyncIterator[Hold | None]:
        """Hold the run's lease while the block runs, renewing it; yields None if it is taken.

        The block may set `Hold.clear_decision`: the run's decision marker is then deleted
        with the release, in the same round trip.
        """
        key = self._key("lease", run_id)
        token = await self.take(key, self.lease_s)
        if token is None:
            yield None
            return
        held = Hold()
        renewer = _Renewer(self, key, token)
        try:
            yield held
        finally:
            await renewer.stop()
            marker = self._key("decision", run_id)
            flag = "1" if held.clear_decision else "0"
            await self._answer(self._bind().release_run(keys=[key, marker], args=[token, flag]))

    async def renew(self, key: str, token: str) -> None:
        """Push the lease `key` back to `lease_s` from now, if `token` still holds it."""
        await self._answer(self._bind().renew(keys=[key], args=[token, int(self.lease_s * 1000)]))

    async def leased(self, run_ids: Sequence[str]) -> set[str]:
        """Which of `run_ids` have a live lease or wait for a decision."""
        if not run_ids:
            return set()
        client = self._client()
        busy: set[str] = set()
        for start in range(0, len(run_ids), 1000):
            chunk = list(run_ids[start : start + 1000])
            keys = [self._key("lease", r) for r in chunk] + [self._key("decision", r) for r in chunk]
            async with client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.exists(key)
                found: list[Any] = await self._answer(pipe.execute())
            n = len(chunk)
            busy.update(r for i, r in enumerate(chunk) if found[i] or found[n + i])
        return busy

    async def mark_decision(self, run_id: str, calls: Sequence[Sequence[str]]) -> None:
        """Note that the run waits for a decision (recover_all leaves it alone meanwhile)."""
        text = "; ".join(f"{tool}: {why}" for tool, why in calls)
        await self._answer(self._client().set(self._key("decision", run_id), text, ex=MARKER_TTL_S))

    async def clear_decision(self, run_id: str) -> None:
        """Forget the decision marker (the operator decided, or the run moved on)."""
        await self._answer(self._client().delete(self._key("decision", run_id)))

    async def allow_rerun(self, run_id: str, step: int) -> None:
        """Record an operator's decision to rerun the calls in doubt of the run at `step`."""
        client = self._client()
        async with client.pipeline(transaction=True) as pipe:
            pipe.set(self._key("rerun", run_id), str(step), ex=MARKER_TTL_S)
            pipe.delete(self._key("decision", run_id))
            await self._answer(pipe.execute())

    async def take_rerun(self, run_id: str, step: int) -> bool:
        """Spend a recorded decision to rerun at `step` (a message alone grants nothing)."""
        value = await self._answer(self._client().getdel(self._key("rerun", run_id)))
        return value is not None and int(value) == step

    async def decision(self, run_id: str) -> str | None:
        """What the run waits for a decision about, or None."""
        value = await self._answer(self._client().get(self._key("decision", run_id)))
        return value.decode() if isinstance(value, bytes) else value

    @contextlib.asynccontextmanager
    async def lock(self, name: str, ttl_s: float) -> AsyncIterator[bool]:
        """A lock that expires on its own; yields whether it was acquired."""
        key = self._key("lock", name)
        token = await self.take(key, ttl_s)
        try:
            yield token is not None
        finally:
            if token is not None:
                await self.give_back(key, token)

    async def aclose(self) -> None:
        """Close this loop's client."""
        loop = asyncio.get_running_loop()
        bound = self._bound.pop(loop, None)
        if bound is not None:
            await bound.client.aclose()


class _Renewer:
    """Renews a held lease every third of `lease_s`, from a timer: no task until one is due.

    `stop` waits for a renewal in flight instead of cancelling it: a command cut off
    half-way would leave its connection to be torn down under the release that follows.
    """

    def __init__(self, leases: Leases, key: str, token: str) -> None:
        self._leases, self._key, self._token = leases, key, token
        self._loop = asyncio.get_running_loop()
        self._stopped = False
        self._task: asyncio.Task[None] | None = None
        self._timer = self._loop.call_later(leases.lease_s / 3, self._due)

    def _due(self) -> None:
        self._task = self._loop.create_task(self._renew())

    async def _renew(self) -> None:
        try:
            await self._leases.renew(self._key, self._token)
        except redis_errors.RedisError as exc:
            # The superstep goes on: if the lease lapses meanwhile, the step's compare-and-set
            # and the record numbering still keep a second worker from acting twice.
            _log.warning("could not renew lease %s: %s", self._key, exc)
        if not self._stopped:
            self._timer = self._loop.call_later(self._leases.lease_s / 3, self._due)

    async def stop(self) -> None:
        """Renew no more; wait for a renewal that is under way."""
        self._stopped = True
        self._timer.cancel()
        if self._task is not None:
            await self._task
