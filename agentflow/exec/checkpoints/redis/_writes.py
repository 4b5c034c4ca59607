"""The writes of `RedisCheckpointStore`: a save (with the records before it) and a call record, one script each.

``_lua/save.lua`` and ``_lua/record_call.lua`` apply the rules of `rules` atomically and
set the run's expiry; this module builds their arguments (rows as `redis._rows` encodes
them) and reads their replies. A refusal names what the script read, and `rules` is run
on it here, so the error and its message are those of every other store.

On one server the save script also keeps the three indexes (`redis._index`) in the same
atomic step. On Redis Cluster they live in other slots: a step 0 adds the run to them
before its save, and every save brings its entries up to date after; a failure there is
logged, never raised (the save itself is durable, and the listings skip and repair stale
entries).

A write the run's promise stands on (`Durability.needs`: a record marked ``durable``, a
checkpoint that opens a segment) is sent in one pipeline with the store's ``WAIT`` or
``WAITAOF``, and `Durability.check_ack` reads the acknowledgement after the script's reply:
a refused write raises its refusal, an accepted one that was not acknowledged in time
raises `StoreNotDurable`. `confirm` waits the same way for what a run already holds (a
start retried with the run's id attaches to it only once its step 0 is acknowledged): a
wait measures the writes of its own connection, so it rides a write of its own, a marker
``durable/<run>`` that lapses within a millisecond, put by the store's lease script.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Callable, Sequence

from redis import exceptions as redis_errors

from agentflow._errors import CheckpointConflict, CheckpointError, CheckpointStoreCorrupt, RunHeld, StoreNotDurable
from agentflow.exec.checkpoints.records import EVENTS_KEPT, LeaseMove, SealedCall, SealedCheckpoint, SealedEvent
from agentflow.exec.checkpoints.redis._index import Index
from agentflow.exec.checkpoints.redis._rows import _encode, _encode_event, _text
from agentflow.exec.checkpoints.redis.clients import Bound, LoopClients
from agentflow.exec.checkpoints.redis.durability import Durability
from agentflow.exec.checkpoints.redis.functions import FunctionCall, not_loaded
from agentflow.exec.checkpoints.rules import check_call, check_move_args, check_no_stored_rows, check_save

_log = logging.getLogger("agentflow.exec.checkpoints.redis")


class RedisWrites:
    """The save and record scripts of one store; `run_keys(run_id)` names a run's four keys (and checks the id)."""

    def __init__(
        self,
        clients: LoopClients,
        index: Index,
        run_keys: Callable[..., list[str]],
        ttl: str,
        durability: Durability,
    ) -> None:
        self._clients = clients
        self._index = index
        self._run_keys = run_keys
        self._ttl = ttl
        self._durability = durability

    async def save(
        self,
        run_id: str,
        step: int,
        cp: SealedCheckpoint,
        calls: Sequence[SealedCall],
        move: LeaseMove | None = None,
        events: Sequence[SealedEvent] = (),
    ) -> None:
        """Append `calls`, then save `cp` as `step`, in one script: one round trip, all or nothing.

        With `move`, the run's lease moves in the same script (`LeaseMoving`), and `events`
        are added to the run's stream there once the save is stored.
        """
        row = _encode([cp.run_id, step, cp.flow, cp.status, cp.segment, cp.saved_at, cp.kid, cp.sig], cp.payload)
        args: list[str | int | bytes] = [step, cp.flow, cp.status, cp.segment, repr(cp.saved_at), row, self._ttl]
        args += [run_id, len(calls)]
        for record in calls:
            if record.run_id != run_id:
                raise ValueError(f"save_after_calls({run_id!r}) was given a record of run {record.run_id!r}")
            encoded = _encode([run_id, record.segment, record.seq, record.kind, record.kid, record.sig], record.payload)
            args += [record.segment, record.seq, record.kind, encoded]
        if move is not None:
            args += _move_args(move)
            if events:
                args += [EVENTS_KEPT, *(_encode_event(run_id, e) for e in events)]
        async with self._clients.use() as bound:
            keys = self._run_keys(run_id)
            cluster = bound.cluster
            if cluster and step == 0:
                await self._index.update(bound, run_id, cp, before=True)
            if not cluster:
                keys += self._index.keys(cp.flow)
            if move is not None:
                keys += self._run_keys(run_id, ("events", "lease") if events else ("lease",))
            durable = self._durability.needs(step=step, segment=cp.segment)
            reply = await self._script(bound, "save", keys, args, run_id, f"step {step}" if durable else None)
            if reply[0] != "ok":
                _refuse_held(run_id, reply)
                _refuse_save(run_id, step, cp, calls, reply)
            try:
                if cluster:
                    await self._index.update(bound, run_id, cp, before=False)
            except redis_errors.RedisError as exc:
                _log.warning(
                    "run %r: step %d saved, but its index update failed: %s",
                    run_id,
                    step,
                    exc,
                    extra={"run_id": run_id, "step": step, "segment": cp.segment},
                )

    async def record(self, run_id: str, record: SealedCall, move: LeaseMove | None = None) -> None:
        """Append a call record (numbered and fenced: `CheckpointStore.record_call`), moving the lease with `move`."""
        if record.run_id != run_id:
            raise ValueError(f"record_call({run_id!r}) was given a record of run {record.run_id!r}")
        row = _encode([run_id, record.segment, record.seq, record.kind, record.kid, record.sig], record.payload)
        args: list[str | int | bytes] = [record.segment, record.seq, record.kind, row, self._ttl]
        keys = self._run_keys(run_id)
        if move is not None:
            args += _move_args(move)
            keys += self._run_keys(run_id, ("lease",))
        what = f"the {record.kind} record {record.segment}.{record.seq}"
        durable = what if self._durability.needs(durable_record=record.durable) else None
        async with self._clients.use() as bound:
            reply = await self._script(bound, "record_call", keys, args, run_id, durable)
        _refuse_held(run_id, reply)
        if reply[0] == "missing":
            check_call(run_id, record, None, 0)
        elif reply[0] != "ok":
            check_call(run_id, record, (int(reply[1]), reply[2], int(reply[3])), int(reply[4]))
            raise CheckpointConflict(f"run {run_id!r}: the store refused call record {record.segment}.{record.seq}")

    async def confirm(self, run_id: str, marker_key: str) -> None:
        """Return once everything the server holds of the run now is acknowledged as a durable write is.

        `marker_key` is where the marker ``durable/<run_id>`` is kept: the write the wait rides on.

        Raises:
            StoreNotDurable: not acknowledged within ``wait_timeout_s`` (nothing is lost: ask again).
        """
        if not self._durability.waits:
            return
        what = "the run (as a start retried with its id found it)"
        async with self._clients.use() as bound:
            for _ in range(3):  # another confirm's marker in the same millisecond: the take wrote nothing
                token = secrets.token_hex(8)
                args: list[str | int | bytes] = ["take", token, 1, "durable"]
                reply = await self._script(bound, "lease", [marker_key], args, run_id, what, written=token)
                if reply[2] == token:
                    return
        raise StoreNotDurable(f"run {run_id!r}: the store could not confirm it ({what}): ask again")

    async def _script(
        self,
        bound: Bound,
        name: str,
        keys: list[str],
        args: list[str | int | bytes],
        run_id: str,
        durable: str | None,
        written: str | None = None,
    ) -> list[str]:
        """Run script `name`; when `durable` names the write, wait for it in the same pipeline and check the ack.

        The ack is checked when the script wrote: it answered ``ok``, or (`written`, a lease
        take) it answered with that token.
        """
        if durable is None:
            return [_text(part) for part in await bound.scripts[name](keys=keys, args=args)]
        script = bound.scripts[name]
        for _ in range(2):  # EVALSHA, and once more after loading a script the server does not know
            pipe = bound.client.pipeline(transaction=False)  # not redis-py's script support: it asks SCRIPT EXISTS
            if isinstance(script, FunctionCall):
                pipe.execute_command(*script.command(keys, args))
            else:
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            self._durability.add_wait(pipe)
            raw, ack = await pipe.execute(raise_on_error=False)
            if isinstance(script, FunctionCall) or not isinstance(raw, redis_errors.NoScriptError):
                break
            await bound.client.script_load(script.script)
        if isinstance(raw, Exception):
            missing = not_loaded(raw, script.library) if isinstance(script, FunctionCall) else None
            raise missing or raw
        reply = [_text(part) for part in raw]
        if reply[0] == "ok" or (written is not None and reply[2:3] == [written]):
            if isinstance(ack, Exception):
                raise CheckpointError(f"run {run_id!r}: {durable} is on the Redis primary, but its wait failed: {ack}")
            self._durability.check_ack(ack, run_id, durable)
        return reply


