"""The store set-ups a simulation runs on: each opens a fresh store per episode, one handle per actor.

An actor is a process: it opens its own handle on the episode's storage (its own SQLite
connection, its own Redis client), as workers do. The memory store lives in one process,
so its actors share one instance. A store of your own runs through `custom`.

A set-up may also model someone who writes to the storage behind the store's back
(`Storage.tamper`): the Redis set-up sets a segment's record counter back, which is one
unsigned ``HSET``. The invariants hold all the same: a tamper may stop a run (it is then
reported), never make a finished call run again.
"""

from __future__ import annotations

import json
import tempfile
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.redis.durability import Durability

#: Opens a handle on one episode's storage (called once per actor).
Opener = Callable[[], CheckpointStore]


@dataclass
class Storage:
    """One episode's storage: how an actor opens a handle on it, and the faults it can model."""

    open: Opener
    tamper: Callable[[str], Awaitable[str | None]] | None = None
    """Write behind the store's back about one run; returns what it did (None: nothing to do)."""
    replicate: Callable[[], None] | None = None
    """Bring the (asynchronous) replica up to date with every write acknowledged so far."""
    fail_over: Callable[[], str] | None = None
    """Promote the replica: every write acknowledged since it was last brought up to date is lost."""


@dataclass
class SetUp:
    """A named way to make each episode's storage (`episode(tag)`: fresh storage, `tag` unique per episode)."""

    name: str
    episode: Callable[[str], Storage]
    cleanup: Callable[[], None] = field(default=lambda: None)


def memory(*, waits: bool = False) -> SetUp:
    """The memory store: one instance per episode, shared by its actors.

    With `waits`, the store waits for its replica as ``RedisCheckpointStore(wait_replicas=1)``
    does: each write the promise stands on (`Durability.needs`, the same rule) returns only
    once the replica has every write up to it, so a failover can lose only what came after.
    """
    from agentflow.exec.checkpoints.memory import MemoryCheckpointStore

    def episode(_: str) -> Storage:
        store = MemoryCheckpointStore()
        replica = _memory_state(store)

        def replicate() -> None:
            nonlocal replica
            replica = _memory_state(store)

        def fail_over() -> str:
            lost = _memory_writes(store) - _writes_of(replica)
            _restore_memory(store, replica)
            return f"failed over to a replica {lost} write(s) behind"

        handle: Any = _Waiting(store, replicate) if waits else store
        return Storage(lambda: handle, replicate=replicate, fail_over=fail_over)

    return SetUp("memory-waiting" if waits else "memory", episode)


class _Waiting:
    """A store whose writes the promise stands on wait for the replica (`memory(waits=True)`); the rest is forwarded."""

    def __init__(self, store: Any, replicate: Callable[[], None]) -> None:
        self._store = store
        self._replicate = replicate
        self._rule = Durability(replicas=1)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def record_call(self, run_id: str, record: Any) -> None:
        await self._store.record_call(run_id, record)
        if self._rule.needs(durable_record=record.durable):
            self._replicate()

    async def save(self, run_id: str, step: int, checkpoint: Any) -> None:
        await self.save_after_calls(run_id, step, checkpoint, ())

    async def save_after_calls(self, run_id: str, step: int, checkpoint: Any, calls: Any) -> None:
        await self._store.save_after_calls(run_id, step, checkpoint, calls)
        if self._rule.needs(step=step, segment=checkpoint.segment):
            self._replicate()

    async def record_call_moving(self, run_id: str, record: Any, move: Any) -> None:
        await self._store.record_call_moving(run_id, record, move)
        if self._rule.needs(durable_record=record.durable):
            self._replicate()

    async def save_after_calls_moving(
        self, run_id: str, step: int, checkpoint: Any, calls: Any, move: Any, events: Any = ()
    ) -> None:
        await self._store.save_after_calls_moving(run_id, step, checkpoint, calls, move, events)
        if self._rule.needs(step=step, segment=checkpoint.segment):
            self._replicate()


