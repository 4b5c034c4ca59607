"""Run ownership: the lease a runner holds on a run while it acts on it.

Moving parts:
- `Ownership(owner, lease_s)`: who this runner is (``<name>@<host>:<pid>``) and how long
  its leases last unless renewed. Every runner, worker, CLI and viewer process has one.
  `Ownership.restartable(identity)`: the same for a process that keeps a name across its
  restarts: its leases carry the start of this life (``<identity>#<start>``), and a later
  life takes over an earlier one's leases at once instead of waiting them out.
- `holding(store, run_id, ownership)`: takes the run's lease in the store (`RunHeld` when
  a live holder has it), renews it from a timer every third of `lease_s` while the block
  runs, and gives it back when the block ends, whether it returned or raised.
- `holding_reading_head(store, run_id, ownership, marker)`: the same, and the run's head
  (its latest checkpoint and records per segment) read with the take: in the same round
  trip where the store can (`HeadReading`, the Redis store's lease script),
  else in flight beside it. Where the store reads with the take, a marker about the run
  comes in the same round trip too (the run's cancel request: `run.cancel.CancelWatch`
  takes it as its first look). What every superstep of a worker starts with.
- `Tenure`: what a held block holds: the lease, and whether a write of the block gave it
  up. `holding` and `holding_reading_head` yield one. On a store that moves leases with
  its writes (`LeaseMoving`), the protocol arms it for a drive (`arm`): the save that
  ends the drive (its last step, or one that ends, pauses or fails the run) gives the
  lease up in the same atomic write (`closing`), and the block then releases nothing.
  A superstep so makes one round trip fewer; the lease is free the moment its last step
  is stored, as it was a round trip later before. Where the block also records the run's
  events (`agentflow.exec.run.events.recording`), its recorder is the tenure's `Rider`:
  the events not yet appended, and the ``checkpoint.saved`` of that last save, go into the
  same write (`LeaseMoving.save_after_calls_moving`'s ``events``), one round trip fewer again.
- `held_by(store, run_ids)`: the live leases of some runs (for listings and recover_all).

Invariants:
- Nothing acts on a run (start, recover, resume, advance, decide) without holding its
  lease; a live lease is never broken, only waited out, with two exceptions. A later life
  of its holder's identity takes it over: that is a claim like any other, so if the earlier
  life still runs after all, the segment fencing refuses its next write. And a start takes
  it from a holder that stored nothing of the run (`take_unborn`): nothing of it can have
  run, and the compare-and-set of step 0 lets one of two starters through.
- The lease is advisory ownership, not the last line of defence: a holder that froze past
  its lease (SIGSTOP, a long pause) is taken over, and when it wakes the segment fencing
  refuses its next ``started`` record and the compare-and-set its next save. A call it
  had already begun cannot be stopped; idempotency keys cover that.
- A head read beside the take (not with it) may be a step behind the lease: the run's
  next write is then refused (its record position or its step is taken), never applied
  twice. A head read with the take is the run as it stood when the lease was granted.
- A renewal that finds the lease lost is logged at WARNING (and emitted as ``lease.lost``
  to the ownership's event hub); the block goes on and is fenced at its next write, as above,
  and runs no tool unless `Tenure.confirm` takes the lease back (below).
- A tool runs only while its block surely holds the run (`Tenure.confirm`, awaited by the
  call log right before each attempt): by this process's monotonic clock, less than `SURE`
  of `lease_s` since the last take or renewal that succeeded was sent (the store starts the
  lease's term after that); else after one renewal that succeeds in that time; else, if the
  lease lapsed and nobody else took it, once it is taken back with its token and the run's
  head shows no claim since the block's segment. So a holder that stalled past its lease
  between a call's ``started`` and its tool, and was taken over, does not run the tool, and
  one that merely stalled (nobody wanted the run meanwhile) goes on. This assumes that the
  clocks of the store and of the other workers run no more than a tenth of a lease ahead
  of this one's over a lease.
- A save that gives the lease up is written only while the lease is free, lapsed or still
  the block's own (`LeaseMove`'s rule, in the store's write): a holder whose lease was
  taken over is refused (`RunHeld`) and writes nothing. Nothing the block writes after
  the save that gave the lease up could need it: that save is the drive's last write
  (`Tenure.closing` gives it up once), and a write after it would be fenced anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeAlias, cast

from agentflow._errors import CheckpointNotFound, RunHeld
from agentflow._events import Event, Events
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.protocol import HeadReading, has_part
from agentflow.exec.checkpoints.records import Lease, LeaseMove, Marker, SealedCheckpoint, SealedEvent

log = logging.getLogger("agentflow.lease")

#: A run's head: its latest checkpoint and how many call records each segment holds.
Head: TypeAlias = tuple[SealedCheckpoint, Mapping[int, int]]


class _Unread:
    """What `take_reading_head` says of a marker it could not read with the take (the store has no fused take)."""

    def __repr__(self) -> str:
        return "UNREAD"


#: A marker the take did not read (see `Seen`).
UNREAD: Final = _Unread()
#: A marker as the take read it: the marker (None: none live) or `UNREAD`.
Seen: TypeAlias = Marker | None | _Unread
#: A held run's tenure (None: nothing is held), its head, being read, and the marker read with the take.
HeldHead: TypeAlias = tuple["Tenure | None", Awaitable[Head], Seen]

#: How long a lease lasts unless renewed, when nobody says otherwise.
DEFAULT_LEASE_S = 30.0
#: The share of a lease its holder counts on by its own clock (`Tenure.sure_until`); the rest allows
#: for the clocks of the store and of other workers running a little ahead of this process's.
SURE: Final = 0.9


def process_owner(name: str = "runner") -> str:
    """A name for a lease holder in this process: ``<name>@<host>:<pid>``."""
    return f"{name}@{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Ownership:
    """Who a runner is when it holds runs, and for how long each lease lasts."""

    owner: str
    """Names the holder for people: ``<name>@<host>:<pid>``, or ``<identity>#<start>`` (`restartable`)."""
    lease_s: float = DEFAULT_LEASE_S
    """A lease lapses this long after its holder last renewed it."""
    events: Events | None = field(default=None, compare=False, repr=False)
    """Where a lease this holder lost is reported (``lease.lost``); the run protocol sets its own."""
    identity: str | None = None
    """A name that stays the same across restarts of one process (`restartable`); None: none."""
    life: int = 0
    """When this life of `identity` began (ms since the epoch): a later life takes over an earlier one's leases."""

    def __post_init__(self) -> None:
        if not self.owner:
            raise ValueError("a lease owner needs a name")
        if not self.lease_s > 0:
            raise ValueError(f"lease_s must be positive, not {self.lease_s!r}")

    @classmethod
    def of(cls, lease_s: float = DEFAULT_LEASE_S, name: str = "runner") -> Ownership:
        """This process's ownership under `name`."""
        return cls(process_owner(name), lease_s)

    @classmethod
    def restartable(cls, identity: str, lease_s: float = DEFAULT_LEASE_S) -> Ownership:
        """The ownership of a process that keeps `identity` across its restarts (one live process per identity).

        Its leases are held as ``<identity>#<start>``: a later life of the same identity
        takes over the leases of an earlier one at once (`earlier_life`), instead of
        waiting them out. That is safe even if the earlier life still runs: a take-over
        is a claim, and the segment fencing refuses the old life's next write.

        Raises:
            ValueError: `identity` is empty or holds ``#``.
        """
        if not identity or "#" in identity:
            raise ValueError(f"an owner identity is a non-empty name without '#', not {identity!r}")
        life = time.time_ns() // 1_000_000
        return cls(f"{identity}#{life}", lease_s, identity=identity, life=life)

    @classmethod
    def chosen(cls, owner: str | None, identity: str | None, lease_s: float = DEFAULT_LEASE_S) -> Ownership:
        """A runner's ownership from its options: `owner` as given, `identity` (`restartable`), or this process's.

        Raises:
            ValueError: both `owner` and `identity` are given, or either is invalid.
        """
        if owner is not None and identity is not None:
            raise ValueError("give a runner an owner or an identity, not both (an identity names its leases)")
        if identity is not None:
            return cls.restartable(identity, lease_s)
        return cls(owner, lease_s) if owner is not None else cls.of(lease_s)

    def earlier_life(self, owner: str) -> bool:
        """Whether a lease held by `owner` is this identity's, from an earlier life of the process."""
        if self.identity is None:
            return False
        identity, _, life = owner.rpartition("#")
        return identity == self.identity and life.isdigit() and int(life) < self.life


