"""The run protocol: the one sequence every durable run follows, for flows and tool loops alike.

Moving parts:
- `RunProtocol` holds a store, a sealer and a `RunDriver` (what a flow or a loop plugs in:
  its state codec and how it drives a step). It owns every rule of the sequence, once:
  - `start`: save step 0 in segment 0;
  - `open`: load the latest checkpoint, check its signature and kind, restore the identity;
  - `read`: read the whole call log and make the checks every reader makes (`_run_checks`);
  - `claim`: save the next step in a new segment, pinning the record count of every
    earlier segment; of two racing workers exactly one wins;
  - `save`: the checkpoint after a step (with a held ``done`` record, atomically);
  - `recover`, `resume`, `advance`: the entry points, built from the parts above.
- `decide` (in `_durable`): the one rule turning an operator's ``approve`` into decisions.

Invariants:
- Nothing runs before the claim is saved, and the claim is saved only after every check
  passed (signatures, numbering, pins, in-doubt calls, identity).
- A decision is stored with the claim that carries it, and spent only after that save.
- A handoff continues the writer's segment without a claim only when nothing was logged
  since its checkpoint (the numbering then fences the two writers on its own).
- Records past the checkpoint read are corruption unless the run moved on meanwhile
  (then the reader lost a race: `CheckpointConflict`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic

from agentflow._errors import CheckpointConflict, CheckpointStoreCorrupt, CheckpointTooLarge, Stale
from agentflow._events import Events
from agentflow._identity import RunContext, restore_identity
from agentflow._run_types import RunStatus
from agentflow.exec._durable import Journal, decide, envelope, read_decisions, read_pending, too_large
from agentflow.exec._durable_read import CallState, LoggedRecord, calls_in_doubt, read_head, read_log
from agentflow.exec._durable_seal import Sealer, canonical
from agentflow.exec._registry import Registry
from agentflow.exec._run_checks import (
    AheadOfCheckpoint,
    check_counts,
    check_records,
    check_still_paused,
    counts_of,
    encode_pins,
    marker_of,
    pins_for,
    pins_of,
    untouched,
)
from agentflow.exec._run_driver import C, R, RunDriver
from agentflow.exec.checkpoints._protocol import CheckpointStore
from agentflow.exec.checkpoints._records import SealedCheckpoint

#: The version of the checkpoint body layout.
BODY_VERSION = 1

#: The largest checkpoint (encoded body, in bytes) a run saves unless told otherwise.
MAX_CHECKPOINT_BYTES = 4 * 1024 * 1024

#: Why a run was claimed (signed into the claim checkpoint).
CLAIM_CAUSES = frozenset({"recovery", "resume", "handoff"})

Head = tuple[SealedCheckpoint, Mapping[int, int]]


@dataclass
class Opened(Generic[C]):
    """A run as its latest checkpoint shows it, every check of that row passed."""

    cur: C
    row: SealedCheckpoint
    body: dict[str, Any]

    @property
    def status(self) -> str:
        """The latest checkpoint's status."""
        return self.row.status


