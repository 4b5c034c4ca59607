"""Every error agentflow raises, in one place: ``from agentflow.errors import RunHeld``.

The tree (`AgentflowError` at its root) and what each error carries are in `agentflow._errors`.
This module is each error's one public home: no other package exports an error, but for the
four DESIGN.md imports from `agentflow.exec.checkpoints` and `FlowError` from `agentflow.flow`.
"""

from agentflow._errors import (
    AgentflowError,
    ApprovalDenied,
    CheckpointConflict,
    CheckpointError,
    CheckpointNotFound,
    CheckpointStoreCorrupt,
    CheckpointTooLarge,
    ControlRefused,
    FlowError,
    IdentityMismatch,
    LeaseLost,
    LimitsUnavailable,
    ModelError,
    RateLimited,
    RecoveryNeedsDecision,
    RunFailed,
    RunHeld,
    Stale,
    StoreNotDurable,
    StoreRefused,
    ToolArgumentsInvalid,
    ToolError,
    ToolTimeout,
    UnknownTool,
    UnstorableValue,
    VersionNotDeployed,
)

__all__ = [
    "AgentflowError",
    "ApprovalDenied",
    "CheckpointConflict",
    "CheckpointError",
    "CheckpointNotFound",
    "CheckpointStoreCorrupt",
    "CheckpointTooLarge",
    "ControlRefused",
    "FlowError",
    "IdentityMismatch",
    "LeaseLost",
    "LimitsUnavailable",
    "ModelError",
    "RateLimited",
    "RecoveryNeedsDecision",
    "RunFailed",
    "RunHeld",
    "Stale",
    "StoreNotDurable",
    "StoreRefused",
    "ToolArgumentsInvalid",
    "ToolError",
    "ToolTimeout",
    "UnknownTool",
    "UnstorableValue",
    "VersionNotDeployed",
]
