"""Checkpoint stores: the port, its four backends, and the store that forwards to one through hooks.

The four errors DESIGN.md imports from here are re-exported (their home is `agentflow.errors`).
The Redis and SQLAlchemy stores need extras; they are imported on first use and say which
extra to install when their driver is missing.
"""

import typing

from agentflow import _optional
from agentflow._errors import CheckpointConflict, CheckpointNotFound, CheckpointStoreCorrupt, RecoveryNeedsDecision
from agentflow.exec.checkpoints._defaults import StoreDefaults
from agentflow.exec.checkpoints.forwarding import ForwardingStore
from agentflow.exec.checkpoints.memory import MemoryCheckpointStore
from agentflow.exec.checkpoints.protocol import CheckpointStore, RetentionStore, TrimStore
from agentflow.exec.checkpoints.records import Pruned, SealedCall, SealedCheckpoint, Trimmed
from agentflow.exec.checkpoints.retention import RetentionPolicy, prune_finished, trim_finished
from agentflow.exec.checkpoints.sqlite import SQLiteCheckpointStore
from agentflow.exec.context import idempotency_key

if typing.TYPE_CHECKING:
    from agentflow.exec.checkpoints.redis import RedisCheckpointStore
    from agentflow.exec.checkpoints.sqlalchemy import SQLAlchemyCheckpointStore

__all__ = [
    "CheckpointConflict",
    "CheckpointNotFound",
    "CheckpointStore",
    "CheckpointStoreCorrupt",
    "ForwardingStore",
    "MemoryCheckpointStore",
    "Pruned",
    "RecoveryNeedsDecision",
    "RedisCheckpointStore",
    "RetentionPolicy",
    "RetentionStore",
    "SQLAlchemyCheckpointStore",
    "SQLiteCheckpointStore",
    "SealedCall",
    "SealedCheckpoint",
    "StoreDefaults",
    "TrimStore",
    "Trimmed",
    "idempotency_key",
    "prune_finished",
    "trim_finished",
]

_OPTIONAL = {
    "RedisCheckpointStore": ("agentflow.exec.checkpoints.redis", "redis"),
    "SQLAlchemyCheckpointStore": ("agentflow.exec.checkpoints.sqlalchemy", "sqlalchemy"),
}


__getattr__ = _optional.lazy_attributes(__name__, _OPTIONAL)
