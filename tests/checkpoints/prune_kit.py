"""Finished runs to prune, by the hundred: one real run of the ticket flow, cloned under new ids.

`template()` runs the seed's ticket flow once on a memory store (4 checkpoints, 6 call
records, signed with `KEY`). `seed(store, run_ids, at)` writes a clone of it for each id,
its rows sealed again for that id (a body names no run id), saved as the runner saves them
(step 0, then each superstep's two records with its checkpoint), with the last save at
`at` and the last status `status`: so every clone reads back through `read_run` as a
healthy run. `whole_or_gone` says which a run is, and fails on anything in between;
`whole_or_trimmed` the same of a trim (its newest checkpoint and every call record left).

`retry_claim` saves what a retry of a failed run saves first (its claim), `retry_in_doubt`
that and a call it logged as started before it died (the call in doubt), and
`between_judgement_and_store` runs an attack once, after `prune_finished` (or
`trim_finished`) has judged a batch by its signed rows and before the store prunes (or
trims) it: the window the judged rows passed to the store close.

Also a worker process (run with `_kit.specs.child_env`, so ``_kit`` imports):
``python prune_kit.py SPEC BEFORE BATCH [trim]`` opens the store of a spec
(`_kit.specs.open_spec`), prints ``ready``, then prunes (or trims) every run ended before
BEFORE in batches of BATCH, printing ``batch <runs>`` after each, and ``done`` at the end.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from _kit.specs import open_spec
from _kit.tickets import KEY, ORDER, TICKETS, make_tickets

from agentflow import Executor, FlowRunner
from agentflow._errors import CheckpointNotFound
from agentflow.exec.checkpoints import CheckpointStore, MemoryCheckpointStore, SealedCall, SealedCheckpoint
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer

if TYPE_CHECKING:
    import pytest

SEALER = Sealer(KEY)
#: What prune and trim judge each run by: its newest checkpoint, checked with the kit's key.
CHECK = SEALER.checkpoint_problem
#: Checkpoints and call records of one clone.
ROWS_PER_RUN = 4 + 6

Template = tuple[list[SealedCheckpoint], list[SealedCall]]


async def template() -> Template:
    """The rows of one finished run of the ticket flow."""
    store = MemoryCheckpointStore()
    runner = FlowRunner(Executor(make_tickets().registry), checkpoints=store, checkpoint_key=KEY)
    result = await runner.run(TICKETS, ORDER)
    assert result.status == "done"
    return list(await store.history(result.run_id)), list(await store.calls(result.run_id))


async def write_clone(store: CheckpointStore, rows: Template, run_id: str, at: float, status: str = "done") -> None:
    """Write the template's rows as run `run_id`, its last save at `at` with status `status`."""
    checkpoints, calls = rows
    shift = at - checkpoints[-1].saved_at
    for cp in checkpoints:
        last = cp.step == checkpoints[-1].step
        row = SEALER.seal_encoded_checkpoint(
            run_id, cp.step, cp.flow, status if last else cp.status, cp.segment, cp.saved_at + shift, cp.payload
        )
        records = [
            SEALER.seal_encoded_call(run_id, c.segment, c.seq, c.kind, c.payload)
            for c in (calls[2 * cp.step - 2 : 2 * cp.step] if cp.step else [])
        ]
        await store.save_after_calls(run_id, cp.step, row, records)


async def seed(
    store: CheckpointStore, rows: Template, run_ids: Sequence[str], at: float, status: str = "done", width: int = 16
) -> None:
    """Write a clone for each id, `width` at a time."""
    for start in range(0, len(run_ids), width):
        await asyncio.gather(*(write_clone(store, rows, r, at, status) for r in run_ids[start : start + width]))


async def whole_or_gone(store: CheckpointStore, run_id: str) -> str:
    """``whole`` (every check of `read_run` passes) or ``gone`` (nothing of it is stored); else fail."""
    try:
        report = await read_run(store, SEALER, run_id)
    except CheckpointNotFound:
        assert not await store.calls(run_id), f"run {run_id} has no checkpoint but call records"
        return "gone"
    assert not report.problems, f"run {run_id} is neither whole nor gone: {report.problems}"
    assert report.status == "done" and len(report.checkpoints) == 4, f"run {run_id} is not the clone written"
    return "whole"


async def whole_or_trimmed(store: CheckpointStore, run_id: str) -> str:
    """``whole`` (the clone as written) or ``trimmed`` (its newest checkpoint and all 6 records, healthy); else fail."""
    report = await read_run(store, SEALER, run_id)
    assert not report.problems, f"run {run_id} is neither whole nor trimmed: {report.problems}"
    assert report.status == "done" and report.records == 6, f"run {run_id} is not the clone written"
    steps = [c.step for c in report.checkpoints]
    if steps == [0, 1, 2, 3] and report.kept_from == 0:
        return "whole"
    assert steps == [3] and report.kept_from == 3, f"run {run_id} holds steps {steps}, kept from {report.kept_from}"
    return "trimmed"


async def retry_claim(store: CheckpointStore, run_id: str) -> SealedCheckpoint:
    """Save a retry's claim of the failed run: the next step, running, opening a segment of its own, saved now."""
    last = await store.latest(run_id)
    step = last.step + 1
    claim = SEALER.seal_encoded_checkpoint(run_id, step, last.flow, "running", step, time.time(), last.payload)
    await store.save(run_id, step, claim)
    return claim


async def retry_in_doubt(store: CheckpointStore, run_id: str) -> SealedCall:
    """A retry of the failed run that claimed it and logged a call as started, then died: the call is in doubt."""
    claim = await retry_claim(store, run_id)
    started = SEALER.seal_call(run_id, claim.segment, 0, "started", {"tool": "charge_card", "span": "s-retry"})
    await store.record_call(run_id, started)
    return started


def between_judgement_and_store(
    monkeypatch: pytest.MonkeyPatch, name: str, attack: Callable[[], Awaitable[None]]
) -> list[bool]:
    """Run `attack` once, just before `retention`'s `name` (``prune`` or ``trim``) hands its first batch to the store.

    `prune_finished` and `trim_finished` call it right after judging the batch by its signed
    newest rows. Returns a list that holds True once the attack ran.
    """
    from agentflow.exec.checkpoints import retention

    real = getattr(retention, name)
    fired: list[bool] = []

    async def hooked(*args: Any, **kwargs: Any) -> Any:
        if not fired:
            fired.append(True)
            await attack()
        return await real(*args, **kwargs)

    monkeypatch.setattr(retention, name, hooked)
    return fired


async def _work(spec: str, before: float, batch: int, mode: str) -> None:
    from agentflow.exec.checkpoints import RetentionPolicy, prune_finished, trim_finished

    store = open_spec(spec)
    try:
        await store.stored_runs()  # connected (and set up) before the parent starts watching
        print("ready", flush=True)
        if mode == "trim":
            policy = RetentionPolicy(None, batch=batch, trim_after_s=0.0)
            await trim_finished(
                store,
                policy,
                now=before,
                on_batch=lambda t: print(f"batch {len(t.run_ids)}", flush=True),
                check=CHECK,
            )
        else:
            policy = RetentionPolicy(0.0, batch=batch)
            await prune_finished(
                store,
                policy,
                now=before,
                on_batch=lambda p: print(f"batch {len(p.run_ids)}", flush=True),
                check=CHECK,
            )
        print("done", flush=True)
    finally:
        await store.aclose()


if __name__ == "__main__":
    asyncio.run(_work(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "prune"))
