"""Leases on runs, the recover_all lock and decision markers, in Redis.

- A lease (``P:lease:{run}``) says a live worker is working on the run. It is taken with
  ``SET NX PX`` and a random token, renewed while the superstep runs, and released (only
  by its holder, checked in Lua) when the superstep is saved. A dead worker's lease
  lapses after ``lease_s``; then recovery may enqueue the run.
- The recover_all lock (``P:lock:recover_all``) lets one of many concurrent recover_alls
  do the work; it expires on its own if its holder dies.
- A decision marker (``P:decision:{run}``) says the run waits for a person to decide about
  a call in doubt, so recover_all does not re-enqueue it every tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis

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


@dataclass
class Hold:
    """A run's lease, held for the length of a block (`Leases.hold`)."""

    clear_decision: bool = False
    """Forget the run's decision marker when the lease is released (the run moved on)."""


class Leases:
    """Leases and locks for one deployment (one key prefix)."""

    def __init__(
        self, client_factory: Callable[[], Redis], *, prefix: str = "agentflow", lease_s: float = 30.0
    ) -> None:
        if lease_s <= 0:
            raise ValueError("lease_s must be positive")
        self._factory = client_factory
        self._clients: dict[asyncio.AbstractEventLoop, Redis] = {}
        self.prefix = prefix
        self.lease_s = lease_s

    def _client(self) -> Redis:
        loop = asyncio.get_running_loop()
        for old in [lp for lp in self._clients if lp.is_closed()]:
            del self._clients[old]
        if loop not in self._clients:
            self._clients[loop] = self._factory()
        return self._clients[loop]

    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}:{kind}:{{{name}}}"

    async def take(self, key: str, ttl_s: float) -> str | None:
        """Take `key` for `ttl_s` seconds if nobody holds it; return the token, or None."""
        token = secrets.token_hex(16)
        ok = await self._client().set(key, token, nx=True, px=max(1, int(ttl_s * 1000)))
        return token if ok else None

    async def give_back(self, key: str, token: str) -> None:
        """Release `key` if `token` still holds it."""
        await self._client().eval(_RELEASE, 1, key, token)

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
        stop = asyncio.Event()
        renewer = asyncio.get_running_loop().create_task(self._renew(key, token, stop))
        try:
            yield held
        finally:
            # Stopped between renewals, never cancelled inside one: a command cut off half-way
            # would leave its connection to be torn down under the release that follows.
            stop.set()
            await renewer
            marker = self._key("decision", run_id)
            await self._client().eval(_RELEASE_RUN, 2, key, marker, token, "1" if held.clear_decision else "0")

    async def _renew(self, key: str, token: str, stop: asyncio.Event) -> None:
        while True:
            try:
                await asyncio.wait_for(stop.wait(), self.lease_s / 3)
                return
            except TimeoutError:
                pass
            try:
                await self._client().eval(_RENEW, 1, key, token, int(self.lease_s * 1000))
            except redis_errors.RedisError as exc:
                # The superstep goes on: if the lease lapses meanwhile, the step's compare-and-set
                # and the record numbering still keep a second worker from acting twice.
                _log.warning("could not renew lease %s: %s", key, exc)

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
                found: list[Any] = await pipe.execute()
            n = len(chunk)
            busy.update(r for i, r in enumerate(chunk) if found[i] or found[n + i])
        return busy

    async def mark_decision(self, run_id: str, calls: Sequence[Sequence[str]]) -> None:
        """Note that the run waits for a decision (recover_all leaves it alone meanwhile)."""
        text = "; ".join(f"{tool}: {why}" for tool, why in calls)
        await self._client().set(self._key("decision", run_id), text, ex=MARKER_TTL_S)

    async def clear_decision(self, run_id: str) -> None:
        """Forget the decision marker (the operator decided, or the run moved on)."""
        await self._client().delete(self._key("decision", run_id))

    async def allow_rerun(self, run_id: str, step: int) -> None:
        """Record an operator's decision to rerun the calls in doubt of the run at `step`."""
        client = self._client()
        async with client.pipeline(transaction=True) as pipe:
            pipe.set(self._key("rerun", run_id), str(step), ex=MARKER_TTL_S)
            pipe.delete(self._key("decision", run_id))
            await pipe.execute()

    async def take_rerun(self, run_id: str, step: int) -> bool:
        """Spend a recorded decision to rerun at `step` (a message alone grants nothing)."""
        value = await self._client().getdel(self._key("rerun", run_id))
        return value is not None and int(value) == step

    async def decision(self, run_id: str) -> str | None:
        """What the run waits for a decision about, or None."""
        value = await self._client().get(self._key("decision", run_id))
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
        client = self._clients.pop(loop, None)
        if client is not None:
            await client.aclose()