def _move_args(move: LeaseMove) -> list[str | int | bytes]:
    """A lease move's four script arguments (``_lua/lease_move.lua``), its rule's argument checks made first."""
    check_move_args(move)
    return [move.bearer, move.to or "", move.owner, math.ceil(move.ttl_s * 1000)]


def _refuse_held(run_id: str, reply: list[str]) -> None:
    """Raise `RunHeld` when a write that moves the lease found another token's live lease."""
    if reply[0] == "held":
        raise RunHeld(run_id, reply[1], int(reply[3]) / 1000)


def _refuse_save(run_id: str, step: int, cp: SealedCheckpoint, calls: Sequence[SealedCall], reply: list[str]) -> None:
    """Raise the error for the save script's refusal `reply` (see ``_lua/save.lua``'s Returns)."""
    if reply[0] in ("call", "call-missing"):
        record = calls[int(reply[1]) - 1]
        if reply[0] == "call-missing":
            check_call(run_id, record, None, 0)
        check_call(run_id, record, (int(reply[2]), reply[3], int(reply[4])), int(reply[5]))
        raise CheckpointConflict(f"run {run_id!r}: the store refused call record {record.segment}.{record.seq}")
    if reply[0] == "rows":
        check_no_stored_rows(run_id, True)
    if reply[0] == "corrupt":
        raise CheckpointStoreCorrupt(
            f"run {run_id!r}: the store holds {reply[1]} checkpoint rows but its latest step is {reply[2]}"
        )
    check_save(run_id, step, cp.flow, (int(reply[1]), reply[2], reply[3]) if len(reply) > 1 else None)
    raise CheckpointConflict(f"run {run_id!r}: the store refused step {step} ({reply})")
