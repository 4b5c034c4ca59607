"""`RedisCheckpointStore`: checkpoints and call logs in plain Redis, guarded by Lua scripts.

Key layout (``P`` is the store's prefix, one per tenant; ``R`` the run id). The ``{R}`` hash
tag puts every key of a run in one Redis Cluster slot, so each script touches one slot::

    P:run:{R}:cp          list   checkpoint rows; list index = step
    P:run:{R}:latest      hash   step, flow, status, segment, saved_at of the newest checkpoint
    P:run:{R}:calls       hash   "<segment>:<seq>" -> call-record row
    P:run:{R}:next        hash   "<segment>" -> number of records the segment has
    P:runs                zset   run id -> saved_at of its newest save (every flow)
    P:runs:<flow>         zset   run id -> saved_at of its newest save
    P:unfinished:<flow>   zset   run id -> saved_at, for runs last saved running or paused
    P:run:{R}:lease       hash   owner, token, expires_at of the run's lease (`redis._leases`)
    P:marker:{S}:<kind>   hash   owner (the marker's value), token, expires_at of marker <kind>/S (`MarkerStore`)

A row is one JSON header line and then the payload bytes exactly as given; the format and
its codec live in `redis._rows`.

`save` and `record_call` run ``_lua/save.lua`` and ``_lua/record_call.lua`` (EVALSHA, loaded
again on NOSCRIPT; with ``functions=True``, FCALL of the library `load_functions` loaded:
`redis.functions`), which apply the rules of `rules` atomically and set the run's expiry:
every key of a run expires ``ttl_s`` after its last write, except while the run is paused.
Their arguments and replies are `redis._writes`'.

The three indexes (``P:runs...``, ``P:unfinished:...``) and the listings that read them
are `redis._index`'s: on one server the save script keeps them exact and atomic with the
run; on Redis Cluster, where they are in other slots, separate commands do and the
listings double-check each run they name. No listing and no write uses KEYS or SCAN. (So
tenants stay apart, no prefix may be another's plus ``:run...``.)

The latest hash is what the save script reads to tell a new run from an existing one, and
it is unsigned. When it is missing but other keys of the run are still there (deleted by
hand, or evicted), a step 0 is refused and every old key is kept. `stored_runs` finds runs
from their checkpoint lists alone: it SCANs for ``P:run:{*}:cp`` on every primary (one
node, or each primary of a Cluster), a walk of the keyspace meant for audits and repairs.
`relist` puts a run found that way back: ``_lua/relist.lua`` rewrites the latest hash (and,
on one server, the index entries) from the newest checkpoint row's header, with the
expiry rule of a save, and touches nothing when they already agree with it.

Leases are `redis._leases`'s: ``_lua/lease.lua`` takes, renews and releases a run's lease on
the server's clock, and the key expires by itself when the lease lapses. The lease key is
not one of the run keys the other scripts take; `delete` removes it with them. A take may
read the run's head in the same script (`take_lease_reading_head`, the port's optional `HeadReading`: what
`agentflow.exec.run.lease` uses where a store has it), and a marker about the run with it
(its cancel request), so a worker's superstep starts with one round trip, not three.

Markers (`MarkerStore`) use the same script and rules on keys of their own: a marker
``<kind>/<subject>`` is kept at ``P:marker:{<subject>}:<kind>``, the subject as the hash tag,
so a marker about a run shares the run's slot (and the take can read it), apart from the
run's own keys: a put is a take, a renewal a take with the same token, a take of a marker a
release; the hash's owner field holds the marker's value. A run's `delete` leaves its
markers to lapse. (Releases before this layout kept a marker at ``P:marker:{<kind>/<subject>}``;
those lapse on their own: a cancel request within minutes, a sweep's lock within its term.)

Retention is `redis._prune`'s: finished runs are found through ``P:runs`` (sorted by the
time of their newest save) and each is deleted whole by ``_lua/prune_run.lua``, which
removes its six keys (and, on one server, its index entries) in one step, and only while
its last checkpoint row is the one the caller judged. A trim
(``_lua/trim_run.lua``) blanks every checkpoint row of a finished run but the newest: the
list keeps an empty string in each trimmed row's place, so its index stays the step, and
`history` skips the blanks. TTL expiry is retention too: a run's keys expire ``ttl_s``
after its last write, whatever its status but paused.

Each operation has a deadline of its own (``op_timeout_s``), and each event loop its own
client: `redis.clients`.

Durability (``wait_replicas``, ``wait_fsync``, ``wait_timeout_s``) is `redis.durability`'s:
the writes the run's promise stands on (a non-idempotent call's ``started``, a run's step 0,
every claim) wait in their own pipeline for replicas or an fsync, and the server is
checked once per client. `from_url` takes ``redis+sentinel://`` URLs (`redis.urls`): the
client asks the Sentinels for the primary and asks again after a failover.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from importlib import resources

from agentflow._errors import CheckpointConflict, CheckpointNotFound, CheckpointStoreCorrupt
from agentflow.exec.checkpoints.records import (
    Bookkeeping,
    JudgedRows,
    Lease,
    LeaseMove,
    Marker,
    Pruned,
    SealedCall,
    SealedCheckpoint,
    SealedEvent,
    StoredEvent,
    Trimmed,
)
from agentflow.exec.checkpoints.redis._events import RedisEvents
from agentflow.exec.checkpoints.redis._index import Index
from agentflow.exec.checkpoints.redis._leases import Leases
from agentflow.exec.checkpoints.redis._prune import RedisPrune
from agentflow.exec.checkpoints.redis._rows import _bookkeeping_of, _calls_of, _decode_checkpoint, _head_of, _text
from agentflow.exec.checkpoints.redis._writes import RedisWrites
from agentflow.exec.checkpoints.redis.clients import Client, LoopClients, address
from agentflow.exec.checkpoints.redis.durability import Durability, check_server
from agentflow.exec.checkpoints.redis.functions import load_library
from agentflow.exec.checkpoints.redis.urls import client_factory
from agentflow.exec.checkpoints.rules import check_events, check_marker_args, check_row

#: The run keys, in the order the scripts take them as KEYS.
_RUN_PARTS = ("cp", "latest", "calls", "next")
#: The Lua scripts, by name (``_lua/<name>.lua``).
_SCRIPTS = (
    "save",
    "record_call",
    "relist",
    "prune",
    "unfinished",
    "lease",
    "prune_run",
    "trim_run",
    "append_events",
    "compact_events",
    "read_events",
)
_LUA = {n: (resources.files(__package__) / "_lua" / f"{n}.lua").read_text() for n in _SCRIPTS}
#: What the retention scripts share (`newest_is`), put before each of them: Redis runs one script at a time.
for _name in ("prune_run", "trim_run"):
    _LUA[_name] = (resources.files(__package__) / "_lua" / "newest.lua").read_text() + "\n" + _LUA[_name]
#: What the writes share when they move a run's lease (`LeaseMoving`), put before each of them.
for _name in ("save", "record_call"):
    _LUA[_name] = (resources.files(__package__) / "_lua" / "lease_move.lua").read_text() + "\n" + _LUA[_name]
#: How often `relist` reads the newest row again when a save or delete moved it meanwhile.
_RELIST_ATTEMPTS = 3
#: Keys `stored_runs` asks for per SCAN page (a hint to the server, not a limit).
_SCAN_COUNT = 1000
#: Characters a SCAN MATCH pattern treats specially, escaped when they occur in the prefix.
_GLOB = re.compile(r"([*?\[\]\\])")


def _marker_key(prefix: str, key: str) -> str:
    """Where marker `key` (``<kind>/<subject>``) is kept: in its subject's slot (see the module docstring)."""
    kind, _, subject = key.partition("/")
    if not kind or not subject or subject.startswith("}"):
        return f"{prefix}:marker:{{{key}}}"  # not a kind and a subject: the whole key is the tag
    return f"{prefix}:marker:{{{subject}}}:{kind}"


