"""The SQLite file store (standard library only): the store in `store`, its parts beside it."""

from agentflow.exec.checkpoints.sqlite.store import MIGRATIONS, SQLiteCheckpointStore

__all__ = ["MIGRATIONS", "SQLiteCheckpointStore"]