class RunProtocol(Generic[C, R]):
    """The durable sequence of one kind of run over one store (see the module docstring)."""

    def __init__(
        self,
        driver: RunDriver[C, R],
        store: CheckpointStore | None,
        sealer: Sealer | None,
        registry: Registry,
        events: Events,
        max_bytes: int = MAX_CHECKPOINT_BYTES,
    ) -> None:
        self.driver = driver
        self.store = store
        self.sealer = sealer
        self.registry = registry
        self.events = events
        self.max_bytes = max_bytes

    # -- writing ----------------------------------------------------------------------

    def journal(self, run_id: str, segment: int, next_seq: int = 0) -> Journal | None:
        """A pen on a segment of the run's log, new or continued at `next_seq` (None without a store)."""
        if self.store is None or self.sealer is None:
            return None
        return Journal(self.store, self.sealer, run_id, segment, next_seq, max_bytes=self.max_bytes)

    def body(self, cur: C, recovered: dict[str, Any] | None = None, claim: str | None = None) -> dict[str, Any]:
        """The checkpoint body for the cursor as it stands."""
        body: dict[str, Any] = {
            "v": BODY_VERSION,
            "kind": self.driver.kind.value,
            **self.driver.fields(cur),
            **envelope(cur.identity, cur.pending, cur.decisions, cur.journal, cur.error),
        }
        if cur.pins:
            body["pins"] = encode_pins(cur.pins)
        if recovered is not None:
            body["recovered"] = recovered
        if claim is not None:
            body["claim"] = claim
        return body

    async def save(
        self,
        cur: C,
        status: str,
        *,
        segment: int | None = None,
        claim: str | None = None,
        unreplayed: Sequence[str] = (),
        recovered: dict[str, Any] | None = None,
    ) -> None:
        """Save the run's next checkpoint (a compare-and-set on the step).

        Args:
            cur: the run; its `step` advances on success.
            status: the checkpoint's status.
            segment: open a new segment (step 0, or a claim); by default the journal's.
            claim: why the run is claimed (`CLAIM_CAUSES`), signed into the checkpoint.
            unreplayed: calls whose arguments changed since the crash (reported in the event).
            recovered: what the first step after a claim replayed and reran.

        Raises:
            CheckpointConflict: another worker saved this step first, or the run ended.
            CheckpointTooLarge: the encoded checkpoint is over `max_bytes` (nothing is stored).
        """
        if self.store is None or self.sealer is None:
            cur.step = None
            return
        step = 0 if cur.step is None else cur.step + 1
        if segment is not None:
            cur.journal = self.journal(cur.run_id, segment)
        assert cur.journal is not None
        body = self.body(cur, recovered, claim)
        payload = canonical(body)
        if len(payload) > self.max_bytes:
            raise CheckpointTooLarge(too_large(cur.run_id, step, body, len(payload), self.max_bytes))
        row = self.sealer.seal_encoded_checkpoint(
            cur.run_id, step, self.driver.column, str(status), cur.journal.segment, time.time(), payload
        )
        await cur.journal.save(step, row)  # with a held ``done`` record, if the step left one
        cur.step = step
        self.driver.after_save(cur, body)
        self.events.emit(
            "checkpoint.saved",
            cur.run_id,
            kind=self.driver.kind.value,
            step=step,
            status=str(status),
            **self.driver.event_fields(cur),
            unreplayed=list(unreplayed),
        )

    async def start(self, cur: C) -> None:
        """Save a new run's step 0 in segment 0.

        Raises:
            CheckpointConflict: the run id is taken.
        """
        await self.save(cur, RunStatus.RUNNING, segment=0)

    async def claim(self, cur: C, cause: str, counts: Mapping[int, int]) -> None:
        """Claim the run: save the next step in a new segment that pins the earlier segments' counts.

        Args:
            cur: the run, checked; `counts` is what its whole log held when read.
            cause: ``recovery``, ``resume`` or ``handoff``.
            counts: the record count per segment, from the checked log.

        Raises:
            CheckpointConflict: another worker saved that step first.
        """
        assert cause in CLAIM_CAUSES and cur.step is not None
        claim_step = cur.step + 1
        cur.pins = pins_for(counts, claim_step)
        await self.save(cur, RunStatus.RUNNING, segment=claim_step, claim=cause)

    def report_step(self, cur: C, replayed: list[str], rerun: list[str], recovering: bool) -> dict[str, Any] | None:
        """After the first step of a claim that continued a cut-off one: emit ``run.recovered``.

        Returns:
            What that step's checkpoint records of it (None when not recovering).
        """
        if not recovering:
            return None
        self.events.emit(
            "run.recovered", cur.run_id, kind=self.driver.kind.value, step=cur.step, replayed=replayed, rerun=rerun
        )
        return {"replayed": replayed, "rerun": rerun}

    # -- reading ----------------------------------------------------------------------

    def _stores(self) -> tuple[CheckpointStore, Sealer]:
        if self.store is None or self.sealer is None:
            raise ValueError("recover and resume need a checkpoint store")
        return self.store, self.sealer

    async def open(
        self, run_id: str, ctx: RunContext | None, row: SealedCheckpoint | None = None, *, identity: bool = True
    ) -> Opened[C]:
        """Load and check the run's latest checkpoint (unless `row` was read already) and its identity.

        With `identity` False the run is only read (shown, never continued): the identity
        is not restored and the cursor acts for nobody.

        Raises:
            CheckpointNotFound: nothing is stored for the run.
            CheckpointStoreCorrupt: the row fails its check, or does not fit the run's kind.
            CheckpointConflict: the run is another flow's or another kind's.
            IdentityMismatch: `ctx` is for someone else, or the run's principal is missing.
            FlowError: the flow changed since the checkpoint.
        """
        store, sealer = self._stores()
        row, body = await self.driver.read(store, sealer, run_id, row)
        restored = restore_identity(sealer, run_id, body.get("identity") or {}, ctx) if identity else None
        try:
            cur = self.driver.cursor(row, body, restored)
            cur.step = row.step
            cur.decisions = read_decisions(body)
            cur.pending = read_pending(body, restored)
            cur.error = body.get("error")
            cur.pins = pins_of(body)
            marker_of(body)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointStoreCorrupt(
                f"checkpoint {row.step} of run {run_id!r} is signed but does not fit a {self.driver.kind} run: {exc!r}"
            ) from None
        return Opened(cur, row, body)

    async def _moved_on(self, opened: Opened[C], exc: AheadOfCheckpoint) -> Exception:
        """Tell a lost race (the run moved on while it was read) from removed checkpoints."""
        store, _ = self._stores()
        latest = await store.latest(opened.row.run_id)
        if latest.step != opened.row.step:
            return CheckpointConflict(
                f"run {opened.row.run_id!r} moved on to step {latest.step} while step {opened.row.step} was read "
                "(another worker holds it)"
            )
        return exc

    async def read(self, opened: Opened[C], *, resuming: bool = False) -> tuple[list[LoggedRecord], dict[int, int]]:
        """Read the whole call log and check it against the opened checkpoint.

        Returns:
            The checked records, and the record count per segment.

        Raises:
            CheckpointStoreCorrupt: a record fails its check, is missing, or belongs past the
                checkpoint while the run did not move on.
            CheckpointConflict: the run moved on while it was read (another worker holds it),
                or, `resuming`, another resume won.
        """
        store, sealer = self._stores()
        cur, row, body = opened.cur, opened.row, opened.body
        records = await read_log(store, sealer, cur.run_id)
        if resuming:  # first: records after a paused checkpoint are a rival resume's, not corruption
            check_still_paused(cur.run_id, body, counts_of(records))
        try:
            counts = check_records(
                cur.run_id, row.step, body, records, self.driver.superstep(cur), model_ahead=self.driver.model_ahead
            )
        except AheadOfCheckpoint as exc:
            raise await self._moved_on(opened, exc) from None
        return records, counts

    def seeds(self, cur: C, records: Sequence[LoggedRecord], rerun_in_doubt: bool) -> dict[str, CallState]:
        """The calls of the step being continued; refuses when one is in doubt and may not rerun.

        Raises:
            RecoveryNeedsDecision: a call is in doubt, its tool is not idempotent, and
                `rerun_in_doubt` is False.
        """
        states = self.driver.seeds(cur, records)
        calls_in_doubt(cur.run_id, states, self.registry, rerun_in_doubt)
        return states

    # -- the entry points -------------------------------------------------------------

    async def recover(self, run_id: str, *, rerun_in_doubt: bool, ctx: RunContext | None) -> R:
        """Continue a run whose worker died: check, claim, replay, go on (see `FlowRunner.recover`)."""
        opened = await self.open(run_id, ctx)
        if opened.status == RunStatus.PAUSED:
            return self.driver.result(opened.cur, RunStatus.PAUSED)
        if opened.status != RunStatus.RUNNING:
            raise CheckpointConflict(f"run {run_id!r} already ended ({opened.status}); there is nothing to recover")
        records, counts = await self.read(opened)
        seeds = self.seeds(opened.cur, records, rerun_in_doubt)
        await self.claim(opened.cur, "recovery", counts)
        return await self.driver.drive(self, opened.cur, seeds, limit=None, recovering=True)

    async def resume(
        self,
        run_id: str,
        *,
        approve: bool | Mapping[str, bool],
        note: str | None,
        ctx: RunContext | None,
        limit: int | None,
    ) -> R:
        """Decide a paused run's pending calls, store the decision with a claim, then spend it.

        `limit` 0 only stores the decision (a worker spends it); the result is then ``running``.

        Raises:
            CheckpointConflict: the run is not paused, or another resume won.
            ValueError: `approve` names a call that is not pending, or leaves one undecided.
        """
        opened = await self.open(run_id, ctx)
        if opened.status != RunStatus.PAUSED:
            hint = " (recover it instead)" if opened.status == RunStatus.RUNNING else ""
            raise CheckpointConflict(
                f"run {run_id!r} is not paused ({opened.status}); only a paused run can be resumed{hint}"
            )
        cur = opened.cur
        chosen = decide(run_id, cur.pending, approve, note)
        records, counts = await self.read(opened, resuming=True)
        seeds = self.seeds(cur, records, rerun_in_doubt=False)
        cur.decisions, cur.pending = chosen, []
        await self.claim(cur, "resume", counts)
        # A paused run did not crash: continuing it is not a recovery.
        return await self.driver.drive(self, cur, seeds, limit=limit, recovering=False)

    async def advance(
        self,
        run_id: str,
        *,
        expected_step: int | None,
        rerun_in_doubt: bool,
        handoff: bool,
        head: Awaitable[Head] | None = None,
    ) -> R:
        """Run exactly one step of a running run, claiming it unless it was handed over cleanly.

        A clean handoff: the worker before saved its step and logged nothing since, so this
        one continues its segment, numbering from where the checkpoint left off. Where the
        store counts records per segment (`head`), that shows without reading the log, but
        only after a checkpoint that ended a step; after a claim (a stored decision, a
        recovery) the claim's step had calls that finished before it, so the log is read to
        replay them.

        Raises:
            Stale: the latest step is not `expected_step` (a late or duplicate message).
            CheckpointConflict: the run is not running, or another worker claimed it first.
            RecoveryNeedsDecision: a call is in doubt (as for `recover`).
            CheckpointStoreCorrupt: a row fails its check.
        """
        store, _ = self._stores()
        head_row, counts = await (head or read_head(store, run_id))
        opened = await self.open(run_id, None, head_row)
        cur, body = opened.cur, opened.body
        if expected_step is not None and cur.step != expected_step:
            raise Stale(
                f"run {run_id!r} is at step {cur.step}, not {expected_step}: this message is late or a duplicate"
            )
        if opened.status != RunStatus.RUNNING:
            raise CheckpointConflict(f"run {run_id!r} is {opened.status}; only a running run can be advanced")
        next_seq: int | None = None
        if handoff and "claim" not in body and opened.row is head_row:
            try:
                check_counts(run_id, opened.row.step, body, counts)
            except AheadOfCheckpoint as exc:
                raise await self._moved_on(opened, exc) from None
            next_seq = untouched(body, counts)
        seeds: dict[str, CallState] = {}
        if next_seq is None:
            records, counts = await self.read(opened)
            seeds = self.seeds(cur, records, rerun_in_doubt)
            # Nothing logged since the checkpoint: any seeds predate it (the finished calls of
            # a step paused for approval) and are replayed as a resume replays them.
            next_seq = untouched(body, counts) if handoff else None
            if next_seq is None:  # something was logged after the checkpoint: its worker died in the step
                await self.claim(cur, "recovery", counts)
                return await self.driver.drive(self, cur, seeds, limit=1, recovering=True)
        mark = marker_of(body)
        assert mark is not None
        cur.journal = self.journal(run_id, mark[0], next_seq)
        return await self.driver.drive(self, cur, seeds, limit=1, recovering=False)
