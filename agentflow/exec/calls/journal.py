"""`Journal`: one worker's pen on a run's call log, and the held record that goes with a checkpoint.

A journal writes signed records numbered within its segment, one at a time (concurrent
nodes queue on a lock), so the store can refuse a gap or a fenced writer. Which record
is held for the checkpoint is `CallLog.closes_with`'s rule (`calls.log`); how a held
record is stored, whatever happens next, is here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any, cast

from agentflow._errors import AgentflowError, CheckpointConflict, CheckpointError
from agentflow.exec.checkpoints import CheckpointStore, SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints.protocol import LeaseMoving
from agentflow.exec.checkpoints.records import LeaseMove, SealedEvent
from agentflow.exec.seal import Sealer, canonical


class Journal:
    """Writes one worker's records of a run, numbered within its segment.

    A record may also be *held* (`hold_encoded`): sealed and numbered now, stored with the
    next checkpoint in one atomic write (`save`). A step holds the ``done`` record of the
    call that closes it (`CallLog.closes_with`), so the two cost one commit or round trip.
    Any other record written meanwhile stores the held ones first, in order.
    """

    def __init__(
        self,
        store: CheckpointStore,
        sealer: Sealer,
        run_id: str,
        segment: int,
        next_seq: int = 0,
        *,
        max_bytes: int | None = None,
        holder: str | None = None,
    ) -> None:
        self.store = store
        self.max_bytes = max_bytes
        """The largest record body stored; a result over it leaves its call unrecordable."""
        self.holder = holder
        """Who writes (the lease owner, ``<name>@<host>:<pid>``): each ``started`` names it, for the operator."""
        self.sealer = sealer
        self.run_id = run_id
        self.segment = segment
        self.next_seq = next_seq
        self._held: list[SealedCall] = []
        self._lock = asyncio.Lock()

    async def write(self, kind: str, body: dict[str, Any], *, durable: bool = False) -> None:
        """Sign and append one record (`durable`: the run must not go on until it would survive a failover).

        Raises:
            CheckpointConflict: the store refused it (fenced, or out of sequence).
            TypeError, ValueError: the body cannot be encoded.
        """
        await self.write_encoded(kind, canonical(body), durable=durable)

    async def write_encoded(self, kind: str, payload: bytes, *, durable: bool = False) -> None:
        """Sign and append one record whose body is already canonical JSON.

        Raises:
            CheckpointConflict: the store refused it (fenced, or out of sequence).
        """
        async with self._lock:
            held, self._held = self._held, []
            for record in held:
                await self._append(record)
            record = self.sealer.seal_encoded_call(
                self.run_id, self.segment, self.next_seq, kind, payload, durable=durable
            )
            await self._append(record)
            self.next_seq += 1

    async def hold_encoded(self, kind: str, payload: bytes) -> None:
        """Seal and number a record now; it is stored with the next checkpoint (`save`)."""
        async with self._lock:
            self._held.append(self.sealer.seal_encoded_call(self.run_id, self.segment, self.next_seq, kind, payload))
            self.next_seq += 1

    async def save(
        self, step: int, checkpoint: SealedCheckpoint, move: LeaseMove | None = None, events: Sequence[SealedEvent] = ()
    ) -> None:
        """Store the held records and then `checkpoint`, atomically where the store can.

        `move`: the run's lease moves in the same write (the store is a `LeaseMoving` one),
        and `events` are appended to the run's stream with it (only with a `move`).

        Raises:
            CheckpointConflict: the store refused the checkpoint or a record (`RunHeld`:
                `move`'s bearer no longer holds the lease). The held records are then
                still stored on their own where they fit: a finished call's result is
                true whoever holds the run now.
        """
        async with self._lock:
            held, self._held = self._held, []
            if move is not None:
                moving = cast(LeaseMoving, self.store)
                try:
                    await moving.save_after_calls_moving(self.run_id, step, checkpoint, held, move, events)
                except CheckpointConflict:
                    await self._append_all(held)
                    raise
            elif not held:
                await self.store.save(self.run_id, step, checkpoint)
            else:
                try:
                    await self.store.save_after_calls(self.run_id, step, checkpoint, held)
                except CheckpointConflict:
                    await self._append_all(held)
                    raise

    async def _append_all(self, held: list[SealedCall]) -> None:
        """Store held records on their own after their checkpoint was refused, each where it still fits."""
        for record in held:
            with contextlib.suppress(CheckpointConflict):
                await self._append(record)

    async def flush(self) -> None:
        """Store the held records now (the run ends without another checkpoint of this writer)."""
        async with self._lock:
            held, self._held = self._held, []
            for record in held:
                await self._append(record)

    async def _append(self, record: SealedCall) -> None:
        try:
            await self.store.record_call(self.run_id, record)
        except AgentflowError:
            raise
        except Exception as exc:
            # A store failure is not the tool's failure: the run must stay recoverable,
            # so it surfaces as a CheckpointError and the runner does not mark it failed.
            raise CheckpointError(
                f"{type(self.store).__name__} could not log a {record.kind!r} record of run {self.run_id!r}: {exc}"
            ) from exc