class Rider(Protocol):
    """What carries a held run's events into the save that gives its lease up (the run's event recorder).

    `ride` and `rode` come in pairs around that one write: nothing the rider holds is
    appended on its own in between.
    """

    async def ride(self, *last: Event) -> SealedEvent:
        """The events not yet appended, and `last` after them, sealed as one entry for the save to carry."""
        ...

    def rode(self, stored: bool | None) -> None:
        """The save's outcome: stored (True), refused with nothing written (False), or unknown (None)."""
        ...

    def follow(self, anchor: Any) -> None:
        """The run's checkpoint names `anchor` as its event chain's head (`agentflow.exec.event_chain`)."""
        ...

    def anchor(self) -> dict[str, Any]:
        """The chain's head a save signs into its checkpoint now (the entry it carries, while it rides)."""
        ...


@dataclass(eq=False)
class Tenure:
    """A held block's lease, and whether a write of the block gave it up (see the module docstring)."""

    lease: Lease
    """The lease as taken."""
    ttl_s: float
    """How long it lasts when renewed."""
    given_up: bool = False
    """A save gave the lease up: the block releases nothing, and nothing renews it."""
    rider: Rider | None = field(default=None, repr=False)
    """Whose events the save that gives the lease up carries (None: that save carries none)."""
    sure_until: float = field(default=-math.inf, repr=False)
    """Until when (`time.monotonic`) the lease is surely still the block's: `SURE` of `ttl_s` after the
    take or renewal that last succeeded was sent (the store counts the lease from a moment after that)."""
    _renewer: _Renewer | None = field(default=None, repr=False)
    _armed: bool = field(default=False, repr=False)
    _saves_left: int | None = field(default=None, repr=False)

    def held_from(self, sent: float) -> None:
        """A take or renewal sent at `sent` (`time.monotonic`) succeeded: the lease is sure until `SURE` of it later."""
        self.sure_until = max(self.sure_until, sent + self.ttl_s * SURE)

    async def confirm(self, unclaimed: Callable[[], Awaitable[bool]]) -> bool:
        """Whether the lease is surely still the block's: by this process's clock, else by the store.

        What a tool's call awaits right before the tool runs (`calls.log`): a worker stalled
        past its lease after logging ``started`` (frozen, paused, starved) may have been taken
        over, and its tool must then not run. While the lease is sure (`sure_until`) nothing
        goes to the store. Else one renewal confirms it. A lease that lapsed is taken back
        with its token if nobody else holds it, and confirmed only if `unclaimed` then says
        that nobody claimed the run meanwhile (a claim needs the lease, so none can come
        after the take). False when a save gave the lease up, when another holder has it,
        when the run was claimed, and when the store cannot be reached.
        """
        renewer = self._renewer
        if self.given_up or renewer is None:
            return False
        if not renewer.lost and (time.monotonic() < self.sure_until or await renewer.renew()):
            return time.monotonic() < self.sure_until
        return await renewer.take_back() and await unclaimed() and time.monotonic() < self.sure_until

    def arm(self, saves: int | None) -> None:
        """Give the lease up with the drive's last save: the `saves`-th, or the first that leaves the run not running.

        `saves` None: only a save that ends, pauses or fails the run is the last.
        """
        self._armed, self._saves_left = not self.given_up, saves

    def closes(self, running: bool) -> bool:
        """Whether the next save gives the lease up (`closing`, asked without counting the save)."""
        if not self._armed:
            return False
        return not running or (self._saves_left is not None and self._saves_left == 1)

    def closing(self, running: bool) -> LeaseMove | None:
        """The lease move a save makes: give up the lease if it is the armed drive's last, else None.

        `running`: the save leaves the run running (a step that ended, not the run).
        """
        if not self._armed:
            return None
        if self._saves_left is not None:
            self._saves_left -= 1
        if running and self._saves_left != 0:
            return None
        self._armed = False
        return LeaseMove(self.lease.token, None, self.lease.owner, self.ttl_s)


