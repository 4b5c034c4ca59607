"""Every error agentflow raises, in one place: ``from agentflow.errors import RunHeld``.

The tree (`AgentflowError` at its root) and what each error carries are in `agentflow._errors`;
`LimitsUnavailable` and `RateLimited` are the limits' own (`agentflow.exec.limits`). Until the
next release each of these is still importable from ``agentflow`` itself, with a
`DeprecationWarning` that names its new home.
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
    ModelError,
    RecoveryNeedsDecision,
    RunFailed,
    RunHeld,
    RunNotDone,
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
from agentflow.exec.limits import LimitsUnavailable, RateLimited

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
    "RunNotDone",
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
