"""One racer of the cross-process race test: opens a store, then saves steps on command.

Usage: ``python race_worker.py '<json>'`` where the JSON holds the store spec (``backend``
plus its arguments, see `open_store`), ``run_id``, ``flow`` and ``worker`` (this racer's
number). The racer connects, prints ``ready``, then for each line ``go <step>`` on stdin
tries to save that step and prints one JSON line: ``{"step": s, "result": "won" | "conflict"
| "error", "error": "..."}``. An empty line or EOF ends it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from agentflow._errors import CheckpointConflict
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.conformance import SEALER


def open_store(spec: dict[str, Any]) -> CheckpointStore:
    backend = spec["backend"]
    if backend == "sqlite":
        from agentflow.exec.checkpoints.sqlite import SQLiteCheckpointStore

        return SQLiteCheckpointStore(Path(spec["path"]))
    if backend == "redis":
        import redis.asyncio

        from agentflow.exec.checkpoints.redis import RedisCheckpointStore

        url = spec["url"]
        return RedisCheckpointStore(lambda: redis.asyncio.Redis.from_url(url), prefix=spec["prefix"])
    if backend == "sqlalchemy":
        from agentflow.exec.checkpoints.sqlalchemy import SQLAlchemyCheckpointStore

        if "table_prefix" in spec:
            return SQLAlchemyCheckpointStore(spec["url"], table_prefix=spec["table_prefix"])
        return SQLAlchemyCheckpointStore(spec["url"])
    raise ValueError(f"unknown backend {backend!r}")


async def attempt(store: CheckpointStore, spec: dict[str, Any], step: int) -> dict[str, Any]:
    run_id = spec["run_id"]
    row = SEALER.seal_checkpoint(
        run_id, step, spec["flow"], "running", step, time.time(), {"worker": spec["worker"], "step": step}
    )
    try:
        await store.save(run_id, step, row)
    except CheckpointConflict:
        return {"step": step, "result": "conflict"}
    except Exception as exc:
        return {"step": step, "result": "error", "error": f"{type(exc).__name__}: {exc}"}
    return {"step": step, "result": "won"}


async def main(spec: dict[str, Any]) -> None:
    store = open_store(spec)
    loop = asyncio.get_running_loop()
    try:
        await store.latest(spec["run_id"])  # connect (and set up) before the race starts
        print("ready", flush=True)
        while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
            _, step = line.split()
            print(json.dumps(await attempt(store, spec, int(step))), flush=True)
    finally:
        await store.aclose()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
