"""The checks a reader makes of a run's call log against its latest checkpoint: one set for all.

Recovery, resume, a distributed worker's handoff (`advance`) and ``agentflow verify`` all
read a run through `check_records` (the whole log was read) or `check_counts` (only the
store's per-segment counts were read). verify checks more (every older checkpoint too),
never less.

What a checkpoint proves about the log (every item is signed into the checkpoint body):
- ``log: [segment, count]``: the writer's own segment held `count` records when it saved.
- ``pins: [[segment, count], ...]``: the claim that opened the writer's segment read the
  whole log first and pinned the count of every earlier segment that had records. Later
  checkpoints of the segment carry the same pins, and the next claim pins afresh.

So a missing, reordered or replaced record anywhere before the latest checkpoint is
`CheckpointStoreCorrupt`: the numbering catches a gap or a swap, the signature (bound to
run, segment and position) catches a replacement, and the marker and the pins catch a cut
tail. What no checkpoint can pin is the tail written after the latest one: deleting its
last records makes the calls they closed look in doubt (a ``started`` with no end); only
deleting a call's ``started`` too makes it look never started. docs/security.md says what
that leaves an attacker with write access to the store. That tail is also what
`cut_off_spans` reads: the spans of the superstep a dead worker left unfinished, which a
recovery links to.

A claim trusts its read of the log only once its own checkpoint has fenced every earlier
segment: `check_read_whole` compares that read with the counts after the claim.

A record that belongs past the latest checkpoint (a later superstep, or a segment opened
by a claim at a later step) proves that checkpoints were removed, unless another worker
saved them after this reader read the checkpoint: `AheadOfCheckpoint` lets the caller tell
the two apart by reading the latest step again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentflow._errors import CheckpointConflict, CheckpointStoreCorrupt
from agentflow.exec.calls.read import LoggedRecord
from agentflow.exec.checkpoints import CheckpointStore, SealedCheckpoint
from agentflow.exec.seal import Sealer


class AheadOfCheckpoint(CheckpointStoreCorrupt):
    """Raised when the log holds records past the checkpoint read: removed checkpoints, or a race."""


async def checked_latest(
    store: CheckpointStore, sealer: Sealer, run_id: str
) -> tuple[SealedCheckpoint, dict[str, Any]]:
    """The run's newest checkpoint and its body: the one read of a run's head outside the protocol.

    Its columns (flow, status, step) are trusted only once the row checks, so a caller that picks
    what to do by them reads the head here.

    Raises:
        CheckpointNotFound: unknown run.
        CheckpointStoreCorrupt: the row fails its check.
    """
    row = await store.latest(run_id)
    return row, sealer.open_checkpoint(row, run_id)


def counts_of(records: Sequence[LoggedRecord]) -> dict[int, int]:
    """How many records each segment holds."""
    counts: dict[int, int] = {}
    for rec in records:
        counts[rec.segment] = counts.get(rec.segment, 0) + 1
    return counts


def marker_of(body: Mapping[str, Any]) -> tuple[int, int] | None:
    """The checkpoint's ``log`` marker: its writer's segment and that segment's record count."""
    mark = body.get("log")
    if mark is None:
        return None
    if not (isinstance(mark, list) and len(mark) == 2 and all(type(v) is int for v in mark)):
        raise CheckpointStoreCorrupt(f"a checkpoint's log marker is malformed: {mark!r}")
    return mark[0], mark[1]


def cut_off_spans(body: Mapping[str, Any], records: Sequence[LoggedRecord]) -> tuple[str, ...]:
    """The span ids the ``started`` records logged after the checkpoint `body` carry (a dead worker's superstep)."""
    mark = marker_of(body)
    if mark is None:
        return ()
    segment, count = mark
    spans = {
        str(rec.body["span"])
        for rec in records
        if rec.kind == "started"
        and "span" in rec.body
        and (rec.segment > segment or (rec.segment == segment and rec.seq >= count))
    }
    return tuple(sorted(spans))


def pins_of(body: Mapping[str, Any]) -> dict[int, int]:
    """The record counts of earlier segments that the checkpoint's segment claim pinned."""
    raw = body.get("pins", [])
    if not isinstance(raw, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(type(v) is int for v in p) for p in raw
    ):
        raise CheckpointStoreCorrupt(f"a checkpoint's pinned record counts are malformed: {raw!r}")
    return {int(s): int(n) for s, n in raw}


def encode_pins(pins: Mapping[int, int]) -> list[list[int]]:
    """The pins as a checkpoint body stores them (JSON keys cannot be integers)."""
    return [[s, n] for s, n in sorted(pins.items())]


def pins_for(counts: Mapping[int, int], claim_step: int) -> dict[int, int]:
    """What a claim at `claim_step` pins: the count of every earlier segment that has records."""
    return {s: n for s, n in counts.items() if n and s < claim_step}


def check_held(run_id: str, step: int, body: Mapping[str, Any], counts: Mapping[int, int]) -> None:
    """Refuse a log that lost records the checkpoint at `step` saw or pinned."""
    wanted = dict(pins_of(body))
    mark = marker_of(body)
    if mark is not None:
        wanted[mark[0]] = max(wanted.get(mark[0], 0), mark[1])
    for segment, count in sorted(wanted.items()):
        have = counts.get(segment, 0)
        if have < count:
            raise CheckpointStoreCorrupt(
                f"call log of run {run_id!r}: segment {segment} has {have} records, checkpoint {step} saw {count} "
                "(records were removed)"
            )


