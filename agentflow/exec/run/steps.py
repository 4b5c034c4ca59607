"""The parts of the run protocol: writing and reading one run's checkpoints and call log.

`RunSteps` holds a store, a sealer, a `RunDriver` (what a flow or a loop plugs in: its
state codec and how it drives a step) and this process's `Ownership`. Its parts:
- `start`: save step 0 in segment 0;
- `open`: load the latest checkpoint, check its signature and kind, restore the identity;
- `read`: read the whole call log and make the checks every reader makes (`run.checks`);
- `claim`: save the next step in a new segment, pinning the record count of every earlier
  segment, with the claim's control record (see `run.protocol`); of racing workers
  exactly one wins;
- `save`: the checkpoint after a step (with a held ``done`` record, atomically), naming
  who saved it (``by``);
- `step_span`: the span of the superstep a driver begins (`agentflow.exec.tracing`); every
  checkpoint body carries the run's trace context (``trace``) from step 0 on.
The entry points that put the parts in order, under the run's lease, are in `run.protocol`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, Generic

from agentflow._errors import (
    CheckpointConflict,
    CheckpointNotFound,
    CheckpointStoreCorrupt,
    CheckpointTooLarge,
    RecoveryNeedsDecision,
)
from agentflow._events import Event, Events
from agentflow._identity import RunContext, restore_identity
from agentflow._run_types import RunStatus
from agentflow.exec._registry import Registry
from agentflow.exec.calls.journal import Journal
from agentflow.exec.calls.log import envelope, read_decisions, read_pending, too_large
from agentflow.exec.calls.read import CallState, LoggedRecord, calls_in_doubt, read_log
from agentflow.exec.checkpoints import CheckpointStore, SealedCheckpoint
from agentflow.exec.checkpoints.records import LeaseMove, SealedEvent
from agentflow.exec.event_chain import ANCHOR, anchor_of
from agentflow.exec.run.checks import (
    AheadOfCheckpoint,
    check_read_whole,
    check_records,
    check_still_paused,
    counts_of,
    encode_pins,
    marker_of,
    pins_for,
    pins_of,
)
from agentflow.exec.run.control import control_of, granted, without_failed
from agentflow.exec.run.driver import C, R, RunDriver
from agentflow.exec.run.lease import Ownership, Rider
from agentflow.exec.run.timers import wake_of
from agentflow.exec.seal import Sealer, canonical
from agentflow.exec.tracing import NO_TRACING, StepSpan, Tracer

#: The version of the checkpoint body layout.
BODY_VERSION = 1

#: The largest checkpoint (encoded body, in bytes) a run saves unless told otherwise.
MAX_CHECKPOINT_BYTES = 4 * 1024 * 1024

#: Why a run was claimed (signed into the claim checkpoint).
CLAIM_CAUSES = frozenset({"recovery", "resume", "handoff", "decision", "parked", "cancel", "retry", "migrate", "wake"})


def started_of(body: Mapping[str, Any]) -> float | None:
    """When the run a checked checkpoint body belongs to started (its ``started``; None if it has none)."""
    started = body.get("started")
    return float(started) if isinstance(started, int | float) and not isinstance(started, bool) else None


log = logging.getLogger("agentflow.events")


async def _ride(rider: Rider, run_id: str, step: int, carried: Sequence[Event]) -> SealedEvent | None:
    """The entry of the run's events not yet stored, `carried` last, for a save to carry (None: it goes alone)."""
    try:
        return await rider.ride(*carried)
    except Exception:  # observing a run never breaks it: the save goes alone, the events stay buffered
        log.exception("run %s: its events could not go with step %d's save", run_id, step)
        return None


