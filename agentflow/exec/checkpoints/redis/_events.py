"""The event streams of `RedisCheckpointStore`: one Redis Stream per run.

The stream ``P:run:{R}:events`` sits in the run's hash slot beside its other keys, so a
Cluster keeps it with them and ``delete`` and ``prune_run.lua`` remove it in the same DEL.
An append is one script (``_lua/append_events.lua``): each event an ``XADD`` whose id,
given by the server in append order, is the cursor; the stream trimmed with ``MAXLEN ~``
to about `EVENTS_KEPT`; its expiry set like the run's other keys. A read is one script
(``_lua/read_events.lua``: the packed rows, below, and an ``XRANGE`` from just after the
cursor). Each entry is a row as `redis._rows` encodes them (``[1, run_id, kid, sig]`` LF
payload), checked when it is read.

Packing (`RedisEvents.compact`, the store's ``compact_events``): once a run has ended, its
stream's rows are packed into the run's ``packed`` key (a string: each row with its own id,
framed and compressed, `_pack`) and the stream is emptied (``_lua/compact_events.lua``; an
emptied stream keeps the last id it gave, so later appends come after every packed row).
A read takes both at one instant (``_lua/read_events.lua``), unpacks (`_unpack`) and hands
back the rows after the cursor with the ids they had: every cursor given before reads on
from the same place, and each row is checked by its own signature as before (the packing
adds no signature, and needs none).

A packed value is bounded before it is decoded: read_events.lua sends the length of one
over `PACKED_MAX` bytes instead of it, the inflating stops at `UNPACKED_MAX` bytes and the
rows at `PACKED_ROWS_MAX`, and any of these is `CheckpointStoreCorrupt` (a forged 8 MiB
value costs a read of its length, not seconds of CPU); a stream that would pack into more
is left as it is. What it saves: a stream's entries cost about 0.8 KiB
each in Redis (a stream's first node alone takes 4 KiB), rows packed together repeat
their keys cheaply; a finished 10-superstep run's events go from 9.6 KiB to 2.3 KiB. A
stream longer than `COMPACT_UP_TO` entries is not packed. The packed key takes the
stream's expiry when it is packed; a run that goes on after it ended (a retry) refreshes
its other keys' expiry as it saves, and its packed key's again when it ends and is packed
once more (until then, the packed events may expire first: read as a stream trimmed at its
start).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Final, cast

from agentflow._errors import CheckpointStoreCorrupt
from agentflow.exec.checkpoints.records import EVENTS_KEPT, SealedEvent, StoredEvent
from agentflow.exec.checkpoints.redis._rows import _decode_event, _encode_event, _text
from agentflow.exec.checkpoints.redis.clients import LoopClients

#: A stream id, the only cursor this store gives.
_STREAM_ID: Final = re.compile(r"\d+-\d+")
#: The longest stream (in entries) that is packed.
COMPACT_UP_TO: Final = 1_000
#: The longest packed value read (bytes, compressed): a longer one is not sent, nor inflated.
PACKED_MAX: Final = 2 * 1024 * 1024
#: The most a packed value may inflate to (bytes): decompression stops there.
UNPACKED_MAX: Final = 8 * 1024 * 1024
#: The most rows a packed value holds (a stream is packed whole again after a retry).
PACKED_ROWS_MAX: Final = 2 * COMPACT_UP_TO
#: What a packed value's inflated bytes start with (the format's version).
_PACKED: Final = b"af-events-1\n"


def _order(cursor: str) -> tuple[int, int]:
    """A stream id as the pair Redis orders ids by."""
    ms, _, seq = cursor.partition("-")
    return int(ms), int(seq)


def _pack(entries: Sequence[tuple[str, bytes]]) -> bytes:
    """Rows and their ids as one packed value: ``<id> <length>`` LF row, for each, compressed."""
    return zlib.compress(_PACKED + b"".join(b"%s %d\n%s" % (i.encode(), len(row), row) for i, row in entries), 6)


def _inflated(rows: Sequence[tuple[str, bytes]]) -> int:
    """How long the packed value of `rows` is once inflated (bytes), as `_pack` frames them."""
    return len(_PACKED) + sum(len(i) + len(str(len(row))) + 2 + len(row) for i, row in rows)


def _unpack(run_id: str, packed: object) -> list[tuple[str, bytes]]:
    """The rows and ids of a run's packed value, each id after the one before.

    Raises:
        CheckpointStoreCorrupt: it is not a packed value this store wrote.
    """
    try:
        if type(packed) is int:  # read_events.lua sent its length instead: too long to be ours
            raise ValueError(f"it is {packed} bytes long, over the {PACKED_MAX} this store writes; delete the key")
        if not isinstance(packed, bytes):
            raise TypeError(f"it is a {type(packed).__name__}, not bytes")
        if len(packed) > PACKED_MAX:
            raise ValueError(f"it is {len(packed)} bytes long, over the {PACKED_MAX} this store writes")
        inflater = zlib.decompressobj()
        data = inflater.decompress(packed, UNPACKED_MAX)  # stops at UNPACKED_MAX bytes, whatever the input
        if inflater.unconsumed_tail or not inflater.eof:
            raise ValueError(f"it does not inflate to a whole value within {UNPACKED_MAX} bytes")
        if not data.startswith(_PACKED):
            raise ValueError("it is not version 1 of packed events")
        rows: list[tuple[str, bytes]] = []
        at, previous = len(_PACKED), (-1, -1)
        while at < len(data):
            head, newline, _ = data[at : at + 64].partition(b"\n")
            entry, _, length = head.decode("ascii").partition(" ")
            if not newline or not _STREAM_ID.fullmatch(entry) or not length.isdigit():
                raise ValueError(f"its row at byte {at} has no '<id> <length>' line")
            start = at + len(head) + 1
            at = start + int(length)
            if at > len(data) or _order(entry) <= previous:
                raise ValueError(f"its row {entry} is cut short or out of order")
            if len(rows) == PACKED_ROWS_MAX:
                raise ValueError(f"it holds more than {PACKED_ROWS_MAX} rows")
            previous = _order(entry)
            rows.append((entry, data[start:at]))
    except (TypeError, ValueError, UnicodeDecodeError, zlib.error) as exc:
        raise CheckpointStoreCorrupt(f"run {run_id!r}: its packed events cannot be read: {exc}") from exc
    return rows


def _rows_of(run_id: str, packed: object, entries: Any) -> list[tuple[str, object]]:
    """The packed rows, then the stream's entries, with their ids (the rows not yet checked).

    Raises:
        CheckpointStoreCorrupt: the packed value cannot be read, or an entry of the stream is
            not after every packed row (the two would not read as one stream).
    """
    rows: list[tuple[str, object]] = list(_unpack(run_id, packed)) if packed else []
    for entry_id, fields in entries or ():  # as a script replies: [id, [field, value, ...]]
        cursor = _text(entry_id)
        if rows and _order(cursor) <= _order(rows[-1][0]):
            raise CheckpointStoreCorrupt(f"run {run_id!r}: event {cursor} of its stream is not after its packed events")
        values = dict(zip(fields[::2], fields[1::2], strict=False)) if isinstance(fields, list) else {}
        rows.append((cursor, values.get(b"e")))
    return rows


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
        keys = self._keys(run_id, ("events", "packed"))
        async with self._clients.use() as bound:
            packed, entries = await bound.scripts["read_events"](
                keys=keys, args=["-" if after is None else f"({after}", limit, PACKED_MAX]
            )
        rows = _rows_of(run_id, packed, entries)
        if after is not None:  # the packed rows are read whole
            rows = [(cursor, raw) for cursor, raw in rows if _order(cursor) > _order(after)]
        return [StoredEvent(cursor, _decode_event(run_id, raw, f"event {cursor}")) for cursor, raw in rows[:limit]]

    async def compact(self, run_id: str) -> bool:
        """Pack the run's stream into its packed key, unless either changed meanwhile (see the module notes).

        Raises:
            CheckpointStoreCorrupt: a row is not one this store wrote (nothing is changed).
        """
        keys = self._keys(run_id, ("events", "packed"))
        async with self._clients.use() as bound:
            packed, entries = await bound.scripts["read_events"](keys=keys, args=["-", COMPACT_UP_TO + 1, PACKED_MAX])
            if not entries or len(entries) > COMPACT_UP_TO:
                return False
            rows: list[tuple[str, bytes]] = []
            for cursor, raw in _rows_of(run_id, packed, entries):  # only rows this store could have written
                _decode_event(run_id, raw, f"event {cursor}")
                rows.append((cursor, cast(bytes, raw)))
            value = _pack(rows)
            if len(rows) > PACKED_ROWS_MAX or len(value) > PACKED_MAX or _inflated(rows) > UNPACKED_MAX:
                return False  # more than a reader takes: the stream stays as it is
            first, last = _text(entries[0][0]), _text(entries[-1][0])
            args: list[int | str | bytes] = [len(entries), first, last, len(packed or b""), value]
            done = await bound.scripts["compact_events"](keys=keys, args=args)
        return bool(done)
