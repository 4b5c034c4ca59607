"""The run protocol: the one sequence every durable run follows, for flows and tool loops alike.

Moving parts:
- `RunSteps` (`run.steps`): the parts (start, open, read, seeds, claim, save) over one
  store, sealer and `RunDriver` (what a flow or a loop plugs in). A protocol holds one
  (`RunProtocol.steps`) and hands it to the driver, which saves its steps with it.
- `RunProtocol` puts them in order, once for every kind of run, each entry point under the
  run's lease (`run.lease`): `begin` (a new run), `recover`, `resume`, `advance` (one
  step, for distributed workers), `decide_in_doubt` (an operator's decision on calls in
  doubt), `retry`, `cancel`, `migrate` (onto another definition: the driver builds the
  moved cursor), `wake` (a paused run whose signed timer is due: `run.timers`), `fork` (a
  new run from a checkpoint of another: the driver copies its state).
  `decide` (in `calls.log`) is the one rule turning ``approve`` into decisions. The held
  drive (`_drive`) and the entry points from outside (an operator's, a due timer's) come
  first, the run's own progress (`begin`, `recover`, `resume`, `advance`) after them.
- Every drive runs on the look-out for a cancel request (`run.cancel.CancelWatch`); one
  ends the run through `_end_cancelled`, the one place a run becomes ``cancelled``.
- Control records (`run.control`): every decision that steers a run is a claim
  checkpoint, signed like any other: a resume (``decisions``), an operator's decision to
  rerun calls in doubt (``rerun``), a worker parking a run on calls in doubt
  (``awaiting``). Each names its ``operator``. A message only points at one.

Invariants:
- No entry point reads, claims or runs anything before it holds the run's lease; a live
  lease is refused with `RunHeld` (a `CheckpointConflict` naming the holder), except by
  `cancel`, which leaves the holder a signed request instead.
- Nothing runs before the claim is saved, and the claim is saved only after every check
  passed (signatures, numbering, pins, in-doubt calls, identity).
- A decision is stored with the claim that carries it, and spent only after that save;
  nothing but a signed claim lets a non-idempotent call in doubt run again.
- A handoff continues the writer's segment without a claim only when nothing was logged
  since its checkpoint (the numbering then fences the two writers on its own).
- Records past the checkpoint read are corruption unless the run moved on meanwhile
  (then the reader lost a race: `CheckpointConflict`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any, Final, Generic

from agentflow._errors import (
    CheckpointConflict,
    CheckpointNotFound,
    ControlRefused,
    FlowError,
    RecoveryNeedsDecision,
    RunHeld,
    Stale,
)
from agentflow._events import Events
from agentflow._identity import RunContext, identity_body
from agentflow._run_types import RunStatus
from agentflow.exec._registry import Registry
from agentflow.exec.calls.log import decide
from agentflow.exec.calls.read import CallState, calls_in_doubt
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.protocol import DurabilityConfirming, LeaseMoving, has_part
from agentflow.exec.checkpoints.rules import check_new_run_id
from agentflow.exec.run.cancel import KIND as CANCEL
from agentflow.exec.run.cancel import CancelRequest, CancelRequested, CancelWatch, post, withdraw
from agentflow.exec.run.checks import AheadOfCheckpoint, check_counts, cut_off_spans, marker_of, pins_for, untouched
from agentflow.exec.run.control import InDoubtDecision, awaiting_record, granted, parked, settle, without_failed
from agentflow.exec.run.driver import C, R, RunDriver
from agentflow.exec.run.events import recording
from agentflow.exec.run.lease import UNREAD, Head, HeldHead, Ownership, Seen, Tenure, holding, holding_reading_head
from agentflow.exec.run.markers import key_of
from agentflow.exec.run.steps import BODY_VERSION, CLAIM_CAUSES, MAX_CHECKPOINT_BYTES, Opened, RunSteps
from agentflow.exec.run.timers import NotDue, a_child_ended, due
from agentflow.exec.run.trim import no_checkpoint_text
from agentflow.exec.seal import Sealer
from agentflow.exec.tracing import NO_TRACING, Tracer

__all__ = ["BODY_VERSION", "CLAIM_CAUSES", "MAX_CHECKPOINT_BYTES", "Head", "Opened", "RunProtocol"]

#: What a start that cannot attach to the run its id names is told to do (`RunProtocol._attach`).
_NEW_RUN_ID: Final = "use a new run id for a new run"


def _itself(tenure: Tenure | None) -> Tenure | None:
    """The tenure `hold`'s block holds: what it yields."""
    return tenure


