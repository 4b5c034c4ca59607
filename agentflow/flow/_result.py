"""What `FlowRunner` returns: `RunResult` (its status is `agentflow._run_types.RunStatus`)."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel

from agentflow._run_types import DEFAULT_VERSION
from agentflow.exec.run.cursor import RunOutcome

S = TypeVar("S", bound=BaseModel)


@dataclass
class RunResult(RunOutcome, Generic[S]):
    """The outcome of `run`, `recover` or `resume`: the fields of every run, and the flow's state."""

    state: S
    """The flow's state at the run's latest checkpoint."""
    _: KW_ONLY
    version: str = DEFAULT_VERSION
    """The version of the flow the run is on."""
    parent: str | None = None
    """The parent run that started this one as a child (None: it has no parent)."""
