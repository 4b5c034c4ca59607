"""The run protocol: the one sequence every durable run follows, for flows and tool loops alike.

Moving parts:
- `RunSteps` (`_run_steps`): the parts (start, open, read, seeds, claim, save) over one
  store, sealer and `RunDriver` (what a flow or a loop plugs in).
- `RunProtocol` puts them in order, once for every kind of run, each entry point under the
  run's lease (`_run_lease`): `begin` (a new run), `recover`, `resume`, `advance` (one
  step, for distributed workers), `decide_in_doubt` (an operator's decision on calls in
  doubt), `retry`, `cancel`, `migrate` (onto another definition: the driver builds the
  moved cursor), `wake` (a paused run whose signed timer is due: `_run_timers`).
  `decide` (in `_durable`) is the one rule turning ``approve`` into decisions. The run's
  own progress (`begin`, `recover`, `resume`, `advance`) is here; the held drive and the
  entry points from outside (an operator's, a due timer's) are in `_run_actions`, its base.
- Every drive runs on the look-out for a cancel request (`_run_cancel.CancelWatch`); one
  ends the run through `_end_cancelled`, the one place a run becomes ``cancelled``.
- Control records (`_run_control`): every decision that steers a run is a claim
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

from collections.abc import Mapping
from typing import Any

from agentflow._errors import CheckpointConflict, ControlRefused, RecoveryNeedsDecision, Stale
from agentflow._identity import RunContext
from agentflow._run_types import RunStatus
from agentflow.exec._durable import decide
from agentflow.exec._durable_read import CallState
from agentflow.exec._run_actions import RunActions
from agentflow.exec._run_checks import AheadOfCheckpoint, check_counts, cut_off_spans, marker_of, untouched
from agentflow.exec._run_control import awaiting_record, parked
from agentflow.exec._run_driver import C, R
from agentflow.exec._run_lease import Head
from agentflow.exec._run_steps import BODY_VERSION, CLAIM_CAUSES, MAX_CHECKPOINT_BYTES, Opened
from agentflow.exec.checkpoints._rules import check_new_run_id

__all__ = ["BODY_VERSION", "CLAIM_CAUSES", "MAX_CHECKPOINT_BYTES", "Head", "Opened", "RunProtocol"]


class RunProtocol(RunActions[C, R]):
    """The durable sequence of one kind of run over one store (see the module docstring)."""

    async def begin(self, cur: C, limit: int | None, lineage: Mapping[str, Any] | None = None) -> R:
        """Save a new run's step 0 and drive it up to `limit` steps, holding its lease throughout.

        Raises:
            CheckpointConflict: the run id is taken (`RunHeld`: someone holds it and stored some of it).
            ValueError: the run id is empty or reserved (`check_new_run_id`).
        """
        check_new_run_id(cur.run_id)
        async with self.hold(cur.run_id, unborn=True):
            await self.start(cur, lineage)
            return await self._drive(cur, {}, limit=limit, recovering=False)

    async def recover(
        self, run_id: str, *, rerun_in_doubt: bool, ctx: RunContext | None, operator: str | None = None
    ) -> R:
        """Continue a run whose worker died: check, claim, replay, go on (see `FlowRunner.recover`).

        With `rerun_in_doubt`, the claim records the decision (the calls it reruns and
        `operator`), signed.
        """
        async with self.hold(run_id):
            opened = await self.open(run_id, ctx)
            if opened.status == RunStatus.PAUSED:
                return self.driver.result(opened.cur, RunStatus.PAUSED)
            if opened.status != RunStatus.RUNNING:
                raise CheckpointConflict(f"run {run_id!r} already ended ({opened.status}); there is nothing to recover")
            records, counts = await self.read(opened)
            opened.cur.cause, opened.cur.cut_off = "recovery", cut_off_spans(opened.body, records)
            seeds = self.seeds(opened, records, rerun_in_doubt)
            doubtful = [s.call_id for s in seeds.values() if s.in_doubt]
            control = {**self.operator(operator), "rerun": doubtful} if rerun_in_doubt and doubtful else None
            await self.claim(opened.cur, "recovery", counts, control)
            return await self._drive(opened.cur, seeds, limit=None, recovering=True)

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
        async with self.hold(run_id):
            opened = await self.open(run_id, ctx)
            if opened.status != RunStatus.PAUSED:
                hint = " (recover it instead)" if opened.status == RunStatus.RUNNING else ""
                raise CheckpointConflict(
                    f"run {run_id!r} is not paused ({opened.status}); only a paused run can be resumed{hint}"
                )
            cur = opened.cur
            cur.cause = "resume"
            chosen = decide(run_id, cur.pending, approve, note)
            records, counts = await self.read(opened, resuming=True)
            seeds = self.seeds(opened, records, rerun_in_doubt=False)
            cur.decisions, cur.pending = chosen, []
            await self.claim(cur, "resume", counts, self.operator(operator))
            # A paused run did not crash: continuing it is not a recovery.
            return await self._drive(cur, seeds, limit=limit, recovering=False)

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
        async with self.hold_reading_head(run_id) as (_, reading):  # the head read with the lease's take
            head_row, counts = await reading
            opened = await self.open(run_id, None, head_row)
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
                    raise await self._moved_on(opened, exc) from None
                next_seq = untouched(body, counts)
            seeds: dict[str, CallState] = {}
            if next_seq is None:
                records, counts = await self.read(opened)
                # A recovery, unless a decision is spent, or nothing was logged since (then cleared below).
                cur.cut_off = None if cur.cause in SPENT else cut_off_spans(body, records)
                try:
                    seeds = self.seeds(opened, records, rerun_in_doubt)
                except RecoveryNeedsDecision as exc:
                    if park and not parked(body):
                        await self.claim(cur, "parked", counts, awaiting_record(exc.calls))
                        self.events.emit("run.parked", run_id, step=cur.step, tools=[tool for tool, _ in exc.calls])
                    raise
                # Nothing logged since the checkpoint: any seeds predate it (the finished calls of
                # a step paused for approval, or a decision's claim) and replay as a resume's do.
                next_seq = untouched(body, counts) if handoff else None
                if next_seq is None:  # something was logged after the checkpoint: its worker died in the step
                    if cur.cause not in SPENT:
                        cur.cause = "recovery"
                    await self.claim(cur, "recovery", counts)
                    return await self._drive(cur, seeds, limit=1, recovering=True)
            mark = marker_of(body)
            assert mark is not None
            cur.cut_off = None  # handed over cleanly: nothing was cut off
            cur.journal = self.journal(run_id, mark[0], next_seq)
            return await self._drive(cur, seeds, limit=1, recovering=False)


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
