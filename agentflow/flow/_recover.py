"""`recover_all`: recover every unfinished run of a flow, for a worker on start-up.

Each run goes through the run protocol's `recover` (`agentflow.exec.run.protocol`), which
owns the checks, the claim and the replay; this module only finds the runs and reports
each one's outcome, so one bad run never stops the others. With ``sweep``, runs the
store's listing index forgot are found from their rows first (`agentflow.exec.run.sweep`).
A run whose lease is live is reported as `RunHeld` without being touched: its worker is
alive, so it is neither recovered nor an error to retry. A lease held by an earlier life of
the runner's own identity (`FlowRunner(identity=...)`: that process died and this is it,
restarted) is no live worker's: the run is recovered, taking the lease over at once, as
`recover` does (`agentflow.exec.run.lease.Ownership.restartable`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel

from agentflow._errors import CheckpointStoreCorrupt, RunHeld
from agentflow.exec.run.lease import held_by
from agentflow.exec.run.sweep import relist_forgotten
from agentflow.flow._result import RunResult
from agentflow.flow._versions import FlowLike

if TYPE_CHECKING:
    from agentflow.flow._runner import FlowRunner

S = TypeVar("S", bound=BaseModel)


async def recover_all(
    runner: FlowRunner, flow: FlowLike[S], *, rerun_in_doubt: bool, sweep: bool
) -> dict[str, RunResult[S] | BaseException]:
    """See `FlowRunner.recover_all`."""
    if runner.checkpoints is None or runner.sealer is None:
        raise ValueError("recover_all needs a FlowRunner with a checkpoint store")
    outcomes: dict[str, RunResult[S] | BaseException] = {}
    if sweep:
        for found in await relist_forgotten(runner.checkpoints, runner.sealer, [flow.name]):
            if found.flow != flow.name:
                continue
            runner.events.emit("run.unlisted", found.run_id, flow=found.flow, relisted=found.relisted, why=found.why)
            if not found.relisted and not found.why.startswith("ended"):
                outcomes[found.run_id] = CheckpointStoreCorrupt(
                    f"run {found.run_id!r} was missing from the store's listing index and was not listed again: "
                    f"{found.why}"
                )
    run_ids = [r for r in await runner.checkpoints.list_unfinished(flow.name) if r not in outcomes]
    for run_id, lease in (await held_by(runner.checkpoints, run_ids)).items():
        if not runner.ownership.earlier_life(lease.owner):  # an earlier life's lease is taken over by `recover`
            outcomes[run_id] = RunHeld(run_id, lease.owner, lease.expires_at)  # live: left alone, not retried
    limit = asyncio.Semaphore(max(1, runner.recover_concurrency))

    async def one(run_id: str) -> None:
        if run_id in outcomes:
            return
        async with limit:
            try:
                outcomes[run_id] = await runner.recover(flow, run_id, rerun_in_doubt=rerun_in_doubt)
            except Exception as exc:  # reported, not raised: one bad run must not stop the others
                outcomes[run_id] = exc

    await asyncio.gather(*(one(r) for r in run_ids))
    return {**{r: outcomes[r] for r in run_ids}, **{r: e for r, e in outcomes.items() if r not in run_ids}}
