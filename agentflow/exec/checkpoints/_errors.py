"""The checkpoint errors, re-exported where the seed places them."""

from agentflow._errors import (
    CheckpointConflict,
    CheckpointError,
    CheckpointNotFound,
    CheckpointStoreCorrupt,
    RecoveryNeedsDecision,
)

__all__ = [
    "CheckpointConflict",
    "CheckpointError",
    "CheckpointNotFound",
    "CheckpointStoreCorrupt",
    "RecoveryNeedsDecision",
]