class _Renewer:
    """Renews a held lease every third of `lease_s` from a timer: no task until one is due.

    `stop` waits for a renewal in flight rather than cancel it half-way (a command cut off
    could leave the store's connection unusable for the release that follows).
    """

    def __init__(self, store: CheckpointStore, tenure: Tenure, lease_s: float, events: Events | None) -> None:
        self._store, self._tenure, self._lease_s, self._events = store, tenure, lease_s, events
        tenure._renewer = self
        self._lease = tenure.lease
        self._loop = asyncio.get_running_loop()
        self._stopped = False
        self._task: asyncio.Task[None] | None = None
        self._timer = self._loop.call_later(lease_s / 3, self._due)
        self.lost = False

    def _due(self) -> None:
        self._task = self._loop.create_task(self._renew_on_time())

    async def _renew_on_time(self) -> None:
        if self._tenure.given_up:  # a save gave it up: there is nothing to renew
            return
        await self.renew()
        if not self._stopped:
            self._timer = self._loop.call_later(self._lease_s / 3, self._due)

    async def renew(self) -> bool:
        """Renew the lease now; whether it is still held (its tenure's `sure_until` then moved on)."""
        lease = self._lease
        if self._tenure.given_up:
            return False
        sent = time.monotonic()
        try:
            renewed = await self._store.renew_lease(lease.run_id, lease.token, self._lease_s)
        except Exception as exc:  # the work goes on: fencing still guards it if the lease lapses
            log.warning("could not renew the lease of run %s: %s", lease.run_id, exc, extra={"run_id": lease.run_id})
            return False
        if renewed is not None:
            self._tenure.held_from(sent)
            return True
        if not self.lost and not self._tenure.given_up:
            self.lost = True
            log.warning(
                "run %s: %s lost its lease (it lapsed or was taken over); it runs no tool unless it takes the lease "
                "back with nobody having claimed the run, and its next write will be refused if the run was taken over",
                lease.run_id,
                lease.owner,
                extra={"run_id": lease.run_id},
            )
            if self._events is not None:
                self._events.emit("lease.lost", lease.run_id, owner=lease.owner)
        return False

    async def take_back(self) -> bool:
        """Take the lapsed lease again with its token if nobody else holds it; whether the block holds it again."""
        lease = self._lease
        if self._tenure.given_up:
            return False
        sent = time.monotonic()
        try:
            taken = await self._store.take_lease(lease.run_id, lease.owner, lease.token, self._lease_s)
        except Exception as exc:
            log.warning(
                "could not take back the lease of run %s: %s", lease.run_id, exc, extra={"run_id": lease.run_id}
            )
            return False
        if taken.token != lease.token:
            return False
        self.lost = False
        self._tenure.held_from(sent)
        log.info("run %s: %s took its lapsed lease back (nobody held it)", lease.run_id, lease.owner,
                 extra={"run_id": lease.run_id})  # fmt: skip
        return True

    async def stop(self) -> None:
        """Renew no more; wait for a renewal under way."""
        self._stopped = True
        self._timer.cancel()
        if self._task is not None:
            await self._task


