"""What writes behind a store's back erased or rewound, as far as the signed rows let it be seen.

A store writer without the checkpoint key cannot forge a row, but it can delete rows and
set back what a store keeps in clear (docs/security.md: the Redis ACL cannot refuse the
worker user ``HSET`` on a run's counters and ``latest`` hash; without that ACL, or on SQL
with a writer's grants, ``HDEL``, ``RPOP``, ``LTRIM`` and ``DELETE`` remove rows).
`agentflow.exec.run.read` already reports what the checkpoints' signed counts prove
missing (a record a checkpoint saw or a claim pinned, a gap in the numbering of records or
checkpoints, records past the newest checkpoint). This module adds, for ``agentflow verify``:

- `bookkeeping_findings`: the store's unsigned bookkeeping held against its own rows, read
  in one instant (`BookkeepingReading`): a listing entry (Redis ``latest`` hash, SQL ``runs``
  row) naming a step past the newest stored row (rows removed) or before it (set back); a
  Redis per-segment record counter below the records stored (set back) or above them
  (records erased since, the tail after the newest checkpoint included, or the counter raised).
- `_named_calls`: calls a signed checkpoint names (the results a recovery replayed, the
  calls in doubt it reran) with no record left in the segments before that checkpoint's
  claim: which calls the missing records were.

What stays invisible: the records of the newest segment written after the newest
checkpoint, erased together with a counter set back to match (or on a store that counts
rows): nothing signed has seen them. A ``started`` erased that way looks like a call that
never started, and runs again on recovery. A consistent rollback (the newest checkpoints
and every record after the one kept, with the bookkeeping set to match) looks like a crash
at the kept checkpoint.

Every read here is read-only, and a row or record that does not check is skipped (the
read model reports it): nothing is decoded before its signature checks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentflow._errors import CheckpointError, CheckpointNotFound, CheckpointStoreCorrupt
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.protocol import BookkeepingReading
from agentflow.exec.checkpoints.records import Bookkeeping
from agentflow.exec.run.view import RunReport
from agentflow.exec.seal import Sealer


async def report_erasures(store: CheckpointStore, sealer: Sealer, reports: Sequence[RunReport]) -> None:
    """Add to each report's problems what was erased or rewound in its run (what ``verify`` calls)."""
    for report in reports:
        report.problems += await erasures(store, sealer, report)


async def erasures(store: CheckpointStore, sealer: Sealer, report: RunReport) -> list[str]:
    """The erasures and rewinds found in one run beyond what its report already says.

    The calls are looked for only in a run whose report has problems already: where every
    signed count holds, no record a checkpoint names can be missing.
    """
    found: list[str] = []
    if isinstance(store, BookkeepingReading):
        try:
            book = await store.bookkeeping(report.run_id)
        except CheckpointStoreCorrupt:
            book = None  # an unreadable newest row: the read model reports it
        if book is not None:
            found += bookkeeping_findings(report.run_id, book)
    if report.problems:
        found += await _named_calls(store, sealer, report.run_id)
    return found


def bookkeeping_findings(run_id: str, book: Bookkeeping) -> list[str]:
    """What the store's unsigned bookkeeping of a run says against its rows, read with it."""
    out: list[str] = []
    newest, listed = book.newest, book.listed
    if newest is not None and listed is not None and listed != newest:
        out.append(_listing_text(run_id, newest, listed))
    for segment, (counter, stored) in (book.counted or {}).items():
        if counter < stored:
            out.append(
                f"call log of run {run_id!r}: segment {segment}'s record counter was set back to {counter}, "
                f"below the {stored} records stored (nothing is overwritten: records are append-only; "
                "a Redis HSET of the counter)"
            )
        elif counter > stored:
            out.append(
                f"call log of run {run_id!r}: {counter - stored} record(s) of segment {segment} were erased "
                f"(its record counter says {counter}, {stored} are stored: a Redis HDEL, or the counter was raised)"
            )
    return out


def _listing_text(run_id: str, newest: tuple[int, str, str], listed: tuple[int, str, str]) -> str:
    """Say how the run's listing entry and its newest stored row disagree."""
    (step, flow, status), (at, named_flow, named_status) = newest, listed
    said = f"the store's listing entry of run {run_id!r} names checkpoint {at} ({named_status})"
    if at > step:
        return (
            f"checkpoint rows of run {run_id!r} were removed: {said}, but the newest stored row is step {step} "
            f"({status}) (a Redis RPOP or LTRIM, a SQL DELETE)"
        )
    if at < step:
        return f"{said}, set back from the newest stored row, step {step} ({status})"
    return f"{said} of flow {named_flow!r}, rewritten: the row says {status!r} of flow {flow!r}"


async def _named_calls(store: CheckpointStore, sealer: Sealer, run_id: str) -> list[str]:
    """Calls that a checked checkpoint names and that have no checked record before its segment."""
    try:
        rows = list(await store.history(run_id))
        calls = list(await store.calls(run_id))
    except (CheckpointNotFound, CheckpointStoreCorrupt):
        return []  # gone meanwhile, or a row the store cannot decode (the read model reports it)
    seen: dict[str, list[int]] = {}
    for record in calls:
        try:
            opened = sealer.open_call(record, run_id)
        except CheckpointError:
            continue
        seen.setdefault(str(opened.get("call_id")), []).append(record.segment)
    out: list[str] = []
    for row in rows:
        try:
            body = sealer.open_checkpoint(row, run_id)
            named = _named(body)
        except CheckpointError:
            continue
        for call_id, what in named:
            if not any(segment < row.segment for segment in seen.get(call_id, [])):
                out.append(
                    f"call {call_id!r} of run {run_id!r}: checkpoint {row.step} {what}, but no record of it is "
                    f"stored before segment {row.segment}: its records were erased"
                )
    return out


def _named(body: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The calls a checked checkpoint body names as logged before its segment, each with what it says of it."""
    named: list[tuple[str, str]] = []
    recovered = body.get("recovered")
    if isinstance(recovered, Mapping):
        for key, what in (("replayed", "replayed its result"), ("rerun", "reran it as a call in doubt")):
            ids = recovered.get(key, [])
            named += [(str(cid), what) for cid in ids] if isinstance(ids, list) else []
    return named