def _check_segments(run_id: str, step: int, segments: Sequence[int]) -> None:
    """Refuse records in a segment opened by a claim at a step past the checkpoint read."""
    ahead = [s for s in segments if s > step]
    if ahead:
        raise AheadOfCheckpoint(
            f"call log of run {run_id!r} has records of segment {min(ahead)}, opened at a step past the latest "
            f"checkpoint {step}: checkpoints are missing"
        )


def check_records(
    run_id: str,
    step: int,
    body: Mapping[str, Any],
    records: Sequence[LoggedRecord],
    superstep: int,
    *,
    model_ahead: int = 0,
) -> dict[int, int]:
    """Check a run's whole log (signatures and numbering already checked) against its latest checkpoint.

    Args:
        run_id: the run.
        step: the latest checkpoint's step.
        body: its checked body.
        records: every record of the run, checked and in order (`read_log`).
        superstep: the checkpoint's superstep (a tool loop's turn).
        model_ahead: how far ahead a tool loop's model-call marker is logged (1), else 0.

    Returns:
        The record count of each segment.

    Raises:
        CheckpointStoreCorrupt: records the checkpoint saw or pinned are missing.
        AheadOfCheckpoint: records belong past the checkpoint (removed checkpoints, or a race).
    """
    counts = counts_of(records)
    check_held(run_id, step, body, counts)
    _check_segments(run_id, step, list(counts))
    for rec in records:
        at = rec.body.get("superstep")
        limit = superstep + (model_ahead if rec.body.get("model") else 0)
        if isinstance(at, int) and at > limit:
            raise AheadOfCheckpoint(
                f"call record {rec.segment}.{rec.seq} of run {run_id!r} belongs to superstep {at}, past the "
                f"latest checkpoint's {superstep}: checkpoints are missing"
            )
    return counts


def check_counts(run_id: str, step: int, body: Mapping[str, Any], counts: Mapping[int, int]) -> None:
    """The checks `check_records` makes that per-segment counts alone allow (a handoff's fast path).

    Raises:
        CheckpointStoreCorrupt: records the checkpoint saw or pinned are missing.
        AheadOfCheckpoint: a segment opened past the checkpoint has records.
    """
    check_held(run_id, step, body, counts)
    _check_segments(run_id, step, [s for s, n in counts.items() if n])


def untouched(body: Mapping[str, Any], counts: Mapping[int, int]) -> int | None:
    """The writer's next record number if nothing was logged since the checkpoint, else None.

    When the checkpoint's segment holds exactly the marker's count and no later segment has
    a record, no worker wrote since that checkpoint: the next step may continue the segment
    without a claim, numbering from that count (the numbering then fences on its own).
    """
    mark = marker_of(body)
    if mark is None:
        return None
    segment, count = mark
    if counts.get(segment, 0) != count or any(s > segment and n for s, n in counts.items()):
        return None
    return count


def check_still_paused(run_id: str, body: Mapping[str, Any], counts: Mapping[int, int]) -> None:
    """Refuse a resume when records follow the paused checkpoint: another resume won meanwhile.

    A paused run logs nothing until a resume has stored its decision with a claim, so such
    records are the winner's calls; read as this resume's, they would look in doubt.

    Raises:
        CheckpointConflict: something was logged since the paused checkpoint.
    """
    if untouched(body, counts) is None:
        raise CheckpointConflict(
            f"run {run_id!r} was resumed by another worker meanwhile (it logged calls after the paused checkpoint)"
        )


def check_read_whole(
    run_id: str, claim_step: int, read: Mapping[int, int], now: Mapping[int, int], opened: int = 0
) -> None:
    """Refuse to act on a claim's read of the log when the log took records since (`now`: after the claim).

    `read` counts the records of the whole log as read; `opened` is how many the claim
    stored in its own segment. Either an earlier segment holds more records now, or the log
    as a whole does: a Redis store whose per-segment counter was set back counts the records
    it cannot place in the newest checkpoint's segment, which after the claim is the claim's
    own, so only the total shows them.

    Raises:
        CheckpointConflict: the worker that held the run before logged while the claimer read.
    """
    grown = sorted(s for s, n in now.items() if s < claim_step and n > read.get(s, 0))
    late = sum(now.values()) - sum(read.values()) - opened
    if not grown and late > 0:
        raise CheckpointConflict(
            f"run {run_id!r}: the log took {late} record(s) while this worker read it before claiming step "
            f"{claim_step} (the worker that held it before was still writing, and a record counter was set back). "
            "The claim is stored, with what it carries, and fenced that worker; nothing ran on the stale read: "
            "recover the run again to read the late records"
        )
    if grown:
        raise CheckpointConflict(
            f"run {run_id!r}: segment {grown[0]} took {now[grown[0]] - read.get(grown[0], 0)} more "
            f"record(s) while this worker read the log before claiming step {claim_step} (the worker that "
            "held it before was still writing). The claim is stored, with what it carries, and fenced that "
            "worker; nothing ran on the stale read: recover the run again to read the late records"
        )
