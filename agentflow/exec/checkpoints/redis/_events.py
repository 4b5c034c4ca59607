"""The event streams of `RedisCheckpointStore`: one Redis Stream per run.

The stream ``P:run:{R}:events`` sits in the run's hash slot beside its other keys, so a
Cluster keeps it with them and ``delete`` and ``prune_run.lua`` remove it in the same DEL.
An append is one script (``_lua/append_events.lua``): each event an ``XADD`` whose id,
given by the server in append order, is the cursor; the stream trimmed with ``MAXLEN ~``
to about `EVENTS_KEPT`; its expiry set like the run's other keys. A read is one
``XRANGE`` from just after the cursor. Each entry is a row as `redis._rows` encodes them
(``[1, run_id, kid, sig]`` LF payload), checked when it is read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Final

from agentflow.exec.checkpoints.records import EVENTS_KEPT, SealedEvent, StoredEvent
from agentflow.exec.checkpoints.redis._rows import _decode_event, _encode_event, _text
from agentflow.exec.checkpoints.redis.clients import LoopClients

#: A stream id, the only cursor this store gives.
_STREAM_ID: Final = re.compile(r"\d+-\d+")


class RedisEvents:
    """Event streams under one prefix; `run_keys(run_id, parts)` names a run's keys (and checks the id)."""

    def __init__(self, clients: LoopClients, run_keys: Callable[..., list[str]], ttl: str) -> None:
        self._clients = clients
        self._keys = run_keys
        self._ttl = ttl

    async def append(self, run_id: str, events: Sequence[SealedEvent]) -> None:
        """Append `events` in order (one script), trimmed and expiring with the run."""
        rows = [_encode_event(run_id, e) for e in events]
        async with self._clients.use() as bound:
            keys = self._keys(run_id, ("events", "latest"))
            await bound.scripts["append_events"](keys=keys, args=[self._ttl, EVENTS_KEPT, *rows])

    async def read(self, run_id: str, after: str | None, limit: int) -> list[StoredEvent]:
        """The run's events after stream id `after`, oldest first.

        Raises:
            ValueError: `after` is not a stream id.
            CheckpointStoreCorrupt: an entry is not as the store wrote it.
        """
        if after is not None and (not isinstance(after, str) or not _STREAM_ID.fullmatch(after)):
            raise ValueError(f"{after!r} is not an event cursor of this store")
        if limit <= 0:
            return []
        key = self._keys(run_id, ("events",))[0]
        async with self._clients.use() as bound:
            entries = await bound.client.xrange(key, "-" if after is None else f"({after}", "+", count=limit)
        found = []
        for entry_id, fields in entries or ():
            cursor = _text(entry_id)
            raw = (fields or {}).get(b"e")
            found.append(StoredEvent(cursor, _decode_event(run_id, raw, f"event {cursor}")))
        return found