async def take(store: CheckpointStore, run_id: str, ownership: Ownership) -> Lease:
    """Take the run's lease for `ownership` (from an earlier life of its identity too: `Ownership.restartable`).

    Raises:
        RunHeld: another holder's lease is live.
    """
    token = secrets.token_hex(16)
    lease = await store.take_lease(run_id, ownership.owner, token, ownership.lease_s)
    if await _took_over(store, lease, token, ownership):
        lease = await store.take_lease(run_id, ownership.owner, token, ownership.lease_s)
    return _taken(run_id, token, lease)


async def _took_over(store: CheckpointStore, lease: Lease, token: str, ownership: Ownership) -> bool:
    """Give up `lease` if it is another token's, held by an earlier life of this identity; whether it was."""
    if lease.token == token or not ownership.earlier_life(lease.owner):
        return False
    log.info(
        "run %s: taking over the lease of %s, an earlier life of this process (%s)",
        lease.run_id,
        lease.owner,
        ownership.owner,
        extra={"run_id": lease.run_id},
    )
    if ownership.events is not None:
        ownership.events.emit("lease.taken_over", lease.run_id, owner=ownership.owner, earlier=lease.owner)
    await store.release_lease(lease.run_id, lease.token)
    return True


def _taken(run_id: str, token: str, lease: Lease) -> Lease:
    if lease.token != token:
        raise RunHeld(run_id, lease.owner, lease.expires_at)
    return lease


