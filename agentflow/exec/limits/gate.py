"""The gate every limited call passes: take a slot of each of its limits, run, give them back.

Two ways through it, one sequence of taking, waiting, renewing and giving back:

- `Gate.holding(limits, args, ctx, who)`: take the slots and hold them (renewed) until the
  block ends. The call log takes a call's first slots so, *before* it logs the call
  ``started``: a call waiting for a slot has no ``started`` record, so a worker killed
  while it waits leaves nothing in doubt. It hands the `Slots` to the executor (``held``),
  whose first attempt runs on them.
- `Gate.run(limits, args, ctx, who, work, held=None)`: run `work` holding slots (``held``
  for the first try, if given, else taken now), give them back after it, and after a 429
  take fresh ones for the next try. Slots held since before the call was logged have their
  starts moved to the moment the work begins (`LimitBackend.start`) when the write of
  ``started`` took more than half a limit's `margin_s`: that lateness then does not eat
  the margin.
  The executor runs each attempt of a call through it, and the tool loop each model call.

The sequence:
1. Work out each limit's tenant key; take the slots in one fixed order (limit name, then
   key), so two calls needing the same two limits never hold one each while waiting for
   the other. A slot already taken is kept while the next one is waited for.
2. A refused take is waited out here, with ``asyncio.sleep``: the run's lease is renewed
   by its timer meanwhile (`run.lease`), so a waiting run is never taken for a dead one.
   The wait is reported when it begins and when its reason changes (``call.waiting``),
   and its end too (``call.admitted``).
3. While slots are held, concurrency slots are renewed every third of their `hold_s`.
4. The slots are given back once, however the work ended (a wait that is cancelled gives
   back what it took). If the work raised `RateLimited`, the limit it names (else every
   limit of the call) is closed for its ``retry_after_s`` in the backend, so every worker
   sharing it waits (each with its own jitter), and the work is tried again on fresh
   slots, up to the limit's `retries_429`.
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

from agentflow._errors import RateLimited
from agentflow._events import Events
from agentflow._identity import RunContext
from agentflow.exec.limits._backends import BackendRef
from agentflow.exec.limits._protocol import LimitBackend, Refusal
from agentflow.exec.limits._spec import Limit

log = logging.getLogger("agentflow.limits")

T = TypeVar("T")

#: A limit and the tenant key of one call under it.
Keyed = tuple[Limit, str]


class Slots:
    """The slots one call holds: taken in order, renewed while held, given back once (`release`)."""

    def __init__(self, backend: LimitBackend | None, keyed: Sequence[Keyed]) -> None:
        self.keyed: tuple[Keyed, ...] = tuple(keyed)
        """Every limit of the call with its tenant key, in the order they are taken."""
        self.waited = False
        """Whether taking them meant waiting (the call was reported ``call.waiting``)."""
        self._backend = backend
        self._token = secrets.token_hex(12) if self.keyed else ""  # a call under no limit takes nothing
        self._taken: list[Keyed] = []
        self._renewer: _Renewer | None = None
        self._released = False
        self._granted_at = 0.0

    async def _take(self, gate: Gate, who: Mapping[str, Any]) -> None:
        """Take every slot, waiting as long as it takes; on any failure give back what was taken."""
        if self._backend is None:
            return
        began = time.monotonic()
        try:
            for lim, key in self.keyed:
                self.waited = await gate.take_one(self._backend, lim, key, self._token, who) or self.waited
                self._taken.append((lim, key))
        except BaseException:
            await self.release()
            raise
        self._granted_at = time.monotonic()
        if self.waited:
            gate.emit("call.admitted", who, waited_s=round(self._granted_at - began, 3))
        renewed = [(lim, key) for lim, key in self._taken if lim.concurrency is not None]
        if renewed:
            self._renewer = _Renewer(self._backend, renewed, self._token)

    async def start(self) -> None:
        """Say that the call starts now: a rate limit counts its start from here, not from its grant.

        Slots taken before the call was logged (`Gate.holding`) were granted a store write
        earlier than the call starts; moving the start keeps the window true to what reaches
        the provider. A limit whose `margin_s` covers twice the time since the grant keeps
        its start as granted (the margin is there for such lateness; no round trip is spent).
        A failure is logged, not raised: the start then counts from its grant.
        """
        if self._backend is None:
            return
        late = time.monotonic() - self._granted_at
        for lim, key in self._taken:
            if lim.rate is None or 2 * late <= lim.margin_s:
                continue
            try:
                await self._backend.start(lim, key, self._token)
            except Exception as exc:  # the call is logged started: it runs, its start counted from its grant
                log.warning("could not move the start of a call under limit %s to now: %s", lim.name, exc)

    async def release(self) -> None:
        """Stop renewing and give the concurrency slots back (their starts still count); once only."""
        if self._released or self._backend is None:
            return
        self._released = True
        if self._renewer is not None:
            await self._renewer.stop()
        for lim, key in self._taken:
            if lim.concurrency is not None:
                await _give_back(self._backend, lim, key, self._token)


class Gate:
    """Runs work under limits, on the backend a registry names, reporting to an event hub."""

    def __init__(self, backend: BackendRef, events: Callable[[], Events]) -> None:
        """A gate on `backend`, reporting to the hub `events` returns (looked up at each event)."""
        self.backend = backend
        self._events = events

    async def take(
        self, limits: Sequence[Limit], args: Mapping[str, Any], ctx: RunContext | None, who: Mapping[str, Any]
    ) -> Slots:
        """Take a slot of each of `limits` for one call, waiting as long as it takes (see the module docstring).

        Args:
            limits: the call's limits (none: nothing is taken and no backend is made).
            args: the call's arguments, for the limits' tenant keys.
            ctx: the run's identity, for the tenant keys.
            who: what the events say about the call (``run_id``, ``call_id``, ``tool`` or ``model``).

        Raises:
            LimitsUnavailable: the backend cannot be reached.
            TypeError: a tenant key function returned something other than a str.
        """
        if not limits:
            return Slots(None, ())
        keyed = sorted({(lim.name, lim.key_of(args, ctx)): lim for lim in limits}.items())
        slots = Slots(self.backend.get(), [(lim, key) for (_, key), lim in keyed])
        await slots._take(self, who)
        return slots

    @contextlib.asynccontextmanager
    async def holding(
        self, limits: Sequence[Limit], args: Mapping[str, Any], ctx: RunContext | None, who: Mapping[str, Any]
    ) -> AsyncIterator[Slots]:
        """Hold a slot of each of `limits` (`take`) for the block; give them back after it (if not given back yet)."""
        slots = await self.take(limits, args, ctx, who)
        try:
            yield slots
        finally:
            await slots.release()

    async def run(
        self,
        limits: Sequence[Limit],
        args: Mapping[str, Any],
        ctx: RunContext | None,
        who: Mapping[str, Any],
        work: Callable[[], Awaitable[T]],
        held: Slots | None = None,
    ) -> T:
        """Run `work` holding a slot of each of `limits` (see the module docstring).

        Args:
            limits: the call's limits (none: `work` just runs).
            args: the call's arguments, for the limits' tenant keys.
            ctx: the run's identity, for the tenant keys.
            who: what the events say about the call (``run_id``, ``call_id``, ``tool`` or ``model``).
            work: the call itself; called again after a back-off.
            held: slots already taken for this call (`take`): the first try runs on them (and
                gives them back after it), a try after a back-off takes fresh ones.

        Raises:
            RateLimited: the work raised it more often than the limit's `retries_429`.
            LimitsUnavailable: the backend cannot be reached.
        """
        slots = held if held is not None else await self.take(limits, args, ctx, who)
        if not slots.keyed:
            return await work()
        if held is not None:  # taken before the call was logged: its start is now
            await slots.start()
        backoffs = 0
        while True:
            try:
                return await work()
            except RateLimited as exc:
                named = [(lim, key) for lim, key in slots.keyed if exc.limit in (None, lim.name)] or list(slots.keyed)
                await self._close(named, exc, who)  # every sharer backs off, whether this call tries again or not
                if backoffs >= max(lim.retries_429 for lim, _ in named):
                    raise
                backoffs += 1
            finally:
                await slots.release()
            retaken = Slots(self.backend.get(), slots.keyed)
            await retaken._take(self, who)
            slots = retaken

    async def _close(self, named: Sequence[Keyed], exc: RateLimited, who: Mapping[str, Any]) -> None:
        backend = self.backend.get()
        for lim, key in named:
            closed_s = await backend.close(lim, key, exc.retry_after_s)
            self.emit("limit.closed", who, limit=lim.name, retry_after_s=exc.retry_after_s, closed_s=closed_s)

    async def take_one(self, backend: LimitBackend, lim: Limit, key: str, token: str, who: Mapping[str, Any]) -> bool:
        """Take a slot of `lim`, waiting as long as it takes; whether it had to wait."""
        said: str | None = None
        while True:
            wait = await backend.take(lim, key, token)
            if wait is None:
                return said is not None
            if wait.why != said:
                self.emit("call.waiting", who, limit=lim.name, why=wait.why, wait_s=round(wait.seconds, 3))
                said = wait.why
            await asyncio.sleep(pause(lim, wait))

    def emit(self, name: str, who: Mapping[str, Any], **data: Any) -> None:
        """Report `name` about the call `who` names to the hub."""
        fields = {k: v for k, v in who.items() if k != "run_id"}
        self._events().emit(name, who.get("run_id"), **fields, **data)


def pause(lim: Limit, wait: Refusal) -> float:
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
