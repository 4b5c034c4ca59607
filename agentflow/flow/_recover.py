"""Recovery and resume of flow runs: check, claim with a new segment, replay, go on.

Order of a recovery (nothing runs before the claim is saved):
1. load the latest checkpoint: signature, flow, graph digest; then the identity;
2. a paused run comes back as a paused result; an ended run is a conflict;
3. read and check the whole call log; fold the cut-off superstep's records;
4. calls in doubt: rerun if idempotent or allowed, else `RecoveryNeedsDecision`;
5. claim: save the next step with a new segment (one of two racing workers wins);
6. drive the run on, replaying finished calls of the cut-off superstep.

`resume` is the same with a paused run and decisions, which are saved with the claim
(so exactly one of two racing resumes wins) and spent only after that save.

`advance` (one superstep, for a distributed worker holding the run's lease) claims the
same way unless the run was handed over cleanly: the worker before saved the superstep
and nothing was logged after it. Then the new worker continues that segment, numbering
its records from where the checkpoint left off. No claim is needed because the numbering
fences on its own: every record is a compare-and-set on its position, so of two workers
writing one segment, the first write of either makes every later write of the other fail.
This saves a checkpoint write and a round trip on every distributed superstep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from agentflow._errors import CheckpointConflict, Stale
from agentflow._identity import RunContext, restore_identity
from agentflow._run_types import RunStatus
from agentflow.exec._durable import Decision
from agentflow.exec._durable_read import (
    CallState,
    LoggedRecord,
    analyze,
    calls_in_doubt,
    check_no_later_records,
    check_still_paused,
    clean_by_counts,
    read_head,
    read_log,
    untouched_since,
)
from agentflow.exec.checkpoints._records import SealedCheckpoint
from agentflow.flow._durable import Cursor
from agentflow.flow._graph import Flow
from agentflow.flow._result import RunResult

if TYPE_CHECKING:
    from agentflow.flow._runner import FlowRunner

S = TypeVar("S", bound=BaseModel)


async def _load(
    runner: FlowRunner, flow: Flow[Any], run_id: str, ctx: RunContext | None, row: SealedCheckpoint | None = None
) -> tuple[Cursor, dict[str, Any], str]:
    if runner.checkpoints is None or runner.sealer is None:
        raise ValueError("recover and resume need a FlowRunner with a checkpoint store")
    flow.validate(runner.executor.registry)
    row, body = await runner._ckpt.load(flow, run_id, row)
    restored = restore_identity(runner.sealer, run_id, body.get("identity") or {}, ctx)
    cur = runner._ckpt.cursor(flow, row, body, restored)
    return cur, body, row.status


async def _seeds(
    runner: FlowRunner,
    cur: Cursor,
    body: dict[str, Any],
    rerun_in_doubt: bool,
    *,
    resuming: bool = False,
) -> tuple[dict[str, CallState], list[LoggedRecord]]:
    assert runner.checkpoints is not None and runner.sealer is not None
    marker = body.get("log")
    expect = (int(marker[0]), int(marker[1])) if marker else None
    records = await read_log(runner.checkpoints, runner.sealer, cur.run_id, expect)
    if resuming:
        check_still_paused(cur.run_id, records, marker)
    check_no_later_records(cur.run_id, records, cur.superstep)
    states = analyze(records, cur.superstep)
    calls_in_doubt(cur.run_id, states, runner.executor.registry, rerun_in_doubt)
    return states, records


async def recover(
    runner: FlowRunner, flow: Flow[S], run_id: str, *, rerun_in_doubt: bool, ctx: RunContext | None
) -> RunResult[S]:
    """See `FlowRunner.recover`."""
    cur, body, status = await _load(runner, flow, run_id, ctx)
    if status == RunStatus.PAUSED:
        return RunResult(run_id, RunStatus.PAUSED, cur.state, cur.step, list(cur.pending))  # type: ignore[arg-type]
    if status != RunStatus.RUNNING:
        raise CheckpointConflict(f"run {run_id!r} already ended ({status}); there is nothing to recover")
    seeds, _ = await _seeds(runner, cur, body, rerun_in_doubt)
    assert cur.step is not None
    await runner._ckpt.save(cur, RunStatus.RUNNING, segment=cur.step + 1, claim="recovery")
    result: RunResult[S] = await runner.drive(cur, seeds, recovering=True)
    return result


async def recover_all(
    runner: FlowRunner, flow: Flow[S], *, rerun_in_doubt: bool
) -> dict[str, RunResult[S] | BaseException]:
    """See `FlowRunner.recover_all`."""
    if runner.checkpoints is None:
        raise ValueError("recover_all needs a FlowRunner with a checkpoint store")
    run_ids = list(await runner.checkpoints.list_unfinished(flow.name))
    limit = asyncio.Semaphore(max(1, runner.recover_concurrency))
    outcomes: dict[str, RunResult[S] | BaseException] = {}

    async def one(run_id: str) -> None:
        async with limit:
            try:
                outcomes[run_id] = await recover(runner, flow, run_id, rerun_in_doubt=rerun_in_doubt, ctx=None)
            except Exception as exc:  # reported, not raised: one bad run must not stop the others
                outcomes[run_id] = exc

    await asyncio.gather(*(one(r) for r in run_ids))
    return {r: outcomes[r] for r in run_ids}


def _decisions(cur: Cursor, approve: bool | Mapping[str, bool], note: str | None) -> dict[str, Decision]:
    if isinstance(approve, bool):
        return {p.call_id: Decision(approve, note) for p in cur.pending}
    unknown = set(approve) - {p.call_id for p in cur.pending}
    if unknown:
        raise ValueError(f"run {cur.run_id!r} has no pending call(s) {sorted(unknown)}")
    missing = [p.call_id for p in cur.pending if p.call_id not in approve]
    if missing:
        raise ValueError(f"run {cur.run_id!r}: decide every pending call; missing {missing}")
    return {cid: Decision(bool(ok), note) for cid, ok in approve.items()}


async def resume(
    runner: FlowRunner,
    flow: Flow[S],
    run_id: str,
    *,
    approve: bool | Mapping[str, bool],
    ctx: RunContext | None,
    note: str | None,
    limit: int | None = None,
) -> RunResult[S]:
    """See `FlowRunner.resume`."""
    cur, body, status = await _load(runner, flow, run_id, ctx)
    if status != RunStatus.PAUSED:
        raise CheckpointConflict(f"run {run_id!r} is not paused ({status}); only a paused run can be resumed")
    cur.decisions = _decisions(cur, approve, note)
    cur.pending = []
    seeds, _ = await _seeds(runner, cur, body, rerun_in_doubt=False, resuming=True)
    assert cur.step is not None
    # The decision is stored with the claim; it is spent only after this save succeeded.
    await runner._ckpt.save(cur, RunStatus.RUNNING, segment=cur.step + 1, claim="resume")
    # A paused run did not crash: continuing it is not a recovery.
    result: RunResult[S] = await runner.drive(cur, seeds, limit=limit, recovering=False)
    return result


async def advance(
    runner: FlowRunner,
    flow: Flow[S],
    run_id: str,
    *,
    expected_step: int | None,
    rerun_in_doubt: bool,
    handoff: bool,
    head: Awaitable[tuple[SealedCheckpoint, Mapping[int, int] | None]] | None,
) -> RunResult[S]:
    """See `FlowRunner.advance`."""
    assert runner.checkpoints is not None
    row, counts = await (head or read_head(runner.checkpoints, run_id))
    cur, body, status = await _load(runner, flow, run_id, None, row)
    if expected_step is not None and cur.step != expected_step:
        raise Stale(f"run {run_id!r} is at step {cur.step}, not {expected_step}: this message is late or a duplicate")
    if status != RunStatus.RUNNING:
        raise CheckpointConflict(f"run {run_id!r} is {status}; only a running run can be advanced")
    assert cur.step is not None
    # A clean handoff: the worker before saved the last superstep and logged nothing since,
    # so this one continues its segment without a claim of its own (see `untouched_since`).
    # Where the store counts records per segment, that shows without reading the log, but
    # only after a checkpoint that ended a superstep. A claim (a stored decision, a recovery)
    # is saved inside one: calls of that superstep finished before it, and their records
    # must be read to replay them (a paused superstep's other calls, after a resume).
    fresh = handoff and "claim" not in body
    next_seq = clean_by_counts(counts, body.get("log")) if fresh else None
    seeds: dict[str, CallState] = {}
    if next_seq is None:
        seeds, records = await _seeds(runner, cur, body, rerun_in_doubt)
        # Nothing logged since the checkpoint: any seeds predate it and are replayed as a
        # resume replays them, without a claim.
        next_seq = untouched_since(records, body.get("log")) if handoff else None
    if next_seq is not None:
        cur.journal = runner._ckpt.journal(run_id, int(body["log"][0]), next_seq)
    else:  # something was logged after the checkpoint: a worker died in the superstep
        await runner._ckpt.save(cur, RunStatus.RUNNING, segment=cur.step + 1, claim="recovery")
    result: RunResult[S] = await runner.drive(cur, seeds, limit=1, recovering=next_seq is None)
    return result
