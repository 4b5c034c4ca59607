"""A run waiting for its store's durability, as a worker leaves it: its ``store-wait`` marker (`run.store_waits`).

Imported as ``store_wait_kit`` by the CLI's and the viewer's tests (`viewer_kit.load_kit`).
"""

from __future__ import annotations

import time
from pathlib import Path

import runs_kit

from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.run.markers import Markers
from agentflow.exec.run.read import read_run
from agentflow.exec.run.store_waits import note_store_wait
from agentflow.exec.run.view import RunReport
from agentflow.exec.seal import Sealer

WHY = "run 'ship-1': the started record 1.0 is on the Redis primary, but only 0 of the 1 replicas asked for ..."


def wait_for_store(db: Path, run_id: str, retry_in_s: float | None, step_offset: int = 0) -> None:
    """Leave the run's store-wait marker at its latest step (plus `step_offset`), as a worker does."""

    async def note() -> None:
        async with SQLiteCheckpointStore(db) as store:
            step = (await store.latest(run_id)).step + step_offset
            retry_at = None if retry_in_s is None else time.time() + retry_in_s
            await note_store_wait(Markers(store, Sealer(runs_kit.KEY)), run_id, step, WHY, retry_at, 60)

    runs_kit.in_thread(note)


def read(db: Path, run_id: str) -> RunReport:
    async def job() -> RunReport:
        async with SQLiteCheckpointStore(db) as store:
            return await read_run(store, Sealer(runs_kit.KEY), run_id)

    return runs_kit.in_thread(job)
