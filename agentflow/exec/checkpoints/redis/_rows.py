"""The row codec of `RedisCheckpointStore`: how a checkpoint or call record is one Redis value.

A row is one JSON header line and then the payload bytes exactly as given::

    checkpoint   [1, run_id, step, flow, status, segment, saved_at, kid, sig] LF payload
    call record  [1, run_id, segment, seq, kind, kid, sig] LF payload
    event        [1, run_id, kid, sig] LF payload

The first header field is the row format version (`_FORMAT`); JSON escapes every newline,
so the first LF ends the header. Reading a row checks the version, the number and type of
the header fields (`_CHECKPOINT_HEAD`, `_CALL_HEAD`) and that the row belongs to the run
asked for; anything else is `CheckpointStoreCorrupt`. This module also decodes the plain
values Redis replies with (`_text`, `_scored`), a run's call-record hash (`_calls_of`) and
its head (`_head_of`: the newest row and the per-segment counts, never fewer than the records) and
what it keeps of a run in clear beside the rows (`_bookkeeping_of`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agentflow._errors import CheckpointStoreCorrupt
from agentflow.exec.checkpoints.records import Bookkeeping, SealedCall, SealedCheckpoint, SealedEvent

#: Version written first in every row header.
_FORMAT = 1
#: Types of the row header fields.
_CHECKPOINT_HEAD = (int, str, int, str, str, int, (int, float), str, str)
_CALL_HEAD = (int, str, int, int, str, str, str)
_EVENT_HEAD = (int, str, str, str)


def _encode(fields: list[Any], payload: bytes) -> bytes:
    """Make a row: the header (JSON escapes every newline, so the first LF ends it), then the payload."""
    return json.dumps([_FORMAT, *fields], separators=(",", ":")).encode() + b"\n" + payload


def _split(run_id: str, raw: object, what: str, shape: tuple[Any, ...]) -> tuple[list[Any], bytes]:
    """Split a row into its checked header fields and its payload.

    Raises:
        CheckpointStoreCorrupt: the row is not one this store wrote.
    """
    try:
        if not isinstance(raw, bytes):
            raise TypeError(f"it is a {type(raw).__name__}, not bytes")
        head, newline, payload = raw.partition(b"\n")
        fields = json.loads(head) if newline else None
        if not isinstance(fields, list) or len(fields) != len(shape) or fields[0] != _FORMAT:
            raise ValueError(f"its header {head[:120]!r} is not a version {_FORMAT} row header")
        for value, kind in zip(fields, shape, strict=True):
            if isinstance(value, bool) or not isinstance(value, kind):
                raise ValueError(f"its header {head[:120]!r} has a field of the wrong type")
    except (TypeError, ValueError) as exc:
        raise CheckpointStoreCorrupt(f"run {run_id!r}: {what} cannot be read: {exc}") from exc
    if fields[1] != run_id:
        raise CheckpointStoreCorrupt(f"run {run_id!r}: {what} belongs to run {fields[1]!r}")
    return fields, payload


def _decode_checkpoint(run_id: str, raw: object, what: str) -> SealedCheckpoint:
    f, payload = _split(run_id, raw, what, _CHECKPOINT_HEAD)
    return SealedCheckpoint(f[1], f[2], f[3], f[4], f[5], float(f[6]), payload, f[7], f[8])


def _decode_call(run_id: str, raw: object, what: str) -> SealedCall:
    f, payload = _split(run_id, raw, what, _CALL_HEAD)
    return SealedCall(f[1], f[2], f[3], f[4], payload, f[5], f[6])


def _encode_event(run_id: str, event: SealedEvent) -> bytes:
    """An event's stream entry (field ``e``), as `_decode_event` reads it."""
    return _encode([run_id, event.kid, event.sig], event.payload)


def _decode_event(run_id: str, raw: object, what: str) -> SealedEvent:
    f, payload = _split(run_id, raw, what, _EVENT_HEAD)
    return SealedEvent(f[1], payload, f[2], f[3])


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _scored(entries: Any) -> list[tuple[str, float]]:
    """Decode a sorted-set range read with scores."""
    return [(_text(member), float(score)) for member, score in entries]


def _head_of(
    run_id: str, raw: bytes, fields: Mapping[Any, Any], stored: int
) -> tuple[SealedCheckpoint, dict[int, int]]:
    """A run's head from its newest checkpoint row, its per-segment counts hash and its record count, as stored.

    The counts hash is unsigned and one ``HSET`` sets it back; the records themselves are
    append-only (`record_call.lua`). When the run holds more records (`stored`, the calls
    hash's length) than the counts add up to, the surplus is counted in the latest
    checkpoint's segment: the head then never looks untouched since that checkpoint, so
    a handoff reads the whole log instead of trusting the counts.
    """
    try:
        counts = {int(segment): int(count) for segment, count in fields.items()}
    except ValueError:
        raise CheckpointStoreCorrupt(f"run {run_id!r}: its per-segment record counts are not numbers") from None
    row = _decode_checkpoint(run_id, raw, "the latest checkpoint")
    surplus = stored - sum(counts.values())
    if surplus > 0:
        counts[row.segment] = counts.get(row.segment, 0) + surplus
    return row, counts


def _calls_of(run_id: str, fields: Mapping[Any, Any]) -> list[SealedCall]:
    """Decode a run's call-record hash, checking each record sits under its own field."""
    found = []
    for field, raw in fields.items():
        record = _decode_call(run_id, raw, f"call record {field!r}")
        if _text(field) != f"{record.segment}:{record.seq}":
            raise CheckpointStoreCorrupt(f"run {run_id!r}: call record {field!r} holds {record.segment}.{record.seq}")
        found.append(record)
    return sorted(found, key=lambda r: (r.segment, r.seq))


def _bookkeeping_of(
    run_id: str, raw: object, listed: list[Any], counters: Mapping[Any, Any], fields: list[Any]
) -> Bookkeeping:
    """A run's bookkeeping from its newest row, its ``latest`` hash fields, its ``next`` hash and its record fields.

    Raises:
        CheckpointStoreCorrupt: the row's header, a counter or a record's field is not one this store writes.
    """
    newest = None
    if raw is not None:
        row = _decode_checkpoint(run_id, raw, "the latest checkpoint")
        newest = (row.step, row.flow, row.status)
    entry = None
    try:
        if listed[0] is not None:
            entry = (int(listed[0]), _text(listed[1]), _text(listed[2]))
        counts = {int(segment): int(count) for segment, count in counters.items()}
        stored: dict[int, int] = {}
        for field in fields:
            segment = int(_text(field).partition(":")[0])
            stored[segment] = stored.get(segment, 0) + 1
    except ValueError:
        raise CheckpointStoreCorrupt(
            f"run {run_id!r}: its latest hash, counters or record fields are not numbers"
        ) from None
    counted = {s: (counts.get(s, 0), stored.get(s, 0)) for s in sorted(counts.keys() | stored.keys())}
    return Bookkeeping(newest, entry, counted)
