"""The compare-and-set and fencing rules, written once for stores that check them in Python.

The memory and SQLite stores call these inside their critical section; Redis checks the
same rules in Lua and SQL stores in a transaction, with the same messages.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Final

from agentflow._errors import CheckpointConflict, CheckpointNotFound, RunHeld, UnstorableValue
from agentflow._run_types import RunKind
from agentflow.exec.checkpoints.records import (
    ENDED,
    FINAL,
    JudgedRow,
    JudgedRows,
    Lease,
    LeaseMove,
    SealedCall,
    SealedCheckpoint,
    SealedEvent,
)

#: The ``flow`` column prefix of the runs a trim never takes: tool loops, whose transcript is
#: spread over their checkpoints (each holds the messages of its turn), so that dropping the
#: older ones would lose messages a retry or a reader needs. They are pruned whole or kept.
UNTRIMMED_PREFIX: Final = RunKind.LOOP.column("")
#: Run ids under it are reserved (markers were once kept in the lease table under such ids); no run
#: may take an id that starts with it.
MARKER_PREFIX: Final = "agentflow/"


def check_new_run_id(run_id: str) -> None:
    """Refuse a new run's id that is empty, not text, or in the markers' reserved namespace.

    Raises:
        ValueError: the id is not a non-empty string, or starts with `MARKER_PREFIX`.
        UnstorableValue: the id holds a lone surrogate (a byte that was not UTF-8), which no store keeps.
    """
    if not isinstance(run_id, str) or not run_id:
        raise ValueError(f"run_id must be a non-empty string; got {run_id!r}")
    try:
        run_id.encode()
    except UnicodeEncodeError as exc:
        raise UnstorableValue(
            f"run id {run_id!r} holds a lone surrogate at {exc.start}, which no store keeps: use an id of valid text"
        ) from None
    if run_id.startswith(MARKER_PREFIX):
        raise ValueError(
            f"run id {run_id!r} starts with {MARKER_PREFIX!r}, which agentflow keeps for its own markers "
            "(cancel requests, quarantines, locks): choose another id"
        )


def check_row(run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
    """Refuse a checkpoint whose own run id or step disagrees with the arguments."""
    if checkpoint.run_id != run_id or checkpoint.step != step:
        raise ValueError(
            f"save({run_id!r}, {step}) was given the checkpoint of run {checkpoint.run_id!r} step {checkpoint.step}"
        )


def check_save(run_id: str, step: int, flow: str, latest: tuple[int, str, str] | None) -> None:
    """Apply the compare-and-set rule.

    Args:
        run_id: the run being saved.
        step: the step being saved.
        flow: the flow of the checkpoint being saved.
        latest: ``(step, flow, status)`` of the stored latest checkpoint, or None.

    Raises:
        CheckpointConflict: the save breaks the rule; the message says which part.
    """
    if latest is None:
        if step != 0:
            raise CheckpointConflict(f"run {run_id!r}: step {step} saved but the store has no step 0")
        return
    last_step, last_flow, last_status = latest
    if last_flow != flow:
        raise CheckpointConflict(f"run {run_id!r} belongs to flow {last_flow!r}, not {flow!r}")
    if last_status in FINAL:
        raise CheckpointConflict(f"run {run_id!r} ended ({last_status}) at step {last_step}")
    if step != last_step + 1:
        raise CheckpointConflict(
            f"run {run_id!r}: step {step} is not next (latest is {last_step}); another worker holds the run"
        )


def check_no_stored_rows(run_id: str, stored: bool) -> None:
    """Refuse a step 0 whose run id still has rows the compare-and-set did not see.

    A store decides that a run is new from the entry it reads for the compare-and-set (the
    latest hash, the ``runs`` row, the latest checkpoint row). When that entry is gone but
    checkpoint or call rows of the run are still stored (deleted by hand or by an attacker,
    or partly evicted), a step 0 would start a second run over the first one's rows. The
    store refuses it and keeps every old row; the run has to be deleted first.

    Args:
        run_id: the run being saved at step 0.
        stored: whether any checkpoint or call row of `run_id` is stored.

    Raises:
        CheckpointConflict: `stored` is true.
    """
    if stored:
        raise CheckpointConflict(
            f"run {run_id!r} already has stored rows (checkpoints or call records) but no latest entry: "
            "a step 0 would start over them; delete the run first"
        )


def check_call(run_id: str, record: SealedCall, latest: tuple[int, str, int] | None, next_seq: int) -> None:
    """Apply the numbering and fencing rules to a call record.

    Args:
        run_id: the run the record is for.
        record: the record being appended.
        latest: ``(step, status, segment)`` of the run's latest checkpoint, or None.
        next_seq: how many records the record's segment already has.

    Raises:
        CheckpointNotFound: the run has no checkpoint.
        CheckpointConflict: the record is out of sequence, fenced, or the run ended.
    """
    if record.run_id != run_id:
        raise ValueError(f"record_call({run_id!r}) was given a record of run {record.run_id!r}")
    if latest is None:
        raise CheckpointNotFound(f"run {run_id!r} has no checkpoint; a call cannot be logged before step 0")
    _, status, segment = latest
    if record.kind == "started":
        if status in ENDED:
            raise CheckpointConflict(f"run {run_id!r} ended ({status}); no call may start")
        if record.segment != segment:
            raise CheckpointConflict(
                f"run {run_id!r}: segment {record.segment} was fenced off by segment {segment}; "
                "another worker holds the run"
            )
    if record.seq != next_seq:
        raise CheckpointConflict(
            f"run {run_id!r}: call record {record.segment}.{record.seq} is out of sequence "
            f"(next is {record.segment}.{next_seq})"
        )


def check_lease_args(owner: str, token: str, ttl_s: float) -> None:
    """Refuse a lease take without an owner or token, or with a lifetime that is not positive."""
    if not owner or not token:
        raise ValueError("a lease needs a non-empty owner and token")
    if not ttl_s > 0:
        raise ValueError(f"a lease's ttl_s must be positive, not {ttl_s!r}")


def check_move_args(move: LeaseMove) -> None:
    """Refuse a `LeaseMove` whose tokens, owner or ttl are not valid lease arguments (`check_lease_args`)."""
    check_lease_args(move.owner, move.bearer, move.ttl_s)
    if move.to is not None:
        check_lease_args(move.owner, move.to, move.ttl_s)


def check_lease_move(run_id: str, move: LeaseMove, held: Lease | None) -> None:
    """`LeaseMove`'s rule, given the run's live lease `held` (None: free or lapsed).

    Raises:
        RunHeld: another token holds the lease live; the write that moves it must not happen.
        ValueError: the move's tokens, owner or ttl are not valid lease arguments.
    """
    check_move_args(move)
    if held is not None and held.token != move.bearer:
        raise RunHeld(run_id, held.owner, held.expires_at)


def check_marker_args(key: str, value: str, token: str, ttl_s: float) -> None:
    """Refuse a marker put without a key, value or token, or with a lifetime that is not positive."""
    if not key or not value or not token:
        raise ValueError("a marker needs a non-empty key, value and token")
    if not ttl_s > 0:
        raise ValueError(f"a marker's ttl_s must be positive, not {ttl_s!r}")


def check_prune_statuses(statuses: Collection[str], what: str = "a prune") -> tuple[str, ...]:
    """Return the statuses a prune (or a trim: `what`) may take, sorted; refuse any but those of a run that ended.

    Raises:
        ValueError: `statuses` is empty or names ``running``, ``paused`` or an unknown status.
        TypeError: `statuses` is one string (a collection of them is wanted).
    """
    if isinstance(statuses, str | bytes):
        raise TypeError(f"statuses must be a collection of status names, not the string {statuses!r}")
    chosen = tuple(sorted(set(statuses)))
    wrong = [status for status in chosen if status not in ENDED]
    if not chosen or wrong:
        raise ValueError(
            f"{what} takes only runs that ended ({', '.join(sorted(ENDED))}), never running or paused ones; "
            f"got {', '.join(map(repr, wrong)) or 'no status'}"
        )
    return chosen


def check_judged(judged: JudgedRows | None) -> dict[str, JudgedRow] | None:
    """Return `judged` (`JudgedRows`) as a plain dict of `JudgedRow`; refuse an entry that names no row.

    A bare ``(step, sig)`` becomes a `JudgedRow` with nothing else known (the store then reads
    the segment from the stored row, and compares no count).

    Raises:
        ValueError: an entry is not a step (a whole number, 0 or more) and a non-empty signature, or its
            segment is not a step or its counts not ``(segment, count)`` pairs of such numbers.
    """
    if judged is None:
        return None
    found: dict[str, JudgedRow] = {}
    for run_id, mark in judged.items():
        row = JudgedRow(*mark) if isinstance(mark, tuple) and 2 <= len(mark) <= 4 else None
        if row is None or not _whole(row.step) or not isinstance(row.sig, str) or not row.sig:
            raise ValueError(
                f"judged rows name each run's newest checkpoint as (step, sig); run {run_id!r} has {mark!r}"
            )
        if row.segment is not None and not _whole(row.segment):
            raise ValueError(f"the judged row of run {run_id!r} names segment {row.segment!r}, not a step")
        if row.counts is not None and not all(
            isinstance(p, tuple) and len(p) == 2 and _whole(p[0]) and _whole(p[1]) for p in row.counts
        ):
            raise ValueError(f"the judged row of run {run_id!r} counts records as {row.counts!r}, not (segment, n)")
        found[run_id] = row
    return found


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_judged(judged: JudgedRows | None, run_id: str, step: int, sig: str) -> bool:
    """Whether the run's newest checkpoint row, read in the store's atomic step, is the row that was judged.

    `step` and `sig` are read from that row itself (never from the listing index). With no
    judged rows (None) nothing was judged and the store's own rules alone decide: True.
    A run with no entry in `judged` was not judged: False.
    """
    if judged is None:
        return True
    mark = judged.get(run_id)
    return mark is not None and mark[0] == step and mark[1] == sig


#: The kinds of marker (``<kind>/<run>``) that say a run is live: while one of the run's is live, a prune
#: or trim leaves the run (a cancel request waits for the run's holder; `agentflow.exec.run.cancel`).
LIVE_MARKERS: Final = ("cancel",)


def live_marker_keys(run_id: str) -> list[str]:
    """The keys of the markers that, while live, keep a run from a prune or trim (`LIVE_MARKERS`)."""
    return [f"{kind}/{run_id}" for kind in LIVE_MARKERS]


def beyond_judged(run_id: str, mark: JudgedRow, stored_segment: int, counts: Mapping[int, int]) -> str | None:
    """What the run's call log holds beyond the judged row (the run went on after it), or None.

    Read in the store's atomic step, with `mark` the row judged (already found to be the
    newest row: `is_judged`), `stored_segment` that row's segment as stored, and `counts`
    the records each segment of the run's log holds. The run went on past the judged row
    when a segment newer than the row's holds a record (a claim opened it after the row:
    a retry whose checkpoints were rewritten away), or when the row's own segment holds more
    records than its ``log`` marker accounts for (records written after it). Earlier
    segments are not compared with the row's pins: a worker that a claim fenced may still
    store its cut-off call's late ``done`` there, which says nothing of the run going on
    (after an ended row a run goes on only through a claim, and a claim opens a newer
    segment); comparing them would keep such a run from retention for good. Only the row's
    signed segment and counts are trusted (`JudgedRow`); `stored_segment` stands in when
    the caller gave no segment.
    Redis makes the same comparison in Lua (``_lua/beyond.lua``) and words it here.
    """
    segment = stored_segment if mark.segment is None else mark.segment
    ahead = sorted(s for s, n in counts.items() if n and s > segment)
    if ahead:
        return beyond_problem(mark.step, segment, ahead[0], counts[ahead[0]], None)
    if mark.counts is None:
        return None
    accounted = dict(mark.counts)
    for s, n in sorted(counts.items()):
        if s >= segment and n > accounted.get(s, 0):
            return beyond_problem(mark.step, segment, s, n, accounted.get(s, 0))
    return None


def nothing_beyond(
    judged: Mapping[str, JudgedRow] | None,
    run_id: str,
    newest: tuple[int, str, int],
    counts: Mapping[int, int],
    live_marker: bool,
    problems: list[tuple[str, str]],
) -> bool:
    """Whether a prune or trim may take the run: nothing of it lies beyond the row judged.

    Read in the store's atomic step: `newest` is the run's newest checkpoint row's
    ``(step, sig, segment)`` as stored, `counts` the records each segment of its log holds,
    `live_marker` whether a live marker says the run is live (`live_marker_keys`). The row
    must be the one judged (`is_judged`); no live marker; and the log holds nothing the row
    does not account for (`beyond_judged`; that one is a problem, appended to `problems`).
    With `judged` None the newest row stands for the judged one (its stored segment, no counts).
    """
    step, sig, segment = newest
    if not is_judged(judged, run_id, step, sig) or live_marker:
        return False
    mark = judged[run_id] if judged is not None else JudgedRow(step, sig)
    problem = beyond_judged(run_id, mark, segment, counts)
    if problem is not None:
        problems.append((run_id, problem))
    return problem is None


def beyond_problem(step: int, segment: int, found: int, records: int, accounted: int | None) -> str:
    """Why a prune or trim left a run whose log went on past its judged row (`beyond_judged`), for `Pruned.refused`.

    `found` is the segment that holds `records` records; `accounted` what the row accounts
    for of it (None: the segment is newer than the row's `segment`).
    """
    if accounted is None:
        return (
            f"its call log holds {records} record(s) of segment {found}, opened after its newest checkpoint (step "
            f"{step}, segment {segment}): the run went on, and its later checkpoints were removed or rewritten"
        )
    return (
        f"segment {found} of its call log holds {records} record(s), its newest checkpoint (step {step}) accounts "
        f"for {accounted}: records were written after it"
    )


def trims(flow: str) -> bool:
    """Whether a trim may take a run of this ``flow`` column (a flow run: yes; a tool loop: never)."""
    return not flow.startswith(UNTRIMMED_PREFIX)


def check_events(run_id: str, events: Sequence[SealedEvent]) -> None:
    """Refuse to append another run's event to this run's stream.

    Raises:
        ValueError: an event is of another run.
    """
    for event in events:
        if event.run_id != run_id:
            raise ValueError(f"an event of run {event.run_id!r} cannot be appended to run {run_id!r}'s stream")


def int_cursor(after: str | None) -> int:
    """The number a store's integer cursor stands for (0 before the first event).

    Raises:
        ValueError: `after` is not such a cursor.
    """
    if after is None:
        return 0
    if not isinstance(after, str) or not after.isdigit():
        raise ValueError(f"{after!r} is not an event cursor of this store")
    return int(after)