async def _save_riding(
    journal: Journal, rider: Rider, step: int, row: SealedCheckpoint, move: LeaseMove, riding: SealedEvent
) -> None:
    """`Journal.save` giving the lease up with the entry `riding` (the run's events not yet stored) in the same write.

    The rider learns what became of them (`Rider.rode`): stored, refused with nothing
    written, or unknown (the store failed: the events may be stored, so never again).
    """
    try:
        await journal.save(step, row, move, (riding,))
    except (CheckpointConflict, CheckpointNotFound):
        rider.rode(False)
        raise
    except BaseException:
        rider.rode(None)
        raise
    rider.rode(True)


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


class RunSteps(Generic[C, R]):
    """The parts of the durable sequence for one kind of run over one store (see the module docstring)."""

    def __init__(
        self,
        driver: RunDriver[C, R],
        store: CheckpointStore | None,
        sealer: Sealer | None,
        registry: Registry,
        events: Events,
        max_bytes: int = MAX_CHECKPOINT_BYTES,
        ownership: Ownership | None = None,
        tracer: Tracer = NO_TRACING,
    ) -> None:
        self.driver = driver
        # A lease this protocol's holder loses is reported on its hub (`run.lease`, ``lease.lost``).
        self.ownership = replace(ownership, events=events) if ownership and ownership.events is None else ownership
        self.store = store
        self.sealer = sealer
        self.registry = registry
        self.events = events
        self.max_bytes = max_bytes
        self.tracer = tracer
        #: The recorder of each run this protocol holds and records (`run.events.recording`): told the
        #: head of the run's event chain when the run is opened, asked what each save anchors.
        self.recorders: dict[str, Rider] = {}

    # -- writing ----------------------------------------------------------------------

    def journal(self, run_id: str, segment: int, next_seq: int = 0) -> Journal | None:
        """A pen on a segment of the run's log, new or continued at `next_seq` (None without a store)."""
        if self.store is None or self.sealer is None:
            return None
        holder = self.ownership.owner if self.ownership is not None else None
        return Journal(self.store, self.sealer, run_id, segment, next_seq, max_bytes=self.max_bytes, holder=holder)

    def body(
        self,
        cur: C,
        recovered: dict[str, Any] | None = None,
        claim: str | None = None,
        control: Mapping[str, Any] | None = None,
        lineage: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The checkpoint body for the cursor as it stands.

        `control` is a claim's control record; `lineage` the run and step a forked run's
        step 0 started from.
        """
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
            body.update(control or {})
        if lineage is not None:
            body["forked_from"] = dict(lineage)
        if self.ownership is not None:
            body["by"] = self.ownership.owner
        if cur.trace is not None:
            body["trace"] = cur.trace
        if cur.started_at is not None:
            body["started"] = cur.started_at
        if cur.wake is not None:
            body["wake"] = dict(cur.wake)
        if cur.events is not None:
            body[ANCHOR] = cur.events
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
        control: Mapping[str, Any] | None = None,
        records: Sequence[tuple[str, dict[str, Any]]] = (),
        lineage: Mapping[str, Any] | None = None,
        ending: Event | None = None,
    ) -> None:
        """Save the run's next checkpoint (a compare-and-set on the step).

        Args:
            cur: the run; its `step` advances on success.
            status: the checkpoint's status.
            segment: open a new segment (step 0, or a claim); by default the journal's.
            claim: why the run is claimed (`CLAIM_CAUSES`), signed into the checkpoint.
            unreplayed: calls whose arguments changed since the crash (reported in the event).
            recovered: what the first step after a claim replayed and reran.
            control: a claim's control record (``operator``, ``rerun``, ``awaiting``).
            records: ``(kind, body)`` records that open a new `segment`, stored with the
                checkpoint in one atomic write (an operator's word on calls in doubt).
            lineage: a forked run's source (signed into its step 0).
            ending: the event that tells the run ended with this save (``run.finished``,
                ``run.cancelled``: `ending_event`), delivered once it is stored, right after
                its ``checkpoint.saved``; the save that gives the lease up carries both into
                the run's stream in its own write, so no crash parts the end from the save.

        Raises:
            CheckpointConflict: another worker saved this step first, or the run ended.
            CheckpointTooLarge: the encoded checkpoint is over `max_bytes` (not stored; a held ``done`` is).
        """
        if self.store is None or self.sealer is None:
            cur.step = None
            if ending is not None:
                self.events.deliver(ending)
            return
        step = 0 if cur.step is None else cur.step + 1
        if str(status) != RunStatus.PAUSED:
            cur.wake = None  # only a paused checkpoint carries a timer: every other one spends or drops it
        if segment is not None:
            cur.journal = self.journal(cur.run_id, segment)
        assert cur.journal is not None
        for kind, record in records:
            await cur.journal.hold_encoded(kind, canonical(record))
        saved = self._saved(cur, step, status, unreplayed, claim)  # built before the write: it may carry it
        carried = [event for event in (saved, ending) if event is not None]
        running = str(status) == RunStatus.RUNNING
        tenure = cur.tenure
        rider = tenure.rider if tenure is not None and carried and tenure.closes(running) else None
        riding = await _ride(rider, cur.run_id, step, carried) if rider is not None else None
        self._anchor(cur)  # while it rides, the entry it carries
        body = self.body(cur, recovered, claim, control, lineage)
        try:
            payload = canonical(body)
        except ValueError as exc:  # NaN, infinity or a lone surrogate in the state (`canonical` says where)
            await self._not_saved(cur, rider if riding is not None else None, segment)
            raise ValueError(f"run {cur.run_id!r}: checkpoint {step} cannot be stored: {exc}") from exc
        if len(payload) > self.max_bytes:
            await self._not_saved(cur, rider if riding is not None else None, segment)
            raise CheckpointTooLarge(too_large(cur.run_id, step, body, len(payload), self.max_bytes))
        move = tenure.closing(running) if tenure is not None else None
        row = self.sealer.seal_encoded_checkpoint(
            cur.run_id, step, self.driver.column, str(status), cur.journal.segment, time.time(), payload
        )
        if riding is None or rider is None or move is None:  # with a held ``done``, the lease given up with the last
            await cur.journal.save(step, row, move)
        else:  # ... and the run's events not yet stored, this save's own (and its ending event) last
            await _save_riding(cur.journal, rider, step, row, move, riding)
        if move is not None and cur.tenure is not None:
            cur.tenure.given_up = True
        cur.step = step
        cur.span.saved(step, str(status))
        self.driver.after_save(cur, body)
        for event in carried:
            self.events.deliver(event)
        cur.clock = time.perf_counter()

    @staticmethod
    async def _not_saved(cur: C, rider: Rider | None, segment: int | None) -> None:
        """A checkpoint that cannot be stored: its events go back to the rider, the step's held ``done`` is stored."""
        if rider is not None:
            rider.rode(False)
        if segment is None and cur.journal is not None:  # its call finished, whatever becomes of the checkpoint
            await cur.journal.flush()

    def _anchor(self, cur: C) -> None:
        """The head of the run's event chain the next checkpoint names (`agentflow.exec.event_chain`)."""
        recorder = self.recorders.get(cur.run_id)
        if recorder is not None:  # the head this process stored of the run's event chain
            cur.events = recorder.anchor()
        elif cur.events is not None:  # carried on, with no writer: this process records nothing
            cur.events = {k: v for k, v in cur.events.items() if k != "writer"}

    def ending_event(self, name: str, run_id: str, **data: Any) -> Event | None:
        """The event that tells the run ended (`save`'s `ending`), or None when nobody wants it."""
        return Event(name, run_id, data) if self.events.wants(name) else None

    def _saved(self, cur: C, step: int, status: str, unreplayed: Sequence[str], claim: str | None) -> Event | None:
        """The ``checkpoint.saved`` of the save about to be written, or None when nobody wants it."""
        if not self.events.wants("checkpoint.saved"):
            return None
        assert cur.journal is not None
        data = {
            "kind": self.driver.kind.value,
            "step": step,
            "status": str(status),
            **self.driver.event_fields(cur),
            "unreplayed": list(unreplayed),
            "claim": claim,
            "segment": cur.journal.segment,
            "seconds": time.perf_counter() - cur.clock,
        }
        return Event("checkpoint.saved", cur.run_id, data)

    def same_start(self, cur: C, first: Mapping[str, Any], lineage: Mapping[str, Any] | None = None) -> bool:
        """Whether the checked step 0 body `first` is the one `cur` would start (with `lineage`).

        Compared: the kind, the driver's fields (a flow's version, graph, state and frontier;
        a loop's messages and limits), the identity and the lineage; not when, by whom, or
        under which trace the run was started.
        """
        ours = {"kind": self.driver.kind.value, **self.driver.fields(cur), "identity": cur.identity}
        ours["forked_from"] = dict(lineage) if lineage is not None else None
        theirs = {key: first.get(key) for key in ours}
        return canonical(ours) == canonical(theirs)

    async def start(self, cur: C, lineage: Mapping[str, Any] | None = None) -> None:
        """Save a new run's step 0 in segment 0 (`lineage`: the source of a forked run), then emit ``run.started``.

        Its span (`Tracer.start`) gives the run its trace context, which step 0 carries.

        Raises:
            CheckpointConflict: the run id is taken.
        """
        cur.started_at = time.time()
        cur.events = None  # a new run's chain starts afresh (a fork's source has its own)
        with self.tracer.start(cur, self.driver.column):
            await self.save(cur, RunStatus.RUNNING, segment=0, lineage=lineage)
        # Under the run's lease and after step 0 is stored: the event goes into the run's stream too.
        self.events.emit("run.started", cur.run_id, kind=self.driver.kind.value, **self.driver.event_fields(cur))

    def step_span(self, cur: C) -> AbstractContextManager[StepSpan]:
        """The span of the superstep `cur` begins now; its cause and cut-off links are spent on it."""
        span = self.tracer.superstep(cur, self.driver.column, self.driver.superstep(cur))
        cur.cause, cur.cut_off = "next", None
        return span

    async def claim(
        self,
        cur: C,
        cause: str,
        counts: Mapping[int, int],
        control: Mapping[str, Any] | None = None,
        records: Sequence[tuple[str, dict[str, Any]]] = (),
        *,
        status: RunStatus = RunStatus.RUNNING,
    ) -> None:
        """Claim the run: save the next step in a new segment that pins the earlier segments' counts.

        Args:
            cur: the run, checked; `counts` is what its whole log held when read.
            cause: one of `CLAIM_CAUSES`.
            counts: the record count per segment, from the checked log.
            control: what the claim decides (`CONTROL_FIELDS`), signed with it.
            records: records the claim's segment opens with, stored atomically with it.
            status: the claim's status: ``running``, or ``paused`` for a decision on a paused
                run (its pending calls and timer are kept).

        Raises:
            CheckpointConflict: another worker saved that step first.
        """
        assert cause in CLAIM_CAUSES and cur.step is not None
        claim_step = cur.step + 1
        cur.pins = pins_for(counts, claim_step)
        await self.save(cur, status, segment=claim_step, claim=cause, control=control, records=records)
        await self._read_still_whole(cur, counts, claim_step, len(records))

    async def _read_still_whole(self, cur: C, counts: Mapping[int, int], claim_step: int, opened: int = 0) -> None:
        """Check, once the claim has fenced every earlier segment, that the read it trusted was the whole log.

        Until the claim lands, the worker that held the run before can still log a
        ``started`` in its own segment (its lease lapsed while it stalled, or the lease was
        deleted): between this worker's read and its claim, such a record is invisible to
        the read and accepted by the store. After the claim no earlier segment takes a
        ``started`` any more, so counting again now tells whether the read missed one.
        When it did, nothing runs: the claim stands (it fenced the old holder) and the
        next reader reads the whole log, the late records included.

        Raises:
            CheckpointConflict: records were logged in an earlier segment while the run was read.
        """
        assert self.store is not None
        _, now = await self.store.head(cur.run_id)
        check_read_whole(cur.run_id, claim_step, counts, now, opened)

    def report_step(self, cur: C, replayed: list[str], rerun: list[str], recovering: bool) -> dict[str, Any] | None:
        """After the first step of a claim that continued a cut-off one: emit ``run.recovered``.

        Returns:
            What that step's checkpoint records of it (None when not recovering).
        """
        if not recovering:
            return None
        cur.span.recovered(replayed, rerun)
        self.events.emit(
            "run.recovered", cur.run_id, kind=self.driver.kind.value, step=cur.step, replayed=replayed, rerun=rerun
        )
        return {"replayed": replayed, "rerun": rerun}

    @staticmethod
    def carried(opened: Opened[C], seeds: Mapping[str, CallState]) -> dict[str, Any]:
        """The ``rerun`` grant of the opened claim that is not spent yet, for the next claim to carry on.

        A decision on a paused run (`RunProtocol.decide_in_doubt`) is spent by the step the
        run goes on with, after a `resume` or a `wake` claims it: that claim carries the
        grant (the calls still in doubt that no record since the decision touched), so the
        worker that spends the claim may rerun them as the decision said. Empty when there is
        nothing to carry.
        """
        ids = granted(opened.body, opened.row.segment, seeds)
        rerun = [cid for cid in control_of(opened.body).rerun if cid in ids and seeds[cid].in_doubt]
        return {"rerun": rerun} if rerun else {}

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
            trace = body.get("trace")
            cur.trace = trace if isinstance(trace, str) else None
            cur.started_at = started_of(body)
            cur.wake = wake_of(body) if row.status == RunStatus.PAUSED else None
            cur.events = anchor_of(body)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointStoreCorrupt(
                f"checkpoint {row.step} of run {run_id!r} is signed but does not fit a {self.driver.kind} run: {exc!r}"
            ) from None
        recorder = self.recorders.get(run_id) if identity else None
        if recorder is not None:  # this process records the run: its first entry follows the chain's head
            recorder.follow(cur.events)
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
            lead = self.driver.kind.model_ahead
            counts = check_records(cur.run_id, row.step, body, records, self.driver.superstep(cur), model_ahead=lead)
        except AheadOfCheckpoint as exc:
            raise await self._moved_on(opened, exc) from None
        return records, counts

    def seeds(self, opened: Opened[C], records: Sequence[LoggedRecord], rerun_in_doubt: bool) -> dict[str, CallState]:
        """The calls of the step being continued; refuses when one is in doubt and may not rerun.

        A call in doubt reruns when its tool is idempotent, when `rerun_in_doubt`, or when
        the opened checkpoint is a claim whose signed ``rerun`` decision covers it
        (`run.control.granted`).

        Raises:
            RecoveryNeedsDecision: a call is in doubt, its tool is not idempotent, and
                nothing above lets it rerun.
        """
        states = self.driver.seeds(opened.cur, records)
        if opened.body.get("claim") == "retry":  # a stored retry, not yet spent: the failed calls run again
            states = without_failed(states)
        allowed: bool | set[str] = rerun_in_doubt or granted(opened.body, opened.row.segment, states)
        try:
            calls_in_doubt(opened.cur.run_id, states, self.registry, allowed)
        except RecoveryNeedsDecision as exc:
            cur = opened.cur
            doubtful = [(tool, call_id) for (tool, _), call_id in zip(exc.calls, exc.call_ids, strict=True)]
            self.tracer.in_doubt(cur, self.driver.column, self.driver.superstep(cur), doubtful)
            raise
        return states
