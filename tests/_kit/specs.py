"""Store specs: how a worker subprocess opens the storage of a test's store set-up.

A spec is ``sqlite:PATH``, ``redis:URL#PREFIX`` or ``sql:URL#TABLE_PREFIX``
(`_kit.stores.StoreSetup.spec`). This module imports no pytest, so a worker process
(tests/crash/crashkit.py, tests/loop/loopkit.py) starts quickly.
"""

from __future__ import annotations

import os
from pathlib import Path

from agentflow.exec.checkpoints import CheckpointStore

#: The modules `open_spec` imports as it opens a store; a kit script's warm server imports them
#: ahead (``PRELOAD``, `_kit.forkserver`), so its children do not.
BACKENDS = (
    "agentflow.exec.checkpoints.sqlite",
    "redis.asyncio",
    "agentflow.exec.checkpoints.redis",
    "agentflow.exec.checkpoints.sqlalchemy",
)

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def child_env(*extra: Path) -> dict[str, str]:
    """The environment of a worker subprocess: this one, with tests/ (for ``_kit``) and the repo importable."""
    paths = [*map(str, extra), str(TESTS), str(REPO)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def open_spec(spec: str) -> CheckpointStore:
    """Open the store a spec names: ``sqlite:PATH``, ``redis:URL#PREFIX`` or ``sql:URL#TABLE_PREFIX``."""
    kind, _, rest = spec.partition(":")
    if kind == "sqlite":
        from agentflow.exec.checkpoints import SQLiteCheckpointStore

        return SQLiteCheckpointStore(rest)
    if kind == "redis":
        import redis.asyncio

        from agentflow.exec.checkpoints import RedisCheckpointStore

        url, _, prefix = rest.rpartition("#")
        return RedisCheckpointStore(lambda: redis.asyncio.Redis.from_url(url), prefix=prefix)
    if kind == "sql":
        from agentflow.exec.checkpoints import SQLAlchemyCheckpointStore

        url, _, prefix = rest.rpartition("#")
        return SQLAlchemyCheckpointStore(url, table_prefix=prefix)
    raise ValueError(f"unknown store spec {spec!r}")
