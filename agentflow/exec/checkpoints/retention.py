"""Retention: how long finished runs are kept whole, when they keep only their newest checkpoint, and the batches.

Two things may happen to a run that ended (``done``, ``failed``, ``cancelled``, or some of
them), never to a running or paused one, however old; a `RetentionPolicy` says when:

- **Prune** (``keep_s``): that long after its last save the run is deleted whole, with its
  checkpoints, call records, lease, listing entries and events.
- **Trim** (``trim_after_s``): that long after its last save every checkpoint of the run
  but the newest is deleted. The newest checkpoint, the call records, the lease, the
  listing entries and the events stay. A policy may do both (trim after a day, prune after
  30: ``trim_after_s < keep_s``), or either alone.

The design of a trim:

- What stays is what every reader of a run's *latest* state reads: the newest checkpoint
  (`latest`, `head`) and the call log. So listings, ``runs show``, resume, the viewer, the
  event stream and a retry of a failed run work as before: a retry claims from the newest
  checkpoint and replays the finished calls from the call records, so nothing runs twice.
  What goes is the run's past states: its history starts at the kept step, and a fork from
  an older step is refused, naming the retention (`agentflow.exec.run.trim`).
- A run is trimmed in one atomic step (one transaction or script), judged again as it goes
  (a run retried, resumed or held by a live lease since it was listed is left), so a trim
  cut off midway leaves each run trimmed or untouched. Only the rows before the newest go.
- Tool loops are never trimmed (`rules.trims`): their transcript is spread over their
  checkpoints. They are pruned whole or kept.
- Readers accept a history that starts at a step k > 0 only when checkpoint k ended the
  run (its signed status), which is where a trim cuts: ``agentflow verify`` says the run
  was trimmed by retention rather than report the older checkpoints missing; any other gap
  is still a problem. A trim cannot be told from someone with write access to the store
  deleting the same rows: what verify proves of a trimmed run is the kept checkpoints and
  the whole call log (which the kept checkpoint pins), not the past states. That never
  makes a finished call run again: resume and retry read only the newest checkpoint and
  the call records, which a trim keeps.
- The store port has no way to delete one checkpoint, so there is no generic trim: a store
  without `TrimStore` is refused with `NotImplementedError` (`_defaults.no_trim`).

Who judges a run: its **signed** newest checkpoint. A store's listing and its atomic
re-check read the fields it keeps in clear (a Redis run's ``latest`` hash, a SQL ``runs``
row, a checkpoint row's status and saved_at columns), which anyone with write access can
set: ``status=done`` and an old ``saved_at`` on a paused run would have it deleted. So
`prune_finished`, `trim_finished` and the ``agentflow runs prune`` command take a
`RowCheck` (the key ring's: `Sealer`'s check of a checkpoint row) and prune or trim only
the listed runs whose newest row checks and itself says it ended, in the statuses asked,
before the cut-off (`judged_rows`); a run whose newest row does not check is left and
reported (`Pruned.refused`).

The judgement is pinned into the store's atomic step: what was judged, each run's newest
row as ``(step, sig)`` (`JudgedRows`), goes with the prune or trim (``judged=``), and the
store deletes a run only while its newest checkpoint row, read from the rows themselves
in that same step, is still that row. A save landing between the judgement and the delete
(a failed run retried: its claim is a new row) keeps the run, however its clear fields
were set meanwhile. Rows are append-only and each carries its signature, so a writer
without the key cannot make a row other than the judged one the newest, with the judged
row's signature, without rewriting or deleting stored rows (which no signature can stop).
The row judged must also be the last thing of the run: inside that same atomic step the
store leaves a run while anything lies beyond the row (`rules.nothing_beyond`). What a
store can compare without the key, and so the rule as it stands:

- the row's fields in clear, which the signature covers and the caller passes on from the
  checked row (`JudgedRow`: step, sig, segment): a call record in a segment newer than the
  row's segment was written under a claim made after the row (a retry), so the run went on;
- the record count of its own segment the row accounts for, which is in its body, not in
  clear: the caller, who checked the row, reads it (`accounted`: its ``log`` marker, the
  writer's own segment as it saved) and passes it (`JudgedRow.counts`); more records than
  that in the row's segment were written after the row. Earlier segments are not compared: a
  fenced worker's late ``done`` may land there, and says nothing of the run going on. A row
  whose body has no ``log`` marker gives no counts, and segments alone are compared;
- the run's markers that say it is live (a cancel request, `rules.LIVE_MARKERS`), beside
  its lease.

A run left because its log went on is a problem, not a race (a retry's first write is its
claim, a new row, which the step comparison sees first): the store returns it with why
(`Pruned.refused`, `Trimmed.refused`), and `prune_finished`, `trim_finished`, the
``agentflow runs prune`` command and the workers' tick name it. So a retry whose rows were
moved aside without a delete (SQL: an ``UPDATE`` setting their steps back and one pointing
the ``runs`` row at the failed row; Redis: ``RPOP``, ``HSET`` of the latest hash, ``ZADD``
of the index) keeps its run and its ``started`` record in doubt. What no rule can stop is
a writer deleting the later records too: that is erasure (docs/security.md).

A store whose ``prune`` takes no ``judged`` (written before it was part of the port) is
pruned by the generic prune instead when rows are judged, which compares them itself under
the run's lease; such a store's ``trim`` is refused (`NotImplementedError`).

The functions:

- `prunable` and `prune`, `trimmable` and `trim`: the store's own (`RetentionStore`,
  `TrimStore`: batched, atomic per run) when it has them; else the generic prune built on
  the rest of the port (`_defaults`), so a store wrapped by something that forwards only
  `CheckpointStore` is pruned all the same (and refused a trim).
- `prune_finished` and `trim_finished`: batch after batch, each listed and then pruned or
  trimmed, until nothing is left to do or `max_batches` is reached (the beat's bound per
  tick). A trim pages on with a cursor (the newest save time listed so far), so a batch
  never walks again past the runs the earlier ones trimmed.
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final

from agentflow._errors import CheckpointNotFound, CheckpointStoreCorrupt
from agentflow.exec.checkpoints._defaults import default_prunable, default_prune, default_trim, default_trimmable
from agentflow.exec.checkpoints.protocol import CheckpointStore, RetentionStore, TrimStore
from agentflow.exec.checkpoints.records import (
    ENDED,
    JudgedRow,
    JudgedRows,
    Pruned,
    SealedCheckpoint,
    Trimmed,
    judged_row,
)
from agentflow.exec.checkpoints.rules import check_prune_statuses

#: Runs per batch when nobody says otherwise.
DEFAULT_BATCH: Final = 500
#: One day, in seconds.
DAY_S: Final = 86_400.0


def _seconds(name: str, value: float | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0):
        raise ValueError(f"{name} must be a number of seconds, zero or more, or None; got {value!r}")


@dataclass(frozen=True)
class RetentionPolicy:
    """What a store keeps of the runs that ended: whole runs for `keep_s`, every checkpoint for `trim_after_s`."""

    keep_s: float | None
    """A finished run is kept this long after its last save (seconds), then pruned whole (None: never pruned)."""
    statuses: frozenset[str] = ENDED
    """Which finished runs: some of ``done``, ``failed``, ``cancelled`` (never running or paused)."""
    batch: int = DEFAULT_BATCH
    """Runs listed and deleted or trimmed per batch (one transaction, or one pipeline of scripts)."""
    trim_after_s: float | None = None
    """A finished run keeps only its newest checkpoint this long after its last save (None: it keeps them all).

    Its call records, lease, listing entries and events stay, so it still reads, lists and
    retries as before; its older checkpoints (its past states) are deleted. Shorter than
    `keep_s` when both are set. Tool loops are never trimmed.
    """

    def __post_init__(self) -> None:
        _seconds("keep_s", self.keep_s)
        _seconds("trim_after_s", self.trim_after_s)
        if self.keep_s is None and self.trim_after_s is None:
            raise ValueError(
                "a retention policy needs keep_s (prune finished runs whole), trim_after_s (keep only their "
                "newest checkpoint), or both; with neither it would keep everything"
            )
        if self.keep_s is not None and self.trim_after_s is not None and not self.trim_after_s < self.keep_s:
            raise ValueError(
                f"trim_after_s ({self.trim_after_s!r} s) must be shorter than keep_s ({self.keep_s!r} s): "
                "a run is pruned whole before it would be trimmed"
            )
        object.__setattr__(self, "statuses", frozenset(check_prune_statuses(self.statuses, "a retention policy")))
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"batch must be a whole number of runs, 1 or more; got {self.batch!r}")

    @classmethod
    def days(
        cls,
        days: float | None,
        statuses: Collection[str] = ENDED,
        batch: int = DEFAULT_BATCH,
        *,
        trim_after_days: float | None = None,
    ) -> RetentionPolicy:
        """Keep finished runs whole for `days` days (None: for ever), every checkpoint for `trim_after_days`."""
        keep = None if days is None else days * DAY_S
        trim = None if trim_after_days is None else trim_after_days * DAY_S
        return cls(keep, frozenset(statuses), batch, trim)

    def cut_off(self, now: float | None = None) -> float:
        """The time before which a finished run's last save makes it prunable.

        Raises:
            ValueError: the policy prunes no run (`keep_s` is None).
        """
        if self.keep_s is None:
            raise ValueError("this retention policy prunes no run (keep_s is None)")
        return (time.time() if now is None else now) - self.keep_s

    def trim_cut_off(self, now: float | None = None) -> float:
        """The time before which a finished run's last save makes it trimmable.

        Raises:
            ValueError: the policy trims no run (`trim_after_s` is None).
        """
        if self.trim_after_s is None:
            raise ValueError("this retention policy trims no run (trim_after_s is None)")
        return (time.time() if now is None else now) - self.trim_after_s


def pruner(name: str = "prune") -> str:
    """The lease owner a prune in this process holds runs as: ``<name>@<host>:<pid>``."""
    return f"{name}@{socket.gethostname()}:{os.getpid()}"


#: What is wrong with a run's newest checkpoint row (its signature, above all), or None when it checks.
RowCheck = Callable[[SealedCheckpoint], str | None]


def _check_for(store: CheckpointStore, check: RowCheck | None) -> RowCheck:
    """`check`, or the in-process store's own key's.

    Raises:
        ValueError: no `check` for a store shared with other processes (its listing is unsigned).
    """
    if check is not None:
        return check
    if store.in_process and store.local_key is not None:
        from agentflow.exec.seal import Sealer  # the seal reads this package's records: imported late

        return Sealer(store.local_key).checkpoint_problem
    raise ValueError(
        f"{type(store).__name__} is shared with other processes: its listing is unsigned, so prune and trim judge "
        "each run by its signed newest checkpoint. Pass check=Sealer(checkpoint_key).checkpoint_problem"
    )


async def judged_rows(
    store: CheckpointStore, run_ids: Sequence[str], before: float, statuses: Collection[str], check: RowCheck
) -> tuple[dict[str, JudgedRow], dict[str, str]]:
    """Of `run_ids`, those whose newest checkpoint checks and says it ended in `statuses` before `before`.

    Returns:
        The runs to prune or trim, in order, each with the row judged (`JudgedRows`: its
        step and signature, what `prune` and `trim` take as ``judged``); and the runs whose
        newest row did not check (or could not be read), with why. A run deleted meanwhile
        is in neither.
    """
    kept: dict[str, JudgedRow] = {}
    refused: dict[str, str] = {}
    for run_id in run_ids:
        try:
            row = await store.latest(run_id)
        except CheckpointNotFound:
            continue
        except CheckpointStoreCorrupt as exc:
            refused[run_id] = str(exc)
            continue
        problem = check(row)
        if problem is not None:
            refused[run_id] = problem
        elif row.status in statuses and row.saved_at < before:  # fields the signature covers
            kept[run_id] = judged_row(row, accounted(row))
    return kept, refused


def accounted(row: SealedCheckpoint) -> dict[int, int] | None:
    """The records of its own segment a checked checkpoint row accounts for, from its body; None: it names none.

    Call it only on a row whose signature checked (its body is decoded here). The body's
    ``log`` marker ``[segment, count]`` is the writer's own segment as it saved (written by
    `agentflow.exec.run.steps`, checked by `agentflow.exec.run.checks`); earlier segments
    are not compared (`rules.beyond_judged` says why). A body without a ``log`` marker (a
    row not written by a run: no journal) gives None, and the store then compares segments
    only. A malformed marker gives {}: nothing is accounted for, so any record of the row's
    segment keeps the run (and is reported).
    """
    try:
        body = json.loads(row.payload)
    except ValueError:
        return None
    mark = body.get("log") if isinstance(body, dict) else None
    if mark is None:
        return None
    if not (isinstance(mark, list) and len(mark) == 2 and all(type(v) is int and v >= 0 for v in mark)):
        return {}
    segment, count = mark
    return {segment: count}


async def judged(
    store: CheckpointStore, run_ids: Sequence[str], before: float, statuses: Collection[str], check: RowCheck
) -> tuple[list[str], dict[str, str]]:
    """`judged_rows` without the rows: the run ids alone, in order, and the refused runs with why.

    A caller that prunes or trims what it judged should use `judged_rows` and pass the rows
    on (``judged=``): with ids alone, a save landing after the judgement is judged by the
    store's clear fields only.
    """
    kept, refused = await judged_rows(store, run_ids, before, statuses, check)
    return list(kept), refused


def _takes_judged(method: Callable[..., object]) -> bool:
    """Whether a store's ``prune`` or ``trim`` takes ``judged`` (one written before it joined the port does not)."""
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):  # no signature to read: pass it, and let the store say
        return True
    return "judged" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


