"""The gate every limited call passes: take a slot of each of its limits, run, give them back.

`Gate.run(limits, args, ctx, who, work)` is the one sequence, used by the executor for each
attempt of a tool call and by the tool loop for each model call:

1. Work out each limit's tenant key; take the slots in one fixed order (limit name, then
   key), so two calls needing the same two limits never hold one each while waiting for
   the other. A slot already taken is kept while the next one is waited for.
2. A refused take is waited out here, with ``asyncio.sleep``: the run's lease is renewed
   by its timer meanwhile (`_run_lease`), so a waiting run is never taken for a dead one.
   The first wait of each kind is reported (``call.waiting``), the end of the wait too
   (``call.admitted``).
3. While the work runs, concurrency slots are renewed every third of their `hold_s`.
4. The slots are given back however the work ended. If it raised `RateLimited`, the limit
   it names (else every limit of the call) is closed for its ``retry_after_s`` in the
   backend, so every worker sharing it waits (each with its own jitter), and the work is
   tried again, up to the limit's `retries_429`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from agentflow._events import Events
from agentflow._identity import RunContext
from agentflow.exec.limits._backends import BackendRef
from agentflow.exec.limits._protocol import LimitBackend, Wait
from agentflow.exec.limits._spec import Limit, RateLimited

log = logging.getLogger("agentflow.limits")

T = TypeVar("T")

#: A limit and the tenant key of one call under it.
Keyed = tuple[Limit, str]


class Gate:
    """Runs work under limits, on the backend a registry names, reporting to an event hub."""

    def __init__(self, backend: BackendRef, events: Callable[[], Events]) -> None:
        """A gate on `backend`, reporting to the hub `events` returns (looked up at each event)."""
        self.backend = backend
        self._events = events

    async def run(
        self,
        limits: Sequence[Limit],
        args: Mapping[str, Any],
        ctx: RunContext | None,
        who: Mapping[str, Any],
        work: Callable[[], Awaitable[T]],
    ) -> T:
        """Run `work` holding a slot of each of `limits` (see the module docstring).

        Args:
            limits: the call's limits (none: `work` just runs).
            args: the call's arguments, for the limits' tenant keys.
            ctx: the run's identity, for the tenant keys.
            who: what the events say about the call (``run_id``, ``call_id``, ``tool`` or ``model``).
            work: the call itself; called again after a back-off.

        Raises:
            RateLimited: the work raised it more often than the limit's `retries_429`.
            LimitsUnavailable: the backend cannot be reached.
        """
        if not limits:
            return await work()
        keyed = sorted({(lim.name, lim.key_of(args, ctx)): lim for lim in limits}.items())
        held: list[Keyed] = [(lim, key) for (_, key), lim in keyed]
        backoffs = 0
        while True:
            async with self._holding(held, who):
                try:
                    return await work()
                except RateLimited as exc:
                    named = [(lim, key) for lim, key in held if exc.limit in (None, lim.name)] or held
                    await self._close(named, exc, who)  # every sharer backs off, whether this call tries again or not
                    if backoffs >= max(lim.retries_429 for lim, _ in named):
                        raise
                    backoffs += 1

    async def _close(self, named: Sequence[Keyed], exc: RateLimited, who: Mapping[str, Any]) -> None:
        backend = self.backend.get()
        for lim, key in named:
            closed_s = await backend.close(lim, key, exc.retry_after_s)
            self._emit("limit.closed", who, limit=lim.name, retry_after_s=exc.retry_after_s, closed_s=closed_s)

    @contextlib.asynccontextmanager
    async def _holding(self, held: Sequence[Keyed], who: Mapping[str, Any]) -> AsyncIterator[None]:
        backend = self.backend.get()
        token = secrets.token_hex(12)
        taken: list[Keyed] = []
        renewer: _Renewer | None = None
        began = time.monotonic()
        try:
            waited = False
            for lim, key in held:
                waited = await self._take(backend, lim, key, token, who) or waited
                taken.append((lim, key))
            if waited:
                self._emit("call.admitted", who, waited_s=round(time.monotonic() - began, 3))
            slots = [(lim, key) for lim, key in taken if lim.concurrency is not None]
            if slots:
                renewer = _Renewer(backend, slots, token)
            yield
        finally:
            if renewer is not None:
                await renewer.stop()
            for lim, key in taken:
                if lim.concurrency is not None:
                    await _give_back(backend, lim, key, token)

    async def _take(self, backend: LimitBackend, lim: Limit, key: str, token: str, who: Mapping[str, Any]) -> bool:
        """Take a slot of `lim`, waiting as long as it takes; whether it had to wait."""
        said: str | None = None
        while True:
            wait = await backend.take(lim, key, token)
            if wait is None:
                return said is not None
            if wait.why != said:
                self._emit("call.waiting", who, limit=lim.name, why=wait.why, wait_s=round(wait.seconds, 3))
                said = wait.why
            await asyncio.sleep(pause(lim, wait))

    def _emit(self, name: str, who: Mapping[str, Any], **data: Any) -> None:
        fields = {k: v for k, v in who.items() if k != "run_id"}
        self._events().emit(name, who.get("run_id"), **fields, **data)


def pause(lim: Limit, wait: Wait) -> float:
    """How long to sleep before asking again.

    A back-off is waited out with up to `jitter` more (the waiters spread out); a full
    window until it has room (plus a few ms, so racing workers do not all ask at once);
    a full set of slots is looked at again every `poll_s` or so.
    """
    if wait.why == "closed":
        return wait.seconds * (1 + random.uniform(0, lim.jitter))
    if wait.why == "rate":
        return wait.seconds + random.uniform(0, 0.004)
    return min(wait.seconds, lim.poll_s * random.uniform(0.5, 1.5))


async def _give_back(backend: LimitBackend, lim: Limit, key: str, token: str) -> None:
    try:
        await backend.release(lim, key, token)
    except Exception as exc:  # the call's outcome matters more; the slot lapses on its own
        log.warning("could not give back a slot of limit %s (it lapses in %s s): %s", lim.name, lim.hold_s, exc)


class _Renewer:
    """Renews held concurrency slots every third of the shortest `hold_s` while the call runs."""

    def __init__(self, backend: LimitBackend, slots: Sequence[Keyed], token: str) -> None:
        self._backend, self._slots, self._token = backend, list(slots), token
        self._every = min(lim.hold_s for lim, _ in slots) / 3
        self._stopping = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._every)
                return
            for lim, key in self._slots:
                try:
                    if not await self._backend.renew(lim, key, self._token):
                        log.warning("a slot of limit %s lapsed while its call ran (hold_s=%s)", lim.name, lim.hold_s)
                except Exception as exc:  # the call goes on; its slot may lapse
                    log.warning("could not renew a slot of limit %s: %s", lim.name, exc)

    async def stop(self) -> None:
        """Renew no more; wait for a renewal under way rather than cut it off."""
        self._stopping.set()
        await self._task
