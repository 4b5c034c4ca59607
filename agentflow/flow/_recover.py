"""`recover_all`: recover every unfinished run of a flow, for a worker on start-up.

Each run goes through the run protocol's `recover` (`agentflow.exec._run_protocol`), which
owns the checks, the claim and the replay; this module only finds the runs and reports
each one's outcome, so one bad run never stops the others.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel

from agentflow.flow._graph import Flow
from agentflow.flow._result import RunResult

if TYPE_CHECKING:
    from agentflow.flow._runner import FlowRunner

S = TypeVar("S", bound=BaseModel)


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
                outcomes[run_id] = await runner.recover(flow, run_id, rerun_in_doubt=rerun_in_doubt)
            except Exception as exc:  # reported, not raised: one bad run must not stop the others
                outcomes[run_id] = exc

    await asyncio.gather(*(one(r) for r in run_ids))
    return {r: outcomes[r] for r in run_ids}