async def prunable(store: CheckpointStore, before: float, statuses: Collection[str], limit: int) -> list[str]:
    """The runs a prune would take now, oldest first (the store's own listing, or the generic one)."""
    if isinstance(store, RetentionStore):
        return list(await store.prunable(before, statuses, limit))
    return await default_prunable(store, before, statuses, limit)


async def prune(
    store: CheckpointStore,
    run_ids: Sequence[str],
    before: float,
    statuses: Collection[str],
    owner: str,
    judged: JudgedRows | None = None,
) -> Pruned:
    """Delete each run of `run_ids` that still qualifies, whole (the store's own prune, or the generic one).

    With `judged` (from `judged_rows`), a run goes only while its newest row is the one
    judged (see `RetentionStore.prune`); a store whose own prune cannot be told the rows
    is pruned by the generic prune then, which compares them itself.
    """
    if not run_ids:
        return Pruned((), 0)
    if isinstance(store, RetentionStore):
        if judged is None:
            return await store.prune(run_ids, before, statuses, owner)
        if _takes_judged(store.prune):
            return await store.prune(run_ids, before, statuses, owner, judged=judged)
    return await default_prune(store, run_ids, before, statuses, owner, judged)


async def trimmable(
    store: CheckpointStore, before: float, statuses: Collection[str], limit: int, since: float | None = None
) -> list[tuple[str, float]]:
    """The runs a trim would take now, ``(run_id, saved_at)`` oldest first (see `TrimStore.trimmable`).

    Raises:
        NotImplementedError: the store cannot trim (it has no `TrimStore`).
    """
    if isinstance(store, TrimStore):
        return list(await store.trimmable(before, statuses, limit, since))
    return await default_trimmable(store, before, statuses, limit, since)


