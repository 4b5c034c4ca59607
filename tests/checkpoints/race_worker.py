"""One racer of the cross-process race tests: opens a store, then saves steps or takes leases on command.

Usage: ``python race_worker.py '<json>'`` where the JSON holds the store spec (``backend``
plus its arguments, see `open_store`), ``run_id``, ``flow`` and ``worker`` (this racer's
number). The racer connects, prints ``ready``, then for each line on stdin prints one JSON
line:

- ``go <step>``: tries to save that step of ``run_id``: ``{"step": s, "result": "won" |
  "conflict" | "error", "error": "..."}``.
- ``take <run id> <at>``: waits until the wall-clock time ``at`` (so every racer starts its
  take at the same instant), then takes the run's lease with a token of its own:
  ``{"result": "won" | "lost" | "error", "token": its token, "holder": the token the store
  says holds the lease}``.

An empty line or EOF ends it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
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


async def take(store: CheckpointStore, spec: dict[str, Any], run_id: str, at: float) -> dict[str, Any]:
    token = f"worker-{spec['worker']}-{uuid.uuid4().hex}"
    await asyncio.sleep(max(0.0, at - time.time()))
    try:
        lease = await store.take_lease(run_id, f"racer-{spec['worker']}", token, 30.0)
    except Exception as exc:
        return {"result": "error", "token": token, "error": f"{type(exc).__name__}: {exc}"}
    return {"result": "won" if lease.token == token else "lost", "token": token, "holder": lease.token}


async def main(spec: dict[str, Any]) -> None:
    store = open_store(spec)
    loop = asyncio.get_running_loop()
    try:
        await store.history(spec["run_id"])  # connect (and set up) before the race starts
        print("ready", flush=True)
        while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
            command, *args = line.split()
            if command == "take":
                print(json.dumps(await take(store, spec, args[0], float(args[1]))), flush=True)
            else:
                print(json.dumps(await attempt(store, spec, int(args[0]))), flush=True)
    finally:
        await store.aclose()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
