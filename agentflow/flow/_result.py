"""What `FlowRunner` returns: `RunResult` (its status is `agentflow._run_types.RunStatus`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pydantic import BaseModel

from agentflow._run_types import RunStatus
from agentflow.exec._executor import ApprovalRequest

S = TypeVar("S", bound=BaseModel)


@dataclass
class RunResult(Generic[S]):
    """The outcome of `run`, `recover` or `resume`."""

    run_id: str
    """The run's id (pass it to `recover` or `resume`)."""
    status: RunStatus
    """``done``, ``paused`` (waiting for an approval) or ``failed``."""
    state: S
    """The flow's state at the run's latest checkpoint."""
    step: int | None = None
    """The latest checkpoint's step (None without a store)."""
    pending: list[ApprovalRequest] = field(default_factory=list)
    """The calls waiting for approval when the run is paused."""
    error: str | None = None
    """Why the run failed."""
    replayed: list[str] = field(default_factory=list)
    """Calls whose stored results were replayed (after a recovery or resume)."""
    rerun: list[str] = field(default_factory=list)
    """Calls in doubt that ran again."""