async def trim(
    store: CheckpointStore,
    run_ids: Sequence[str],
    before: float,
    statuses: Collection[str],
    judged: JudgedRows | None = None,
) -> Trimmed:
    """Keep only the newest checkpoint of each run of `run_ids` that still qualifies (see `TrimStore.trim`).

    With `judged` (from `judged_rows`), a run is trimmed only while its newest row is the
    one judged.

    Raises:
        NotImplementedError: the store cannot trim (it has no `TrimStore`), or it cannot be
            told the rows judged (its ``trim`` takes no ``judged``).
    """
    if not isinstance(store, TrimStore):
        return await default_trim(store, run_ids, before, statuses, judged)
    if not run_ids:
        return Trimmed((), 0)
    if judged is None:
        return await store.trim(run_ids, before, statuses)
    if not _takes_judged(store.trim):
        raise NotImplementedError(
            f"{type(store).__name__}.trim takes no judged rows, so it could trim a run saved again after it was "
            "judged: give its trim the judged parameter (TrimStore.trim)"
        )
    return await store.trim(run_ids, before, statuses, judged=judged)


def _unchecked(judgement: tuple[dict[str, JudgedRow], dict[str, str]]) -> tuple[dict[str, JudgedRow], dict[str, str]]:
    """`judged_rows`' answer, each run left worded as a batch reports it (`Pruned.refused`)."""
    kept, bad = judgement
    return kept, {run_id: f"its newest checkpoint does not check ({why})" for run_id, why in bad.items()}


