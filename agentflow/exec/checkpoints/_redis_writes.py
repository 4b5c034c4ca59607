"""The writes of `RedisCheckpointStore`: a save (with the records before it) and a call record, one script each.

``_lua/save.lua`` and ``_lua/record_call.lua`` apply the rules of `_rules` atomically and
set the run's expiry; this module builds their arguments (rows as `_redis_rows` encodes
them) and reads their replies. A refusal names what the script read, and `_rules` is run
on it here, so the error and its message are those of every other store.

On one server the save script also keeps the three indexes (`_redis_index`) in the same
atomic step. On Redis Cluster they live in other slots: a step 0 adds the run to them
before its save, and every save brings its entries up to date after; a failure there is
logged, never raised (the save itself is durable, and the listings skip and repair stale
entries).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from redis import exceptions as redis_errors

from agentflow._errors import CheckpointConflict, CheckpointStoreCorrupt
from agentflow.exec.checkpoints._records import SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints._redis_clients import LoopClients
from agentflow.exec.checkpoints._redis_index import Index
from agentflow.exec.checkpoints._redis_rows import _encode, _text
from agentflow.exec.checkpoints._rules import check_call, check_no_stored_rows, check_save

_log = logging.getLogger("agentflow.exec.checkpoints.redis")


class RedisWrites:
    """The save and record scripts of one store; `run_keys(run_id)` names a run's four keys (and checks the id)."""

    def __init__(self, clients: LoopClients, index: Index, run_keys: Callable[[str], list[str]], ttl: str) -> None:
        self._clients = clients
        self._index = index
        self._run_keys = run_keys
        self._ttl = ttl

    async def save(self, run_id: str, step: int, cp: SealedCheckpoint, calls: Sequence[SealedCall]) -> None:
        """Append `calls`, then save `cp` as `step`, in one script: one round trip, all or nothing."""
        row = _encode([cp.run_id, step, cp.flow, cp.status, cp.segment, cp.saved_at, cp.kid, cp.sig], cp.payload)
        args: list[str | int | bytes] = [step, cp.flow, cp.status, cp.segment, repr(cp.saved_at), row, self._ttl]
        args += [run_id, len(calls)]
        for record in calls:
            if record.run_id != run_id:
                raise ValueError(f"save_after_calls({run_id!r}) was given a record of run {record.run_id!r}")
            encoded = _encode([run_id, record.segment, record.seq, record.kind, record.kid, record.sig], record.payload)
            args += [record.segment, record.seq, record.kind, encoded]
        async with self._clients.use() as bound:
            keys = self._run_keys(run_id)
            cluster = bound.cluster
            if cluster and step == 0:
                await self._index.update(bound, run_id, cp, before=True)
            if not cluster:
                keys += self._index.keys(cp.flow)
            reply = [_text(part) for part in await bound.scripts["save"](keys=keys, args=args)]
            if reply[0] != "ok":
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

    async def record(self, run_id: str, record: SealedCall) -> None:
        """Append a call record (numbered and fenced; see `CheckpointStore.record_call`)."""
        if record.run_id != run_id:
            raise ValueError(f"record_call({run_id!r}) was given a record of run {record.run_id!r}")
        row = _encode([run_id, record.segment, record.seq, record.kind, record.kid, record.sig], record.payload)
        args: list[str | int | bytes] = [record.segment, record.seq, record.kind, row, self._ttl]
        async with self._clients.use() as bound:
            reply = [_text(part) for part in await bound.scripts["record_call"](keys=self._run_keys(run_id), args=args)]
        if reply[0] == "missing":
            check_call(run_id, record, None, 0)
        elif reply[0] != "ok":
            check_call(run_id, record, (int(reply[1]), reply[2], int(reply[3])), int(reply[4]))
            raise CheckpointConflict(f"run {run_id!r}: the store refused call record {record.segment}.{record.seq}")


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