def _first(held: HeldHead) -> Tenure | None:
    """The tenure `hold_reading_head`'s block holds: the first of what it yields."""
    return held[0]


@contextlib.asynccontextmanager
async def _unowned(store: CheckpointStore, run_id: str) -> AsyncIterator[tuple[None, Awaitable[Head], Seen]]:
    """No lease to hold (a runner without an ownership); the head is read when awaited."""
    head = store.head(run_id)
    try:
        yield None, head, UNREAD
    finally:
        head.close()  # a no-op once it ran


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
        ownership: Ownership | None = None,
        tracer: Tracer = NO_TRACING,
    ) -> None:
        #: The parts of the sequence (`run.steps`): what a driver is handed to save its steps.
        self.steps: RunSteps[C, R] = RunSteps(driver, store, sealer, registry, events, max_bytes, ownership, tracer)
        self.driver = driver
        self.store = store
        self.sealer = sealer
        self.events = events
        self.ownership = self.steps.ownership

    def hold(self, run_id: str, *, unborn: bool = False) -> contextlib.AbstractAsyncContextManager[Tenure | None]:
        """Hold the run's lease for a block (nothing is held without a store or an ownership).

        `unborn`: the block starts the run (`run.lease.take_unborn`).

        Raises:
            RunHeld: another holder's lease is live.
        """
        self.steps.tracer.taking_up()
        if self.store is None or self.ownership is None:
            held: contextlib.AbstractAsyncContextManager[Tenure | None] = contextlib.nullcontext(None)
        else:
            held = holding(self.store, run_id, self.ownership, unborn=unborn)
        return recording(self.store, self.sealer, self.events, run_id, held, _itself, self.steps.recorders)

    def hold_reading_head(self, run_id: str) -> contextlib.AbstractAsyncContextManager[HeldHead]:
        """`hold`, and the run's head (and its cancel marker) read with the lease's take (`holding_reading_head`).

        Raises:
            RunHeld: another holder's lease is live.
            ValueError: the runner has no store.
        """
        self.steps.tracer.taking_up()
        store, _ = self.steps._stores()
        if self.ownership is None:
            held: contextlib.AbstractAsyncContextManager[HeldHead] = _unowned(store, run_id)
        else:
            held = holding_reading_head(store, run_id, self.ownership, key_of(CANCEL, run_id))
        return recording(self.store, self.sealer, self.events, run_id, held, _first, self.steps.recorders)

    def operator(self, name: str | None) -> dict[str, Any]:
        """The ``operator`` field of a control record: `name`, else this process's owner name."""
        if name is not None:
            return {"operator": name}
        return {"operator": self.ownership.owner} if self.ownership is not None else {}

    async def _drive(
        self,
        cur: C,
        seeds: Mapping[str, CallState],
        *,
        limit: int | None,
        recovering: bool,
        tenure: Tenure | None = None,
        seen: Seen = UNREAD,
    ) -> R:
        """Drive the held run, on the look-out for a cancel request (`run.cancel`): it ends the run there.

        `tenure`: the lease held for the drive (a tool runs only while it is sure to be held:
        `Tenure.confirm`); on a store that moves leases with its writes, the drive's last save
        gives it up (`Tenure.arm`). `seen`: the run's cancel marker as
        the lease's take read it (the watch's first look).
        """
        if self.store is not None and self.sealer is not None:
            cur.watch = CancelWatch(
                self.store, self.sealer, cur.run_id, self.events, cur.started_at, steps=limit, seen=seen
            )
        cur.tenure = tenure  # each tool confirms it before it runs (`calls.log`)
        if tenure is not None and limit != 0 and has_part(self.store, LeaseMoving):
            tenure.arm(limit)
        try:
            return await self.driver.drive(self.steps, cur, seeds, limit=limit, recovering=recovering)
        except CancelRequested as stop:
            if cur.journal is not None:
                await cur.journal.flush()  # a finished call's record goes in before the run ends
            request = stop.request
            who = {"operator": request.operator} if request.operator is not None else {}
            result = await self._end_cancelled(cur.run_id, request.reason, who)
            await withdraw(*self.steps._stores(), cur.run_id)
            return result

    async def cancel(self, run_id: str, *, reason: str, operator: str | None) -> R:
        """Cancel a run: at once if no live worker holds it, else by a signed request to its holder.

        The child runs a paused run waits for (`RunDriver.children`) are cancelled with it.

        A run nobody holds (paused, stranded, between two supersteps) ends ``cancelled``
        here, with a signed claim naming `operator` and `reason`. A run a live worker holds
        gets a signed cancel request instead (`run.cancel`): the holder starts no call
        after it sees it, lets the calls in flight finish and be logged, then saves the same
        claim. The result then is the run as it stands now (``running`` or ``paused``); wait
        for ``cancelled`` (the holder looks before each call and each step).

        The claim opens a segment of its own, so a worker that lost the run is fenced (it
        starts no call and saves nothing more), and ``cancelled`` is final: no store takes
        another save of the run, and nothing recovers it. A paused run's pending calls are
        dropped; calls in doubt stay in the log as they are.

        Raises:
            CheckpointConflict: the run already ended.
            CheckpointStoreCorrupt: a row fails its check.
        """
        if not reason.strip():
            raise ValueError("say why the run is cancelled (the reason is signed into the run)")
        children = await self.driver.children(self.steps, run_id)
        result = await self._cancel(run_id, reason, operator)
        for proto, child_id in children:  # what the run waits for goes with it
            with contextlib.suppress(CheckpointConflict):  # it ended meanwhile
                why = f"its parent run {run_id} was cancelled: {reason}"
                await proto.cancel(child_id, reason=why, operator=operator)
        return result

    async def _cancel(self, run_id: str, reason: str, operator: str | None) -> R:
        """`cancel` of the run itself: at once, or a signed request to its live holder."""
        who = self.operator(operator)
        try:
            return await self._cancel_now(run_id, reason, who)
        except RunHeld as held:
            store, sealer = self.steps._stores()
            request = CancelRequest(run_id, reason, who.get("operator"), time.time())
            standing = await post(store, sealer, request)
            self.events.emit(
                "run.cancel_requested", run_id, holder=held.owner, reason=standing.reason, operator=standing.operator
            )
        try:  # the holder may have let go meanwhile, leaving nobody to see the request
            return await self._cancel_now(run_id, standing.reason, {"operator": standing.operator})
        except RunHeld:
            opened = await self.steps.open(run_id, None, identity=False)
            return self.driver.result(opened.cur, RunStatus(opened.status))

    async def _cancel_now(self, run_id: str, reason: str, who: Mapping[str, Any]) -> R:
        async with self.hold(run_id):
            result = await self._end_cancelled(run_id, reason, who)
        if self.store is not None and self.sealer is not None:
            await withdraw(self.store, self.sealer, run_id)  # an earlier request is spent with it
        return result

    async def _end_cancelled(self, run_id: str, reason: str, who: Mapping[str, Any]) -> R:
        """Save the signed ``cancel`` claim of a held run: the one place a run becomes cancelled."""
        opened = await self.steps.open(run_id, None, identity=False)
        if opened.status not in (RunStatus.RUNNING, RunStatus.PAUSED):
            raise CheckpointConflict(f"run {run_id!r} already ended ({opened.status}); there is nothing to cancel")
        _, counts = await self.steps.read(opened)
        cur = opened.cur
        assert cur.step is not None
        cur.pins = pins_for(counts, cur.step + 1)
        cur.pending, cur.decisions = [], {}
        cur.error = f"cancelled by {who.get('operator') or 'an operator'}: {reason}"
        control = {**who, "reason": reason}
        step = cur.step
        cancelled = self.steps.ending_event(
            "run.cancelled", run_id, kind=self.driver.kind.value, step=step + 1, reason=reason, **who
        )
        await self.steps.save(
            cur, RunStatus.CANCELLED, segment=step + 1, claim="cancel", control=control, ending=cancelled
        )
        return self.driver.result(cur, RunStatus.CANCELLED)

    async def retry(
        self, run_id: str, *, operator: str | None, ctx: RunContext | None = None, limit: int | None = None
    ) -> R:
        """Run a failed run again from the superstep that failed, in a new segment (a ``retry`` claim).

        The calls of that superstep that finished replay; the ones that failed run again;
        calls in doubt follow the usual rules (an idempotent one reruns, another needs a
        decision). The claim names `operator`. `limit` 0 only stores the retry's claim: a
        worker's `advance` (cause ``retry``) spends it.

        Raises:
            FlowError: runs of this kind are not retried (the message says why).
            CheckpointConflict: the run did not fail (`RunHeld`: a live worker holds it).
            RecoveryNeedsDecision: a call of that superstep is in doubt and may not rerun.
        """
        refused = self.driver.refusal(run_id, "retry")
        if refused is not None:
            raise refused
        async with self.hold(run_id) as tenure:
            opened = await self.steps.open(run_id, ctx)
            if opened.status != RunStatus.FAILED:
                raise CheckpointConflict(f"run {run_id!r} is {opened.status}: only a failed run can be retried")
            records, counts = await self.steps.read(opened)
            opened.cur.cause = "retry"
            states = self.driver.seeds(opened.cur, records)
            seeds = without_failed(states)
            calls_in_doubt(run_id, seeds, self.steps.registry, granted(opened.body, opened.row.segment, seeds))
            cur = opened.cur
            cur.error = None
            await self.steps.claim(cur, "retry", counts, self.operator(operator))
            self.events.emit(
                "run.retried", run_id, kind=self.driver.kind.value, step=cur.step, **self.operator(operator)
            )
            return await self._drive(cur, seeds, limit=limit, recovering=True, tenure=tenure)

    async def migrate(
        self,
        run_id: str,
        *,
        to_version: str | None = None,
        state: Any = None,
        at: str | None = None,
        operator: str | None,
        ctx: RunContext | None = None,
        limit: int | None = None,
    ) -> R:
        """Move an unfinished run onto version `to_version` (None: the newest), with a ``migrate`` claim.

        `state` maps the old state's JSON form to the new one (None: as it is); the run goes
        on from node `at`, or from where it was. The driver made for the move
        (`RunDriver.migrating`) reads the run whatever definition it was saved on and builds the cursor
        on the new one (its state mapped and checked). The move is allowed only at a step
        boundary: when no call of the step the run would go on with finished or is in
        doubt (its effect would otherwise be lost with the old step). Pending approvals,
        denials and unspent decisions are dropped (the new definition asks again), and so
        are failed calls (they had no effect to keep). The claim opens a segment of its own
        and carries what moved where (`RunDriver.migration_record`) with `operator`. `limit`
        0 only stores the claim; a worker's `advance` (cause ``migrate``) goes on.

        Raises:
            CheckpointConflict: the run ended (`RunHeld`: a live worker holds it).
            FlowError: runs of this kind have no versions, the version is not at hand, calls
                were logged in the step it would go on with, or the move does not fit.
        """
        refused = self.driver.refusal(run_id, "migrate")
        if refused is not None:
            raise refused
        moving = self.driving(self.driver.migrating(to_version, state, at))
        return await moving._migrate(run_id, operator, ctx, limit)

    def driving(self, driver: RunDriver[C, R]) -> RunProtocol[C, R]:
        """This protocol (store, sealer, registry, hub, hold, tracer) over another driver of the same kind."""
        steps = self.steps
        return RunProtocol(
            driver, self.store, self.sealer, steps.registry, self.events, steps.max_bytes, self.ownership, steps.tracer
        )

    async def _migrate(self, run_id: str, operator: str | None, ctx: RunContext | None, limit: int | None) -> R:
        """`migrate`, once this protocol's driver is the one made for the move."""
        async with self.hold(run_id) as tenure:
            opened = await self.steps.open(run_id, ctx)
            self.driver.migration_record(opened.body)  # refuses a driver not made to migrate, before any read
            if opened.status not in (RunStatus.RUNNING, RunStatus.PAUSED):
                raise CheckpointConflict(f"run {run_id!r} is {opened.status}: only an unfinished run can be migrated")
            records, counts = await self.steps.read(opened)
            states = self.driver.seeds(opened.cur, records)
            acted = sorted(cid for cid, state in states.items() if state.kind == "done" or state.in_doubt)
            if acted:
                raise FlowError(
                    f"run {run_id!r} has {len(acted)} call(s) finished or in doubt in the step it would go on "
                    f"with ({', '.join(acted)}); moving it now would lose what they did. Finish that step where "
                    "the run's own version is deployed (recover, resume or decide it), then migrate"
                )
            record = self.driver.migration_record(opened.body)
            cur = opened.cur
            cur.cause, cur.pending, cur.decisions, cur.error = "migrate", [], {}, None
            who = self.operator(operator)
            await self.steps.claim(cur, "migrate", counts, {**who, "migrated": dict(record)})
            self.events.emit("run.migrated", run_id, kind=self.driver.kind.value, step=cur.step, **record, **who)
            return await self._drive(cur, {}, limit=limit, recovering=False, tenure=tenure)

    async def wake(
        self,
        run_id: str,
        *,
        limit: int | None,
        expected_step: int | None = None,
        ctx: RunContext | None = None,
        now: float | None = None,
    ) -> R:
        """Wake a paused run whose signed timer is due: a ``wake`` claim, then drive it (see `run.timers`).

        A plain timer lets the run go on; an approval's deadline settles the pending calls
        as the driver says (`RunDriver.woken`). The claim opens a segment, so of two wakes
        one wins and the run is woken once.

        Raises:
            Stale: the run is not at `expected_step` (a late or duplicate message).
            NotDue: the run waits on a timer that is not due yet (nothing is done).
            CheckpointConflict: the run is not waiting on a timer (`RunHeld`: a live worker holds it).
        """
        async with self.hold(run_id) as tenure:
            opened = await self.steps.open(run_id, ctx)
            cur, wake = opened.cur, opened.cur.wake
            if expected_step is not None and cur.step != expected_step:
                raise Stale(f"run {run_id!r} is at step {cur.step}, not {expected_step}: this wake is late")
            if opened.status != RunStatus.PAUSED or wake is None:
                raise CheckpointConflict(f"run {run_id!r} is {opened.status} and not waiting on a timer")
            clock = time.time() if now is None else now
            if due(wake) > clock:
                raise NotDue(run_id, due(wake))
            if wake["for"] == "child" and not await a_child_ended(*self.steps._stores(), wake):
                raise NotDue(run_id, clock)  # its children are still under way
            records, counts = await self.steps.read(opened, resuming=True)
            seeds = self.steps.seeds(opened, records, rerun_in_doubt=False)
            decided = self.driver.woken(cur, wake)
            cur.cause = "wake"
            record = {"at": due(wake), "for": wake["for"], **decided}
            control = {**self.operator(None), "woke": record, **self.steps.carried(opened, seeds)}
            await self.steps.claim(cur, "wake", counts, control)
            late = round(clock - due(wake), 3)
            self.events.emit("run.woken", run_id, kind=self.driver.kind.value, step=cur.step, late_s=late, **record)
            return await self._drive(cur, seeds, limit=limit, recovering=False, tenure=tenure)

    async def decide_in_doubt(
        self,
        run_id: str,
        *,
        operator: str | None,
        ctx: RunContext | None = None,
        calls: Mapping[str, InDoubtDecision] | None = None,
    ) -> int:
        """Store an operator's word on the run's calls in doubt (checked at their systems).

        The decision is a signed claim naming `operator`: the calls to rerun (``rerun``),
        and, in the same atomic write, a signed ``done`` or ``failed`` record for each call
        that `Happened` or `DidNotHappen` (`run.control.settle`). A worker spends it with
        `advance` (or a process with `recover`). Returns the claim's step.

        A paused run whose step holds calls in doubt (a call the step was to run again did not
        start before another call of the step paused for approval) is decided the same way:
        the claim keeps it paused, its approvals (and their deadline) still waiting, and the
        `resume` (or `wake`) that follows carries the ``rerun`` grant on until it is spent.

        Raises:
            CheckpointConflict: the run is neither running nor paused, or has no call in doubt.
            ValueError: `calls` does not decide exactly the calls in doubt, or a result
                does not fit its tool's return type.
        """
        async with self.hold(run_id):
            opened = await self.steps.open(run_id, ctx)
            status = RunStatus(opened.status)
            if status not in (RunStatus.RUNNING, RunStatus.PAUSED):
                raise CheckpointConflict(f"run {run_id!r} is {opened.status}: it has no call in doubt to decide")
            records, counts = await self.steps.read(opened, resuming=status is RunStatus.PAUSED)
            seeds = self.steps.seeds(opened, records, rerun_in_doubt=True)
            doubtful = [s for s in seeds.values() if s.in_doubt]
            if not doubtful:
                raise CheckpointConflict(f"run {run_id!r} has no call in doubt: there is nothing to decide")
            who = self.operator(operator)
            rerun, supplied = settle(run_id, doubtful, calls, self.steps.registry, who.get("operator"))
            await self.steps.claim(opened.cur, "decision", counts, {**who, "rerun": rerun}, supplied, status=status)
            assert opened.cur.step is not None
            return opened.cur.step

    async def fork(
        self,
        run_id: str,
        *,
        at_step: int,
        new_run_id: str | None = None,
        patch: Any = None,
        ctx: RunContext | None = None,
        operator: str | None = None,
        limit: int | None = None,
    ) -> R:
        """Start a new run from checkpoint `at_step` of `run_id` (any status); the old run is not touched.

        The new run's id is `new_run_id`, or a fresh one of the kind's (`RunDriver.fresh_run_id`).

        The checkpoint (with the history up to it) is read and checked like any other; the
        driver copies what it holds into the new run (`RunDriver.forked`: a flow's state,
        patched; a loop's messages), which goes on from there. Nothing of the old call log
        carries over: the new run's calls have its id in their identities and idempotency
        keys, so they all run. The source run and step (and `operator`) are signed into the
        new run's step 0 as ``forked_from``.

        Raises:
            CheckpointNotFound: the run has no checkpoint at that step (or retention trimmed it).
            CheckpointStoreCorrupt: that checkpoint, or the history up to it, fails its check.
            FlowError: the patch does not fit, or the run's definition changed since.
            CheckpointConflict: `new_run_id` is taken.
        """
        new_run_id = new_run_id if new_run_id is not None else self.driver.fresh_run_id()
        store, sealer = self.steps._stores()
        rows = list(await store.history(run_id))
        row = next((r for r in rows if r.step == at_step), None)
        if row is None:
            raise CheckpointNotFound(no_checkpoint_text(run_id, at_step, rows))  # says so if retention trimmed it
        row, body = await self.driver.read(store, sealer, run_id, row)
        source = self.driver.cursor(row, body, None)
        cur = self.driver.forked(source, new_run_id, identity_body(sealer, new_run_id, ctx), ctx, patch)
        lineage = {"run": run_id, "step": at_step, **self.operator(operator)}
        fields = self.driver.event_fields(cur)
        self.events.emit("run.forked", new_run_id, kind=self.driver.kind.value, **fields, source=run_id, step=at_step)
        return await self.begin(cur, limit, lineage)

    async def begin(self, cur: C, limit: int | None, lineage: Mapping[str, Any] | None = None) -> R:
        """Save a new run's step 0 and drive it up to `limit` steps, holding its lease throughout.

        A run id taken by the run this start would begin (a start retried after an error,
        `StoreNotDurable` among them) attaches to that run instead (`_attach`).

        Raises:
            CheckpointConflict: the run id is taken by another run, or by this one started with
                other input (`RunHeld`: someone holds it and stored some of it).
            ValueError: the run id is empty or reserved or not text (`check_new_run_id`).
        """
        check_new_run_id(cur.run_id)
        began = False
        try:
            async with self.hold(cur.run_id, unborn=True) as tenure:
                await self.steps.start(cur, lineage)
                began = True
                return await self._drive(cur, {}, limit=limit, recovering=False, tenure=tenure)
        except CheckpointConflict as taken:
            if began or self.store is None:
                raise
            return await self._attach(cur, limit, lineage, taken)

    async def _attach(self, cur: C, limit: int | None, lineage: Mapping[str, Any] | None, taken: Exception) -> R:
        """Attach a start to the run its id names, when that run's step 0 is the one this start would save.

        So a start retried (its first try failed, or its answer was lost) never begins a
        second run: with `limit` 0 it returns the run as it stands, else it carries the run on
        as `recover` does (up to `limit` steps), or returns it as it stands if it ended or
        paused. A store that can confirm durability (`DurabilityConfirming`) confirms the run
        first: a start is not answered before its step 0 would survive a failover.

        Raises:
            CheckpointConflict: the run is another flow's or kind's, was started with another
                input, identity or lineage, or keeps no step 0 to compare with (trimmed).
            StoreNotDurable: the run's step 0 is not acknowledged yet (retry again).
            RunHeld: `limit` is not 0 and a live worker carries the run on.
        """
        store, sealer = self.steps._stores()
        rows = await store.history(cur.run_id)
        if not rows or rows[0].step != 0:
            raise taken
        first = sealer.open_checkpoint(rows[0], cur.run_id)  # step 0 itself: a loop's read gives its latest
        try:
            self.driver.owns(cur.run_id, rows[0], first)
        except CheckpointConflict as other_kind:
            raise CheckpointConflict(f"{other_kind}: {_NEW_RUN_ID}") from taken
        if not self.steps.same_start(cur, first, lineage):
            raise CheckpointConflict(
                f"run {cur.run_id!r} exists, started with another input, identity or lineage (or flow version): a "
                f"start retried with the same run id attaches to its run only when all of these are the same; "
                f"{_NEW_RUN_ID}"
            ) from taken
        if isinstance(store, DurabilityConfirming):
            await store.confirm_durable(cur.run_id)
        if limit == 0:
            opened = await self.steps.open(cur.run_id, cur.ctx)
            return self.driver.result(opened.cur, RunStatus(opened.status))
        return await self._recover(cur.run_id, rerun_in_doubt=False, ctx=cur.ctx, operator=None, limit=limit)

    async def recover(
        self, run_id: str, *, rerun_in_doubt: bool, ctx: RunContext | None, operator: str | None = None
    ) -> R:
        """Continue a run whose worker died: check, claim, replay, go on (see `FlowRunner.recover`).

        With `rerun_in_doubt`, the claim records the decision (the calls it reruns and
        `operator`), signed.
        """
        async with self.hold(run_id) as tenure:
            opened = await self.steps.open(run_id, ctx)
            if opened.status == RunStatus.PAUSED:
                return self.driver.result(opened.cur, RunStatus.PAUSED)
            if opened.status != RunStatus.RUNNING:
                raise CheckpointConflict(f"run {run_id!r} already ended ({opened.status}); there is nothing to recover")
            return await self._recover_opened(opened, rerun_in_doubt, operator, None, tenure)

    async def _recover(
        self, run_id: str, *, rerun_in_doubt: bool, ctx: RunContext | None, operator: str | None, limit: int | None
    ) -> R:
        """`recover` up to `limit` steps, a run that is not running returned as it stands (what `_attach` does)."""
        async with self.hold(run_id) as tenure:
            opened = await self.steps.open(run_id, ctx)
            if opened.status != RunStatus.RUNNING:
                return self.driver.result(opened.cur, RunStatus(opened.status))
            return await self._recover_opened(opened, rerun_in_doubt, operator, limit, tenure)

    async def _recover_opened(
        self, opened: Opened[C], rerun_in_doubt: bool, operator: str | None, limit: int | None, tenure: Tenure | None
    ) -> R:
        """Claim the opened running run (recording a rerun decision) and drive it up to `limit` steps."""
        records, counts = await self.steps.read(opened)
        opened.cur.cause, opened.cur.cut_off = "recovery", cut_off_spans(opened.body, records)
        seeds = self.steps.seeds(opened, records, rerun_in_doubt)
        doubtful = [s.call_id for s in seeds.values() if s.in_doubt]
        control = {**self.operator(operator), "rerun": doubtful} if rerun_in_doubt and doubtful else None
        await self.steps.claim(opened.cur, "recovery", counts, control)
        return await self._drive(opened.cur, seeds, limit=limit, recovering=True, tenure=tenure)

    async def resume(
        self,
        run_id: str,
        *,
        approve: bool | Mapping[str, bool],
        note: str | None,
        ctx: RunContext | None,
        limit: int | None,
        operator: str | None = None,
    ) -> R:
        """Decide a paused run's pending calls, store the decision with a claim, then spend it.

        `limit` 0 only stores the decision (a worker spends it); the result is then ``running``.

        Raises:
            CheckpointConflict: the run is not paused, or another resume won.
            ValueError: `approve` names a call that is not pending, or leaves one undecided.
        """
        async with self.hold(run_id) as tenure:
            opened = await self.steps.open(run_id, ctx)
            if opened.status != RunStatus.PAUSED:
                hint = " (recover it instead)" if opened.status == RunStatus.RUNNING else ""
                raise CheckpointConflict(
                    f"run {run_id!r} is not paused ({opened.status}); only a paused run can be resumed{hint}"
                )
            cur = opened.cur
            cur.cause = "resume"
            chosen = decide(run_id, cur.pending, approve, note)
            records, counts = await self.steps.read(opened, resuming=True)
            seeds = self.steps.seeds(opened, records, rerun_in_doubt=False)
            cur.decisions, cur.pending = chosen, []
            await self.steps.claim(
                cur, "resume", counts, {**self.operator(operator), **self.steps.carried(opened, seeds)}
            )
            # A paused run did not crash: continuing it is not a recovery.
            return await self._drive(cur, seeds, limit=limit, recovering=False, tenure=tenure)

    async def advance(
        self,
        run_id: str,
        *,
        expected_step: int | None,
        rerun_in_doubt: bool,
        handoff: bool,
        park: bool = False,
        spend: str | None = None,
    ) -> R:
        """Run exactly one step of a running run, claiming it unless it was handed over cleanly.

        A clean handoff: the worker before saved its step and logged nothing since, so this
        one continues its segment, numbering from where the checkpoint left off. Where the
        store counts records per segment (the head, read with the lease's take), that shows without reading the log, but
        only after a checkpoint that ended a step; after a claim (a stored decision, a
        recovery) the claim's step had calls that finished before it, so the log is read to
        replay them.

        With `park`, a run that needs a decision about calls in doubt is parked first: a
        signed claim records what it waits for (``awaiting``), once, so sweeps leave it be.
        With `spend` (``resume`` or ``decision``), the caller was sent to spend a decision:
        the latest checkpoint must be a signed claim of that kind, else nothing happens.

        Raises:
            Stale: the latest step is not `expected_step` (a late or duplicate message).
            CheckpointConflict: the run is not running, or another worker claimed it first
                (`RunHeld`: another holder's lease is live).
            RecoveryNeedsDecision: a call is in doubt (as for `recover`).
            CheckpointStoreCorrupt: a row fails its check.
            ControlRefused: `spend` names a decision the latest checkpoint does not carry.
        """
        async with self.hold_reading_head(run_id) as (tenure, reading, seen):  # the head read with the lease's take
            head_row, counts = await reading
            opened = await self.steps.open(run_id, None, head_row)
            cur, body = opened.cur, opened.body
            if expected_step is not None and cur.step != expected_step:
                raise Stale(
                    f"run {run_id!r} is at step {cur.step}, not {expected_step}: this message is late or a duplicate"
                )
            if spend is not None and body.get("claim") != spend:
                found = f"a {body['claim']} claim" if "claim" in body else "not a claim"
                raise ControlRefused(
                    f"run {run_id!r}: a message asked to spend a signed {spend} claim at step {cur.step}, "
                    f"but the checkpoint there is {found} ({opened.status}); nothing was done"
                )
            if opened.status != RunStatus.RUNNING:
                raise CheckpointConflict(f"run {run_id!r} is {opened.status}; only a running run can be advanced")
            cur.cause = advance_cause(body, cur.step, handoff)
            next_seq: int | None = None
            if handoff and "claim" not in body and opened.row is head_row:
                try:
                    check_counts(run_id, opened.row.step, body, counts)
                except AheadOfCheckpoint as exc:
                    raise await self.steps._moved_on(opened, exc) from None
                next_seq = untouched(body, counts)
            seeds: dict[str, CallState] = {}
            if next_seq is None:
                records, counts = await self.steps.read(opened)
                # A recovery, unless a decision is spent, or nothing was logged since (then cleared below).
                cur.cut_off = None if cur.cause in SPENT else cut_off_spans(body, records)
                try:
                    seeds = self.steps.seeds(opened, records, rerun_in_doubt)
                except RecoveryNeedsDecision as exc:
                    if park and not parked(body):
                        await self.steps.claim(cur, "parked", counts, awaiting_record(exc.calls))
                        self.events.emit("run.parked", run_id, step=cur.step, tools=[tool for tool, _ in exc.calls])
                    raise
                # Nothing logged since the checkpoint: any seeds predate it (the finished calls of
                # a step paused for approval, or a decision's claim) and replay as a resume's do.
                next_seq = untouched(body, counts) if handoff else None
                if next_seq is None:  # something was logged after the checkpoint: its worker died in the step
                    if cur.cause not in SPENT:
                        cur.cause = "recovery"
                    await self.steps.claim(cur, "recovery", counts)
                    return await self._drive(cur, seeds, limit=1, recovering=True, tenure=tenure, seen=seen)
            mark = marker_of(body)
            assert mark is not None
            cur.cut_off = None  # handed over cleanly: nothing was cut off
            cur.journal = self.steps.journal(run_id, mark[0], next_seq)
            return await self._drive(cur, seeds, limit=1, recovering=False, tenure=tenure, seen=seen)


#: Claims that carry a decision a superstep spends: its span's cause names the decision.
SPENT = frozenset({"resume", "decision", "retry", "migrate", "wake"})


def advance_cause(body: Mapping[str, Any], step: int | None, handoff: bool) -> str:
    """Why a worker's `advance` runs a superstep (a span's ``cause``), as far as the checkpoint shows it.

    A signed decision being spent names it; a message that is not a clean handoff is a
    recovery; else the run's first superstep (``start``) or a ``handoff`` between workers.
    `advance` makes it a ``recovery`` when it finds the superstep cut off.
    """
    claim = body.get("claim")
    if claim in SPENT:
        return str(claim)
    if not handoff or claim == "recovery":
        return "recovery"
    return "start" if step == 0 else "handoff"