async def prune_finished(
    store: CheckpointStore,
    policy: RetentionPolicy,
    *,
    check: RowCheck | None = None,
    now: float | None = None,
    owner: str | None = None,
    max_batches: int | None = None,
    on_batch: Callable[[Pruned], None] | None = None,
) -> Pruned:
    """Prune the runs `policy` no longer keeps whole, batch by batch; return what was deleted.

    Each batch lists up to ``policy.batch`` prunable runs, oldest first, judges each by its
    signed newest checkpoint (`judged_rows`) and prunes those that qualify, each judged again
    by the store as it goes and deleted only while that checked row is still its newest. It
    stops when a batch prunes nothing (all done, or the runs left are held or changed) or
    after `max_batches` batches. A policy without ``keep_s`` prunes nothing.

    Args:
        store: the store to prune.
        policy: what to keep.
        check: what is wrong with a run's newest row (the key ring's check: `Sealer.checkpoint_problem`);
            None: the store's own key's, for a store that lives in one process (`local_key`).
        now: the time the cut-off is counted from (default: now).
        owner: who holds each run's lease while it is deleted (default: ``prune@<host>:<pid>``).
        max_batches: stop after this many batches (None: until done).
        on_batch: called with what each batch deleted (progress).
    """
    if policy.keep_s is None:
        return Pruned((), 0)
    check = _check_for(store, check)
    before = policy.cut_off(now)
    who = owner or pruner()
    total = Pruned((), 0)
    refused: dict[str, str] = {}
    batches = 0
    while max_batches is None or batches < max_batches:
        batches += 1
        listed = await prunable(store, before, policy.statuses, policy.batch + len(refused))
        kept, bad = _unchecked(
            await judged_rows(store, [r for r in listed if r not in refused], before, policy.statuses, check)
        )
        done = await prune(store, list(kept), before, policy.statuses, who, kept)
        bad |= dict(done.refused)  # runs the store left because they went on past the row judged
        refused |= bad
        done = Pruned(done.run_ids, done.rows, tuple(bad.items()))
        if on_batch is not None:
            on_batch(done)
        total += done
        if not done.run_ids and not bad:
            break
    return total


