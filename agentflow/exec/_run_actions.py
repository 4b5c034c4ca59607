"""The entry points that act on a run from outside its flow: an operator's, and a due timer's.

`RunActions` is the half of the run protocol (`_run_protocol`) that is not a run's own
progress: it holds the run's lease (`hold`), drives it on the look-out for a cancel
request (`_drive`), and has the entry points `cancel`, `retry`, `migrate`, `wake` and
`decide_in_doubt`. Each signs what it decides into a claim with its ``operator``; the
invariants are the protocol's (see `_run_protocol`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any

from agentflow._errors import CheckpointConflict, FlowError, RunHeld, Stale
from agentflow._identity import RunContext
from agentflow._run_types import RunStatus
from agentflow.exec._durable_read import CallState, calls_in_doubt
from agentflow.exec._run_cancel import CancelRequest, CancelRequested, CancelWatch, post, withdraw
from agentflow.exec._run_checks import pins_for
from agentflow.exec._run_control import InDoubtDecision, granted, settle, without_failed
from agentflow.exec._run_driver import C, R
from agentflow.exec._run_events import recording
from agentflow.exec._run_lease import Head, HeldHead, holding, holding_reading_head
from agentflow.exec._run_steps import RunSteps
from agentflow.exec._run_timers import NotDue, a_child_ended, due
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints._records import Lease


@contextlib.asynccontextmanager
async def _unowned(store: CheckpointStore, run_id: str) -> AsyncIterator[tuple[None, Awaitable[Head]]]:
    """No lease to hold (a runner without an ownership); the head is read when awaited."""
    head = store.head(run_id)
    try:
        yield None, head
    finally:
        head.close()  # a no-op once it ran


class RunActions(RunSteps[C, R]):
    """The held drive and the operator's and the timer's entry points (see the module docstring)."""

    def hold(self, run_id: str, *, unborn: bool = False) -> contextlib.AbstractAsyncContextManager[Lease | None]:
        """Hold the run's lease for a block (nothing is held without a store or an ownership).

        `unborn`: the block starts the run (`_run_lease.take_unborn`).

        Raises:
            RunHeld: another holder's lease is live.
        """
        self.tracer.taking_up()
        if self.store is None or self.ownership is None:
            held: contextlib.AbstractAsyncContextManager[Lease | None] = contextlib.nullcontext(None)
        else:
            held = holding(self.store, run_id, self.ownership, unborn=unborn)
        return recording(self.store, self.sealer, self.events, run_id, held)  # the run's event stream

    def hold_reading_head(self, run_id: str) -> contextlib.AbstractAsyncContextManager[HeldHead]:
        """`hold`, and the run's head read with the lease's take (`holding_reading_head`).

        Raises:
            RunHeld: another holder's lease is live.
            ValueError: the runner has no store.
        """
        self.tracer.taking_up()
        store, _ = self._stores()
        if self.ownership is None:
            held: contextlib.AbstractAsyncContextManager[HeldHead] = _unowned(store, run_id)
        else:
            held = holding_reading_head(store, run_id, self.ownership)
        return recording(self.store, self.sealer, self.events, run_id, held)  # the run's event stream

    def operator(self, name: str | None) -> dict[str, Any]:
        """The ``operator`` field of a control record: `name`, else this process's owner name."""
        if name is not None:
            return {"operator": name}
        return {"operator": self.ownership.owner} if self.ownership is not None else {}

    async def _drive(self, cur: C, seeds: Mapping[str, CallState], *, limit: int | None, recovering: bool) -> R:
        """Drive the held run, on the look-out for a cancel request (`_run_cancel`): it ends the run there."""
        if self.store is not None and self.sealer is not None:
            cur.watch = CancelWatch(self.store, self.sealer, cur.run_id, self.events, cur.started_at, steps=limit)
        try:
            return await self.driver.drive(self, cur, seeds, limit=limit, recovering=recovering)
        except CancelRequested as stop:
            if cur.journal is not None:
                await cur.journal.flush()  # a finished call's record goes in before the run ends
            request = stop.request
            who = {"operator": request.operator} if request.operator is not None else {}
            result = await self._end_cancelled(cur.run_id, request.reason, who)
            await withdraw(*self._stores(), cur.run_id)
            return result

    async def cancel(self, run_id: str, *, reason: str, operator: str | None) -> R:
        """Cancel a run: at once if no live worker holds it, else by a signed request to its holder.

        A run nobody holds (paused, stranded, between two supersteps) ends ``cancelled``
        here, with a signed claim naming `operator` and `reason`. A run a live worker holds
        gets a signed cancel request instead (`_run_cancel`): the holder starts no call
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
        who = self.operator(operator)
        try:
            return await self._cancel_now(run_id, reason, who)
        except RunHeld as held:
            store, sealer = self._stores()
            request = CancelRequest(run_id, reason, who.get("operator"), time.time())
            standing = await post(store, sealer, request)
            self.events.emit(
                "run.cancel_requested", run_id, holder=held.owner, reason=standing.reason, operator=standing.operator
            )
        try:  # the holder may have let go meanwhile, leaving nobody to see the request
            return await self._cancel_now(run_id, standing.reason, {"operator": standing.operator})
        except RunHeld:
            opened = await self.open(run_id, None, identity=False)
            return self.driver.result(opened.cur, RunStatus(opened.status))

    async def _cancel_now(self, run_id: str, reason: str, who: Mapping[str, Any]) -> R:
        async with self.hold(run_id):
            result = await self._end_cancelled(run_id, reason, who)
        if self.store is not None and self.sealer is not None:
            await withdraw(self.store, self.sealer, run_id)  # an earlier request is spent with it
        return result

    async def _end_cancelled(self, run_id: str, reason: str, who: Mapping[str, Any]) -> R:
        """Save the signed ``cancel`` claim of a held run: the one place a run becomes cancelled."""
        opened = await self.open(run_id, None, identity=False)
        if opened.status not in (RunStatus.RUNNING, RunStatus.PAUSED):
            raise CheckpointConflict(f"run {run_id!r} already ended ({opened.status}); there is nothing to cancel")
        _, counts = await self.read(opened)
        cur = opened.cur
        assert cur.step is not None
        cur.pins = pins_for(counts, cur.step + 1)
        cur.pending, cur.decisions = [], {}
        cur.error = f"cancelled by {who.get('operator') or 'an operator'}: {reason}"
        control = {**who, "reason": reason}
        await self.save(cur, RunStatus.CANCELLED, segment=cur.step + 1, claim="cancel", control=control)
        self.events.emit("run.cancelled", run_id, kind=self.driver.kind.value, step=cur.step, reason=reason, **who)
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
            CheckpointConflict: the run did not fail (`RunHeld`: a live worker holds it).
            RecoveryNeedsDecision: a call of that superstep is in doubt and may not rerun.
        """
        async with self.hold(run_id):
            opened = await self.open(run_id, ctx)
            if opened.status != RunStatus.FAILED:
                raise CheckpointConflict(f"run {run_id!r} is {opened.status}: only a failed run can be retried")
            records, counts = await self.read(opened)
            opened.cur.cause = "retry"
            states = self.driver.seeds(opened.cur, records)
            seeds = without_failed(states)
            calls_in_doubt(run_id, seeds, self.registry, granted(opened.body, opened.row.segment, seeds))
            cur = opened.cur
            cur.error = None
            await self.claim(cur, "retry", counts, self.operator(operator))
            self.events.emit(
                "run.retried", run_id, kind=self.driver.kind.value, step=cur.step, **self.operator(operator)
            )
            return await self._drive(cur, seeds, limit=limit, recovering=True)

    async def migrate(
        self,
        run_id: str,
        *,
        operator: str | None,
        ctx: RunContext | None = None,
        limit: int | None = None,
    ) -> R:
        """Move an unfinished run onto the definition its driver was made to migrate to, with a ``migrate`` claim.

        The driver reads the run whatever definition it was saved on and builds the cursor
        on the new one (its state mapped and checked). The move is allowed only at a step
        boundary: when no call of the step the run would go on with finished or is in
        doubt (its effect would otherwise be lost with the old step). Pending approvals,
        denials and unspent decisions are dropped (the new definition asks again), and so
        are failed calls (they had no effect to keep). The claim opens a segment of its own
        and carries what moved where (`RunDriver.migration_record`) with `operator`. `limit`
        0 only stores the claim; a worker's `advance` (cause ``migrate``) goes on.

        Raises:
            CheckpointConflict: the run ended (`RunHeld`: a live worker holds it).
            FlowError: calls were logged in the step it would go on with, or the move does not fit.
        """
        async with self.hold(run_id):
            opened = await self.open(run_id, ctx)
            self.driver.migration_record(opened.body)  # refuses a driver not made to migrate, before any read
            if opened.status not in (RunStatus.RUNNING, RunStatus.PAUSED):
                raise CheckpointConflict(f"run {run_id!r} is {opened.status}: only an unfinished run can be migrated")
            records, counts = await self.read(opened)
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
            await self.claim(cur, "migrate", counts, {**who, "migrated": dict(record)})
            self.events.emit("run.migrated", run_id, kind=self.driver.kind.value, step=cur.step, **record, **who)
            return await self._drive(cur, {}, limit=limit, recovering=False)

    async def wake(
        self,
        run_id: str,
        *,
        limit: int | None,
        expected_step: int | None = None,
        ctx: RunContext | None = None,
        now: float | None = None,
    ) -> R:
        """Wake a paused run whose signed timer is due: a ``wake`` claim, then drive it (see `_run_timers`).

        A plain timer lets the run go on; an approval's deadline settles the pending calls
        as the driver says (`RunDriver.woken`). The claim opens a segment, so of two wakes
        one wins and the run is woken once.

        Raises:
            Stale: the run is not at `expected_step` (a late or duplicate message).
            NotDue: the run waits on a timer that is not due yet (nothing is done).
            CheckpointConflict: the run is not waiting on a timer (`RunHeld`: a live worker holds it).
        """
        async with self.hold(run_id):
            opened = await self.open(run_id, ctx)
            cur, wake = opened.cur, opened.cur.wake
            if expected_step is not None and cur.step != expected_step:
                raise Stale(f"run {run_id!r} is at step {cur.step}, not {expected_step}: this wake is late")
            if opened.status != RunStatus.PAUSED or wake is None:
                raise CheckpointConflict(f"run {run_id!r} is {opened.status} and not waiting on a timer")
            clock = time.time() if now is None else now
            if due(wake) > clock:
                raise NotDue(run_id, due(wake))
            if wake["for"] == "child" and not await a_child_ended(*self._stores(), wake):
                raise NotDue(run_id, clock)  # its children are still under way
            records, counts = await self.read(opened, resuming=True)
            seeds = self.seeds(opened, records, rerun_in_doubt=False)
            decided = self.driver.woken(cur, wake)
            cur.cause = "wake"
            record = {"at": due(wake), "for": wake["for"], **decided}
            await self.claim(cur, "wake", counts, {**self.operator(None), "woke": record})
            late = round(clock - due(wake), 3)
            self.events.emit("run.woken", run_id, kind=self.driver.kind.value, step=cur.step, late_s=late, **record)
            return await self._drive(cur, seeds, limit=limit, recovering=False)

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
        that `Happened` or `DidNotHappen` (`_run_control.settle`). A worker spends it with
        `advance` (or a process with `recover`). Returns the claim's step.

        Raises:
            CheckpointConflict: the run is not running, or has no call in doubt.
            ValueError: `calls` does not decide exactly the calls in doubt, or a result
                does not fit its tool's return type.
        """
        async with self.hold(run_id):
            opened = await self.open(run_id, ctx)
            if opened.status != RunStatus.RUNNING:
                raise CheckpointConflict(f"run {run_id!r} is {opened.status}: it has no call in doubt to decide")
            records, counts = await self.read(opened)
            seeds = self.seeds(opened, records, rerun_in_doubt=True)
            doubtful = [s for s in seeds.values() if s.in_doubt]
            if not doubtful:
                raise CheckpointConflict(f"run {run_id!r} has no call in doubt: there is nothing to decide")
            who = self.operator(operator)
            rerun, supplied = settle(run_id, doubtful, calls, self.registry, who.get("operator"))
            await self.claim(opened.cur, "decision", counts, {**who, "rerun": rerun}, supplied)
            assert opened.cur.step is not None
            return opened.cur.step