# A failover of the memory "server": its state is copied to a replica now and then, and the
# replica replaces it when the primary is lost. The simulation reaches into the store's
# dicts for that (a test harness modelling a server, not a use of the store).
_MemoryState = tuple[dict[str, Any], ...]


def _copy(state: _MemoryState) -> _MemoryState:
    """A copy of the store's dicts that later writes to either side do not reach."""
    checkpoints, calls, listed, leases, events, markers = state
    return (
        {run: list(rows) for run, rows in checkpoints.items()},
        {run: {seg: list(recs) for seg, recs in segs.items()} for run, segs in calls.items()},
        dict(listed),
        dict(leases),
        {run: deque(kept, maxlen=kept.maxlen) for run, kept in events.items()},
        dict(markers),
    )


def _memory_state(store: Any) -> _MemoryState:
    return _copy((store._checkpoints, store._calls, store._listed, store._leases, store._events, store._markers))


def _restore_memory(store: Any, state: _MemoryState) -> None:
    store._checkpoints, store._calls, store._listed, store._leases, store._events, store._markers = _copy(state)


def _writes_of(state: _MemoryState) -> int:
    return sum(len(rows) for rows in state[0].values()) + sum(
        len(recs) for segs in state[1].values() for recs in segs.values()
    )


def _memory_writes(store: Any) -> int:
    return _writes_of(_memory_state(store))


def sqlite() -> SetUp:
    """A SQLite file per episode, under one temporary folder; each actor opens it with its own store."""
    from agentflow.exec.checkpoints.sqlite import SQLiteCheckpointStore

    folder = tempfile.TemporaryDirectory(prefix="agentflow-sim-")

    def episode(tag: str) -> Storage:
        path = Path(folder.name) / f"{tag}.db"
        return Storage(lambda: SQLiteCheckpointStore(path))

    return SetUp("sqlite", episode, folder.cleanup)


def fakeredis() -> SetUp:
    """The Redis store's Lua scripts on fakeredis (one fake server per episode, one client per actor)."""
    import fakeredis as fake

    from agentflow.exec.checkpoints.redis import RedisCheckpointStore

    def episode(tag: str) -> Storage:
        server = fake.FakeServer()
        prefix = f"sim-{tag}"

        async def rewind(run_id: str) -> str | None:
            # The most a counter can hide: everything logged since the latest checkpoint, so
            # the run looks untouched since then (its `log` marker: segment, count).
            client = fake.FakeAsyncRedis(server=server)
            base = f"{prefix}:run:{{{run_id}}}"
            newest = await client.lindex(f"{base}:cp", -1)  # a header line, then the payload
            if not isinstance(newest, bytes) or not newest:
                return None
            segment, saw = json.loads(newest.split(b"\n", 1)[1])["log"]
            counts = f"{base}:next"
            now = int(await client.hget(counts, str(segment)) or 0)
            if now <= saw:
                return None
            await client.hset(counts, str(segment), saw)
            return f"set the record counter of {run_id} segment {segment} back from {now} to {saw}"

        return Storage(lambda: RedisCheckpointStore(lambda: fake.FakeAsyncRedis(server=server), prefix=prefix), rewind)

    return SetUp("fakeredis", episode)


def custom(name: str, episode: Callable[[str], Opener]) -> SetUp:
    """Your own store: `episode(tag)` makes fresh, empty storage for one episode and returns an opener of handles.

    Every handle the opener returns must see the same storage (as the processes of one
    deployment do); `tag` is unique per episode (a key prefix, a file name, a schema).
    """
    return SetUp(name, lambda tag: Storage(episode(tag)))


#: The set-ups `make sim` runs, by name.
SETUPS: dict[str, Callable[[], SetUp]] = {
    "memory": memory,
    "memory-waiting": lambda: memory(waits=True),
    "sqlite": sqlite,
    "fakeredis": fakeredis,
}