async def _ready(head: Head) -> Head:
    return head


async def take_reading_head(
    store: CheckpointStore, run_id: str, ownership: Ownership, marker: str | None = None
) -> tuple[Lease, Awaitable[Head], Seen]:
    """Take the run's lease and read its head: in one round trip where the store can, else beside the take.

    The head comes as an awaitable (a read that raises `CheckpointNotFound` when nothing
    is stored); `holding_reading_head` settles it if it is never awaited. `marker`: a
    marker key about the run to read in the same round trip, where the store can; what
    was found there comes third (`Seen`: `UNREAD` where the store cannot).

    Raises:
        RunHeld: another holder's lease is live.
    """
    token = secrets.token_hex(16)
    if has_part(store, HeadReading):
        fused = cast(HeadReading, store).take_lease_reading_head
        lease, head, seen = await fused(run_id, ownership.owner, token, ownership.lease_s, marker)
        if await _took_over(store, lease, token, ownership):
            lease, head, seen = await fused(run_id, ownership.owner, token, ownership.lease_s, marker)
        lease = _taken(run_id, token, lease)
        ready = _ready(head) if head is not None else store.head(run_id)  # None: nothing stored, it raises
        return lease, ready, (UNREAD if marker is None else seen)
    reading = asyncio.ensure_future(store.head(run_id))
    try:
        lease = await take(store, run_id, ownership)
    except Exception:  # held by another, or the store failed: the read ends before the caller goes on
        await _settle(reading)
        raise
    except BaseException:  # cancelled: the read goes with the caller
        reading.cancel()
        raise
    return lease, reading, UNREAD


async def _settle(head: Awaitable[Any]) -> None:
    """Let a head read nobody awaited end, so that it neither outlives the caller nor has a failure reported as lost.

    A read in flight is waited for, not cancelled: a command cut off half-way can leave the
    store's connection unusable (the SQL stores' asyncpg connections are one such). A read
    not yet started is dropped.
    """
    if isinstance(head, asyncio.Future):
        if not head.done():
            await asyncio.wait([head])  # raises nothing of the read's
        if not head.cancelled():
            head.exception()
    elif asyncio.iscoroutine(head):
        head.close()


