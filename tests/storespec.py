"""Store specs that worker subprocesses of the crash kits understand: ``sqlite:PATH``,
``redis:URL#PREFIX`` and ``sql:URL#TABLE_PREFIX``."""

from __future__ import annotations

from typing import Any


def make_store(spec: str) -> Any:
    """Open the store a spec names."""
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