def _marker(held: Lease) -> Marker:
    """A marker kept as a lease hash on a key of its own: the owner field holds its value."""
    return Marker(held.run_id, held.owner, held.token, held.expires_at)


class RedisCheckpointStore:
    """Keeps checkpoints and call logs in Redis (standalone or Cluster), shared by every client."""

    in_process = False
    #: Shared with other processes: rows are signed with the runner's ``checkpoint_key``.
    local_key: bytes | None = None

    def __init__(
        self,
        client_factory: Callable[[], Client],
        *,
        prefix: str = "agentflow",
        ttl_s: int | None = 7 * 24 * 3600,
        op_timeout_s: float | None = 10.0,
        wait_replicas: int = 0,
        wait_fsync: bool = False,
        wait_timeout_s: float = 1.0,
        allow_volatile: bool = True,
        functions: bool = False,
    ) -> None:
        """Make a store; no connection is opened until the first call.

        Args:
            client_factory: makes a ``redis.asyncio.Redis`` or ``RedisCluster`` (with
                ``decode_responses=False``); called once per event loop that uses the store.
            prefix: first part of every key; one per tenant. No ``{`` or ``}``.
            ttl_s: seconds after a run's last write until its keys expire (not while it is
                paused); None keeps runs forever.
            op_timeout_s: deadline of each store operation, connecting included; past it
                the operation raises `CheckpointError` (None: the client's timeouts only).
            wait_replicas: the writes the run's promise stands on (a non-idempotent call's
                ``started``, a run's step 0, every claim) return only once this many
                replicas have them (``WAIT``); 0: once the primary has them.
            wait_fsync: those writes also wait until the append-only file holds them on
                disk, on the primary and on the `wait_replicas` replicas (``WAITAOF``;
                Redis 7.2 or Valkey, with ``appendonly yes``).
            wait_timeout_s: how long those writes wait; unacknowledged by then, the write
                raises `StoreNotDurable` and what depended on it does not happen.
            allow_volatile: False refuses a server that keeps nothing on disk while no
                replica is waited for (True: a warning once per server).
            functions: call the scripts as functions of the library an admin loaded with
                `load_functions` (``FCALL``), never EVAL/EVALSHA: so the workers' ACL can
                refuse EVAL, SCRIPT and FUNCTION (`redis.functions`, docs/security.md).

        Raises:
            ValueError: `prefix`, `ttl_s`, `op_timeout_s` or a wait option is not acceptable.
            TypeError: `client_factory` is not callable.
        """
        if not callable(client_factory):
            raise TypeError(f"client_factory must be a callable that returns a Redis client, not {client_factory!r}")
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise ValueError(
                f"prefix must be a non-empty string without '{{' or '}}' (they would break the "
                f"run's hash tag), e.g. 'agentflow' or 'tenant-7'; got {prefix!r}"
            )
        if ttl_s is not None and (isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or ttl_s <= 0):
            raise ValueError(
                f"ttl_s must be a positive whole number of seconds, or None to never expire; got {ttl_s!r}"
            )
        if op_timeout_s is not None and (isinstance(op_timeout_s, bool) or not op_timeout_s > 0):
            raise ValueError(f"op_timeout_s must be a positive number of seconds, or None; got {op_timeout_s!r}")
        durability = Durability(wait_replicas, wait_fsync, wait_timeout_s, allow_volatile)
        if durability.waits and op_timeout_s is not None and op_timeout_s <= wait_timeout_s:
            raise ValueError(
                f"op_timeout_s ({op_timeout_s}) must be longer than wait_timeout_s ({wait_timeout_s}): a write that "
                "waits for replicas or an fsync is one operation"
            )
        self.durability = durability
        """What the writes the run's promise stands on wait for (`redis.durability.Durability`)."""

        async def check(client: Client) -> None:
            await check_server(client, address(client), durability)

        self._clients = LoopClients(client_factory, _LUA, op_timeout_s, check, functions=functions)
        self._prefix = prefix
        self._ttl = str(ttl_s or 0)
        self._index = Index(prefix, self._run_keys)
        self._leases = Leases(self._clients, lambda run_id: self._run_keys(run_id, ("lease",))[0])
        self._markers = Leases(self._clients, lambda key: _marker_key(prefix, key))
        self._retention = RedisPrune(
            self._clients, self._index, prefix, self._run_keys, lambda k: _marker_key(prefix, k)
        )
        self._events = RedisEvents(self._clients, self._run_keys, self._ttl)
        self._writes = RedisWrites(self._clients, self._index, self._run_keys, self._ttl, durability)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "agentflow",
        ttl_s: int | None = 7 * 24 * 3600,
        op_timeout_s: float = 10.0,
        wait_replicas: int = 0,
        wait_fsync: bool = False,
        wait_timeout_s: float = 1.0,
        allow_volatile: bool = True,
        functions: bool = False,
    ) -> RedisCheckpointStore:
        """A store on the Redis server at `url` (``redis://``, ``rediss://``, ``unix://`` or ``redis+sentinel://``).

        ``redis+sentinel://[:password@]host:26379,host2:26379/<primary name>[/<db>]`` asks the
        Sentinels where the primary is, and asks again after a failover. Its clients leave
        timing out to the store's deadline (``socket_timeout=None``; see the module notes),
        which makes each command cheaper. The other arguments are the constructor's.
        """
        return cls(
            client_factory(url, op_timeout_s),
            prefix=prefix,
            ttl_s=ttl_s,
            op_timeout_s=op_timeout_s,
            wait_replicas=wait_replicas,
            wait_fsync=wait_fsync,
            wait_timeout_s=wait_timeout_s,
            allow_volatile=allow_volatile,
            functions=functions,
        )

    @staticmethod
    async def load_functions(client: Client) -> str:
        """Load this release's scripts as a Functions library on `client`'s server (an admin's client); return its name.

        A deploy step, once per release and before the workers of ``functions=True`` start: the
        library is persisted and replicated with the data (`redis.functions.load_library`).
        """
        return await load_library(client, _LUA)

    async def __aenter__(self) -> RedisCheckpointStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        """Store a checkpoint (compare-and-set; see `CheckpointStore.save`)."""
        await self.save_after_calls(run_id, step, checkpoint, ())

    async def save_after_calls(
        self, run_id: str, step: int, checkpoint: SealedCheckpoint, calls: Sequence[SealedCall]
    ) -> None:
        """Append `calls`, then save `checkpoint`, in one script: one round trip, all or nothing."""
        check_row(run_id, step, checkpoint)
        await self._writes.save(run_id, step, checkpoint, calls)

    async def latest(self, run_id: str) -> SealedCheckpoint:
        """Return the newest checkpoint of the run."""
        async with self._clients.use() as bound:
            raw = await bound.client.lindex(self._run_keys(run_id)[0], -1)
        if raw is None:
            raise CheckpointNotFound(f"no checkpoint is stored for run {run_id!r}")
        return _decode_checkpoint(run_id, raw, "the latest checkpoint")

    async def history(self, run_id: str) -> Sequence[SealedCheckpoint]:
        """Return every checkpoint of the run, oldest first (a trimmed run: from the kept one)."""
        async with self._clients.use() as bound:
            rows = await bound.client.lrange(self._run_keys(run_id)[0], 0, -1)
        kept = next((i for i, raw in enumerate(rows) if raw != b""), len(rows))  # a trim blanks the first ones
        found = [_decode_checkpoint(run_id, raw, f"checkpoint row {i}") for i, raw in enumerate(rows[kept:], kept)]
        for i, cp in enumerate(found, kept):
            if cp.step != i:
                raise CheckpointStoreCorrupt(f"run {run_id!r}: checkpoint row {i} holds step {cp.step}")
        return found

    async def list_unfinished(self, flow: str) -> Sequence[str]:
        """Return the ids of the flow's running and paused runs."""
        async with self._clients.use() as bound:
            return await self._index.unfinished(bound, flow)

    async def list_runs(self, flow: str | None = None, limit: int = 1000) -> Sequence[SealedCheckpoint]:
        """Return the latest checkpoint of up to `limit` runs (of one flow, or all), newest first."""
        async with self._clients.use() as bound:
            return await self._index.runs(bound, flow, limit)

    async def stored_runs(self) -> Sequence[str]:
        """Return the id of every run with a checkpoint list under this prefix, sorted.

        SCANs for the runs' ``:cp`` keys on the server, or on each primary of a Cluster, so
        it finds runs the indexes no longer name. Each page is one operation under the
        deadline; keys written during the walk may or may not be seen.
        """
        head, tail = f"{self._prefix}:run:{{", "}:cp"
        keys = await self._clients.scan(_GLOB.sub(r"\\\1", head) + "*" + tail, _SCAN_COUNT)
        return sorted({_text(key)[len(head) : -len(tail)] for key in keys})

    async def relist(self, run_id: str) -> SealedCheckpoint | None:
        """Rewrite the run's latest hash and index entries from its newest checkpoint row; return the row.

        Reads the newest row, then runs ``_lua/relist.lua``, which checks that the list still
        ends with that row and holds exactly step + 1 rows, and writes the latest hash (and,
        on one server, the index entries) as a save of that row would, unless they already
        agree with it (see `CheckpointStore.relist`). A write restarts the run's expiry, as
        every write does (none while it is paused). On Cluster the indexes are brought up to
        date by separate commands afterwards, as after a save. Should a save or delete
        come between the read and the script, the row is read again.

        Raises:
            CheckpointStoreCorrupt: a row cannot be read, or the list does not end at its
                newest row's step.
            CheckpointConflict: the newest row kept changing while it was being read.
        """
        keys = self._run_keys(run_id)
        async with self._clients.use() as bound:
            for _ in range(_RELIST_ATTEMPTS):
                raw = await bound.client.lindex(keys[0], -1)
                if raw is None:
                    return None
                cp = _decode_checkpoint(run_id, raw, "the latest checkpoint")
                args: list[str | int | bytes] = [raw, cp.step, cp.flow, cp.status, cp.segment, repr(cp.saved_at)]
                args += [self._ttl, run_id]
                index = [] if bound.cluster else self._index.keys(cp.flow)
                reply = [_text(part) for part in await bound.scripts["relist"](keys=keys + index, args=args)]
                if reply[0] == "corrupt":
                    raise CheckpointStoreCorrupt(
                        f"run {run_id!r}: the store holds {reply[1]} checkpoint rows but the newest is step {cp.step}"
                    )
                if reply[0] in ("same", "relisted"):
                    if bound.cluster:
                        await self._index.update(bound, run_id, cp, before=False)
                    return cp
        raise CheckpointConflict(f"run {run_id!r}: its newest checkpoint kept changing while it was being relisted")

    async def delete(self, run_id: str) -> None:
        """Remove every key of the run (its lease too) and its index entries."""
        keys = self._run_keys(run_id)
        async with self._clients.use() as bound:
            flow = await bound.client.hget(keys[1], "flow")
            await bound.client.delete(
                *keys, *self._run_keys(run_id, ("lease", "events", "packed"))
            )  # one slot: one DEL
            pipe = bound.client.pipeline(transaction=False)
            pipe.zrem(f"{self._prefix}:runs", run_id)
            if flow is not None:
                pipe.zrem(f"{self._prefix}:runs:{_text(flow)}", run_id)
                pipe.zrem(f"{self._prefix}:unfinished:{_text(flow)}", run_id)
            await pipe.execute()

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        """Append a call record (numbered and fenced; see `CheckpointStore.record_call`)."""
        await self._writes.record(run_id, record)

    async def record_call_moving(self, run_id: str, record: SealedCall, move: LeaseMove) -> None:
        """`record_call`, moving the run's lease in the same script (see `LeaseMoving`)."""
        await self._writes.record(run_id, record, move)

    async def save_after_calls_moving(
        self,
        run_id: str,
        step: int,
        checkpoint: SealedCheckpoint,
        calls: Sequence[SealedCall],
        move: LeaseMove,
        events: Sequence[SealedEvent] = (),
    ) -> None:
        """`save_after_calls`, moving the run's lease and appending `events` in the same script (see `LeaseMoving`)."""
        check_row(run_id, step, checkpoint)
        check_events(run_id, events)
        await self._writes.save(run_id, step, checkpoint, calls, move, events)

    async def head(self, run_id: str) -> tuple[SealedCheckpoint, dict[int, int]]:
        """Return the latest checkpoint and how many call records each segment holds, in one round trip.

        What a distributed superstep reads first: after a clean handoff the counts show that
        nothing was logged since the checkpoint, and the log itself need not be read.

        Raises:
            CheckpointNotFound: nothing is stored for the run.
            CheckpointStoreCorrupt: a count is not a number.
        """
        keys = self._run_keys(run_id)
        async with self._clients.use() as bound:
            async with bound.client.pipeline(transaction=True) as pipe:  # MULTI/EXEC: one instant
                pipe.lindex(keys[0], -1)
                pipe.hgetall(keys[3])
                pipe.hlen(keys[2])
                raw, fields, stored = await pipe.execute()
        if raw is None:
            raise CheckpointNotFound(f"no checkpoint is stored for run {run_id!r}")
        return _head_of(run_id, raw, fields, int(stored))

    async def bookkeeping(self, run_id: str) -> Bookkeeping:
        """The run's newest row header, its ``latest`` hash and its per-segment counters, in one MULTI/EXEC.

        Raises:
            CheckpointStoreCorrupt: the newest row's header, a counter or a record's field cannot be read.
        """
        cp, latest, calls, counters = self._run_keys(run_id)
        async with self._clients.use() as bound:
            async with bound.client.pipeline(transaction=True) as pipe:
                pipe.lindex(cp, -1)
                pipe.hmget(latest, ["step", "flow", "status"])
                pipe.hgetall(counters)
                pipe.hkeys(calls)
                raw, listed, counts, fields = await pipe.execute()
        return _bookkeeping_of(run_id, raw, listed, counts, fields)

    async def take_lease_reading_head(
        self, run_id: str, owner: str, token: str, ttl_s: float, marker: str | None = None
    ) -> tuple[Lease, tuple[SealedCheckpoint, dict[int, int]] | None, Marker | None]:
        """`take_lease`, and when it took the lease, `head` in the same script (one round trip).

        The head is None when the lease was not taken (another token holds it live) or
        nothing is stored for the run. `marker`: a marker key about the run
        (``<kind>/<run_id>``), read in the same script as `peek_markers` would (None: none
        asked, none live, or the lease was not taken).

        Raises:
            CheckpointStoreCorrupt: the lease hash, the row, a count or the marker is not one this store wrote.
            ValueError: `marker` is not a key about this run.
        """
        keys = self._run_keys(run_id)
        head_keys = [keys[0], keys[3], keys[2]]
        if marker is not None:
            if marker.partition("/")[2] != run_id:
                raise ValueError(f"take_lease_reading_head({run_id!r}) reads a marker about that run, not {marker!r}")
            head_keys.append(_marker_key(self._prefix, marker))
        lease, raw, stored, flat, fields = await self._leases.take_reading(run_id, owner, token, ttl_s, head_keys)
        found = None if marker is None else self._markers.held(marker, fields)
        note = None if found is None else _marker(found)
        if raw is None:
            return lease, None, note
        return lease, _head_of(run_id, raw, dict(zip(flat[::2], flat[1::2], strict=True)), stored), note

    async def calls(self, run_id: str) -> Sequence[SealedCall]:
        """Return the run's call records by segment, then sequence number."""
        async with self._clients.use() as bound:
            fields = await bound.client.hgetall(self._run_keys(run_id)[2])
        return _calls_of(run_id, fields)

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Lease:
        """Take the run's lease unless another live token holds it: one script, on the server's clock."""
        return await self._leases.take(run_id, owner, token, ttl_s)

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> Lease | None:
        """Push the lease's expiry if `token` holds it live (see `CheckpointStore.renew_lease`)."""
        return await self._leases.renew(run_id, token, ttl_s)

    async def release_lease(self, run_id: str, token: str) -> bool:
        """Give the lease up if `token` holds it; whether it was live."""
        return await self._leases.release(run_id, token)

    async def leases(self, run_ids: Sequence[str]) -> Mapping[str, Lease]:
        """The live leases among `run_ids`: pipelined reads of their keys, which expire as they lapse."""
        return await self._leases.read(run_ids)

    async def prunable(self, before: float, statuses: Collection[str], limit: int) -> Sequence[str]:
        """The runs a prune would take now, oldest first, found through the time index (see `redis._prune`)."""
        return await self._retention.prunable(before, statuses, limit)

    async def prune(
        self,
        run_ids: Sequence[str],
        before: float,
        statuses: Collection[str],
        owner: str,
        judged: JudgedRows | None = None,
    ) -> Pruned:
        """Delete the runs that still qualify, whole: one script per run, pipelined (see `redis._prune`).

        With `judged`, each script deletes its run only while the run's last checkpoint row is the judged one.
        """
        return await self._retention.prune(run_ids, before, statuses, judged)

    async def trimmable(
        self, before: float, statuses: Collection[str], limit: int, since: float | None = None
    ) -> Sequence[tuple[str, float]]:
        """The runs a trim would take now, oldest first, found through the time index (see `redis._prune`)."""
        return await self._retention.trimmable(before, statuses, limit, since)

    async def trim(
        self, run_ids: Sequence[str], before: float, statuses: Collection[str], judged: JudgedRows | None = None
    ) -> Trimmed:
        """Keep only the newest checkpoint of the runs that still qualify: one script per run (`redis._prune`)."""
        return await self._retention.trim(run_ids, before, statuses, judged)

    async def append_events(self, run_id: str, events: Sequence[SealedEvent]) -> None:
        """Append to the run's Stream, trimmed and expiring with the run (see `EventStore.append_events`)."""
        check_events(run_id, events)
        if events:
            await self._events.append(run_id, events)

    async def read_events(self, run_id: str, after: str | None = None, limit: int = 1000) -> Sequence[StoredEvent]:
        """The run's events after cursor `after` (a stream id), oldest first (see `EventStore.read_events`)."""
        return await self._events.read(run_id, after, limit)

    async def compact_events(self, run_id: str) -> bool:
        """Put the run's stream back as one compressed entry, cursors kept (see `EventCompacting`)."""
        return await self._events.compact(run_id)

    async def aclose(self) -> None:
        """Close this event loop's client; the store connects again when used afterwards.

        Clients that other event loops made are closed when those loops shut down.
        """
        await self._clients.aclose()

    async def confirm_durable(self, run_id: str) -> None:
        """`DurabilityConfirming`: wait, as a step 0 waits, until what the server holds of the run is acknowledged."""
        await self._writes.confirm(run_id, _marker_key(self._prefix, f"durable/{run_id}"))

    async def put_marker(self, key: str, value: str, token: str, ttl_s: float) -> Marker:
        """Set the marker unless another token's is live: the lease script on the marker's own key."""
        check_marker_args(key, value, token, ttl_s)
        return _marker(await self._markers.take(key, value, token, ttl_s))

    async def peek_markers(self, keys: Sequence[str]) -> Mapping[str, Marker]:
        """The live markers among `keys` (their keys expire as they lapse)."""
        return {key: _marker(found) for key, found in (await self._markers.read(keys)).items()}

    async def take_marker(self, key: str, token: str) -> bool:
        """Remove the marker if `token` set it; whether it was live."""
        return await self._markers.release(key, token)

    def _run_keys(self, run_id: str, parts: Sequence[str] = _RUN_PARTS) -> list[str]:
        if not isinstance(run_id, str) or not run_id or run_id.startswith("}"):
            raise ValueError(
                f"run id {run_id!r} makes no Redis hash tag: use a non-empty id that does not start with '}}'"
            )
        return [f"{self._prefix}:run:{{{run_id}}}:{part}" for part in parts]