async def take_unborn(store: CheckpointStore, run_id: str, ownership: Ownership) -> Lease:
    """Take the lease of a run about to start, from a holder that stored nothing of it too.

    A holder with nothing stored for the run (no checkpoint, no call record) started it and
    died before its step 0, or is about to save it: either way no call of the run can have
    started (a call record needs a run), and of two starters the compare-and-set of step 0
    lets one through. So its lease does not keep a start of the same run id out.

    Raises:
        RunHeld: a live holder has something of the run stored (the run exists).
    """
    try:
        return await take(store, run_id, ownership)
    except RunHeld as held:
        lease = (await store.leases([run_id])).get(run_id)
        if lease is None or await _stored(store, run_id):
            raise
        log.info(
            "run %s: %s holds its lease but stored nothing of it (it died before step 0); starting it anyway",
            run_id,
            held.owner,
            extra={"run_id": run_id},
        )
        await store.release_lease(run_id, lease.token)
        return await take(store, run_id, ownership)


async def _stored(store: CheckpointStore, run_id: str) -> bool:
    try:
        await store.latest(run_id)
    except CheckpointNotFound:
        return bool(await store.calls(run_id))
    return True


@contextlib.asynccontextmanager
async def holding(
    store: CheckpointStore, run_id: str, ownership: Ownership, *, unborn: bool = False
) -> AsyncIterator[Tenure]:
    """Hold the run's lease while the block runs (see the module docstring); the block gets its `Tenure`.

    `unborn`: the block starts the run, so a holder that stored nothing of it does not keep
    it out (`take_unborn`).

    Raises:
        RunHeld: another holder's lease is live (the block does not run).
    """
    sent = time.monotonic()
    lease = await (take_unborn if unborn else take)(store, run_id, ownership)
    async with _held(store, lease, ownership, sent) as tenure:
        yield tenure


@contextlib.asynccontextmanager
async def holding_reading_head(
    store: CheckpointStore, run_id: str, ownership: Ownership, marker: str | None = None
) -> AsyncIterator[tuple[Tenure, Awaitable[Head], Seen]]:
    """`holding`, and the run's head (and `marker`, where the store can) read with the take (`take_reading_head`).

    Raises:
        RunHeld: another holder's lease is live (the block does not run).
    """
    sent = time.monotonic()
    lease, head, seen = await take_reading_head(store, run_id, ownership, marker)
    try:
        async with _held(store, lease, ownership, sent) as tenure:
            yield tenure, head, seen
    finally:
        await _settle(head)  # mostly awaited already by the block


@contextlib.asynccontextmanager
async def _held(store: CheckpointStore, lease: Lease, ownership: Ownership, sent: float) -> AsyncIterator[Tenure]:
    """Renew the `lease` taken at `sent` while the block runs; give it back afterwards, unless a save gave it up."""
    tenure = Tenure(lease, ownership.lease_s)
    tenure.held_from(sent)
    renewer = _Renewer(store, tenure, ownership.lease_s, ownership.events)
    try:
        yield tenure
    finally:
        await renewer.stop()
        if not tenure.given_up:
            await _release(store, lease, ownership.lease_s)


async def _release(store: CheckpointStore, lease: Lease, lease_s: float) -> None:
    """Give the lease back; a failure is logged (the lease lapses on its own), never raised over the block's outcome."""
    try:
        await store.release_lease(lease.run_id, lease.token)
    except Exception as exc:
        log.warning(
            "could not release the lease of run %s (it lapses in %s s): %s",
            lease.run_id,
            lease_s,
            exc,
            extra={"run_id": lease.run_id},
        )


async def held_by(store: CheckpointStore, run_ids: Sequence[str]) -> Mapping[str, Lease]:
    """The live leases among `run_ids`, read in chunks."""
    found: dict[str, Lease] = {}
    ids = list(run_ids)
    for start in range(0, len(ids), 500):
        found.update(await store.leases(ids[start : start + 500]))
    return found