async def trim_finished(
    store: CheckpointStore,
    policy: RetentionPolicy,
    *,
    check: RowCheck | None = None,
    now: float | None = None,
    max_batches: int | None = None,
    on_batch: Callable[[Trimmed], None] | None = None,
) -> Trimmed:
    """Keep only the newest checkpoint of the runs `policy` trims, batch by batch; return what was deleted.

    Each batch lists up to ``policy.batch`` trimmable runs, oldest first from a cursor (the
    newest save time the previous batch listed), judges each by its signed newest checkpoint
    (`judged_rows`) and trims those that qualify, each judged again as it goes and trimmed
    only while that checked row is still its newest. It stops when a batch lists nothing,
    when one trims nothing without the cursor moving (the runs left there are held or
    changed), or after `max_batches` batches. A policy without ``trim_after_s`` trims nothing.

    Args:
        store: the store to trim.
        policy: what to keep.
        check: what is wrong with a run's newest row (the key ring's check), as for
            `prune_finished`; a run is trimmed only when its signed newest checkpoint qualifies.
        now: the time the cut-off is counted from (default: now).
        max_batches: stop after this many batches (None: until done).
        on_batch: called with what each batch deleted (progress).

    Raises:
        NotImplementedError: the store cannot trim (it has no `TrimStore`).
    """
    if policy.trim_after_s is None:
        return Trimmed((), 0)
    check = _check_for(store, check)
    before = policy.trim_cut_off(now)
    total = Trimmed((), 0)
    since: float | None = None
    batches = 0
    while max_batches is None or batches < max_batches:
        batches += 1
        found = await trimmable(store, before, policy.statuses, policy.batch, since)
        kept, bad = _unchecked(
            await judged_rows(store, [run_id for run_id, _ in found], before, policy.statuses, check)
        )
        done = await trim(store, list(kept), before, policy.statuses, kept)
        bad |= dict(done.refused)  # runs the store left because they went on past the row judged
        done = Trimmed(done.run_ids, done.rows, tuple(bad.items()))
        if on_batch is not None:
            on_batch(done)
        total += done
        newest = found[-1][1] if found else None
        if newest is None or (not done.run_ids and since is not None and newest <= since):
            break
        since = newest
    return total
